"""Who asks, from where, and what the edge holds, as FastAPI dependencies (one each).

A route names what it needs by type: `Ctl` (the controller), `Ident` (the token's
identity, set by `Guard` before the route runs), `Address` (the client's address), `Asker`
(both, as the controller's `Actor`: it holds the ownership rule), `OwnedJob` (a job looked
up and checked against that rule), `Edge` (the edge's own state: refused logins, the
throttle, the state dir).  The plain functions serve the routes that FastAPI does not
solve (the lean submit route, the agents' WebSocket); `submitter` is who a submit acts
for, checked.

The ownership check is a callable the route calls, not a dependency that looks the job up
itself: FastAPI runs dependencies before it checks a request's body, and a malformed body
is answered 422 before anything is looked up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from mgpu.master.control.cluster import Cluster, NotFound
from mgpu.master.control.jobctl import Actor, NotAllowed
from mgpu.master.ha.leadership import Leadership
from mgpu.master.http.connections import ClientSockets
from mgpu.master.http.guard import FailedLogins, client_address
from mgpu.master.security.auth import BadTokenThrottle, Identity
from mgpu.model import Job

__all__ = [
    "Address",
    "Asker",
    "Ctl",
    "Edge",
    "EdgeState",
    "Ident",
    "JobAccess",
    "OwnedJob",
    "Submitter",
    "asker",
    "client_address",
    "cluster",
    "edge",
    "identity",
    "leadership",
    "submitter",
]


@dataclass
class EdgeState:
    """What the HTTP edge keeps besides the controller (`app.state.edge`)."""

    state_dir: Path
    throttle: BadTokenThrottle
    failures: FailedLogins
    """Refused logins, counted per address (guard.py)."""
    refused_hellos: FailedLogins
    hellos_awaited: int = 0
    """Agent connections waiting for their hello now (agents.py)."""
    sockets: ClientSockets = field(default_factory=ClientSockets)
    """Clients' WebSockets open now (attach.py)."""

    def flush(self) -> None:
        """The refused logins and hellos counted so far, written now."""
        self.failures.flush()
        self.refused_hellos.flush()


def cluster(conn: HTTPConnection) -> Cluster:
    found: Cluster = conn.app.state.cluster
    return found


def edge(conn: HTTPConnection) -> EdgeState:
    found: EdgeState = conn.app.state.edge
    return found


def identity(conn: HTTPConnection) -> Identity:
    ident: Identity = conn.state.identity
    return ident


def asker(conn: HTTPConnection) -> Actor:
    ident = identity(conn)
    return Actor(ident.user, ident.admin, client_address(conn))


@dataclass(frozen=True)
class JobAccess:
    """`access(job_id, verb)`: the job, if the asker may `verb` it (else NotFound or
    NotAllowed, answered 404 or 403 by errors.py)."""

    cl: Cluster
    actor: Actor

    def __call__(self, job_id: str, verb: str) -> Job:
        job = self.cl.get_job(job_id)
        if job is None:
            raise NotFound(job_id)
        return self.actor.owns(job, verb)


def job_access(conn: HTTPConnection) -> JobAccess:
    return JobAccess(cluster(conn), asker(conn))


@dataclass(frozen=True)
class Submitter:
    """Who a submit's jobs are for (`submitter`): the user, and whether they may run as
    uid 0 (the submitter's root grant, recorded on every job)."""

    user: str
    address: str
    allow_root: bool


def submitter(conn: HTTPConnection, asked: str | None) -> Submitter:
    """The user a submit acts as: the asker, or `asked` (an admin only: `Actor.acting_as`);
    the owner's account, or root on the master, only with a root grant (NotAllowed, a 403
    audited as denied, else)."""
    ident, actor, cl = identity(conn), asker(conn), cluster(conn)
    user = actor.acting_as(asked, "submit")
    grant = cl.root_grant(ident)
    reserved = None if grant else cl.root_name(user)
    if reserved is not None:
        why = f"{user} is {reserved}: only the owner's admin-token or an --allow-root token"
        raise NotAllowed(f"{why} may submit as {user}", "submit")
    return Submitter(user, client_address(conn), grant)


Ctl = Annotated[Cluster, Depends(cluster)]
Edge = Annotated[EdgeState, Depends(edge)]
Ident = Annotated[Identity, Depends(identity)]
Address = Annotated[str, Depends(client_address)]
Asker = Annotated[Actor, Depends(asker)]
OwnedJob = Annotated[JobAccess, Depends(job_access)]


def leadership(conn: HTTPConnection) -> Leadership | None:
    """The election this master takes part in (several masters on one database), or None
    (SQLite: the only master, always the leader)."""
    found: Leadership | None = getattr(conn.app.state, "leadership", None)
    return found
