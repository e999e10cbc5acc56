"""The master's HTTP edge: the app, its middleware and error map, and its routers.

Each resource has its router module (jobs.py, jobctl.py, allocations.py, attach.py,
nodes.py, tokens.py, reservations.py, agents.py, public.py, dashboard.py, observe.py); a
new one is a module and one line in `ROUTERS`.  A route
reads who asks from deps.py and raises the controller's errors, which errors.py answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from mgpu.config import ClusterConfig
from mgpu.master.control.cluster import Cluster
from mgpu.master.ha.leadership import EXIT_DEPOSED, Leadership
from mgpu.master.http import (
    agents,
    allocations,
    attach,
    dashboard,
    errors,
    jobctl,
    jobs,
    nodes,
    observe,
    partitions,
    podagent,
    public,
    reservations,
    steps,
    tokens,
)
from mgpu.master.http.deps import EdgeState
from mgpu.master.http.guard import AuditRow, FailedLogins, Guard
from mgpu.master.http.requestkeys import RequestKeyGate
from mgpu.master.http.standby import StandbyGate
from mgpu.master.http.submit import install_submit
from mgpu.master.runtime import gcpause
from mgpu.master.security.auth import BadTokenThrottle, TokenStore
from mgpu.master.security.nodeauth import NodeSecrets
from mgpu.master.store import open_store
from mgpu.master.store.base import ANSWER_WITHIN, Store
from mgpu.master.store.fence import Fenced
from mgpu.master.store.outputs import FileOutputStore, OutputStore
from mgpu.tlsutil import ensure_ca

__all__ = ["create_app", "open_cluster"]

log = logging.getLogger("mgpu.master")

ROUTERS: tuple[APIRouter, ...] = (
    jobs.router,
    jobctl.router,  # hold, release, requeue, update
    allocations.router,  # rsh, allocations and their steps
    attach.router,  # terminals and allocations: the client's connection
    nodes.router,
    tokens.router,  # and whoami, audit
    reservations.router,
    public.router,  # health, readiness, metrics, the CA, the page and its files
    dashboard.router,  # the page's compact views
    observe.router,  # history, reports, utilisation
    agents.router,
    podagent.router,  # the agents in the Pods of a Kubernetes partition's jobs
    steps.router,  # srun inside a job: Slurm's steps
    partitions.router,  # sinfo's partitions
)


def open_cluster(
    state_dir: Path, config: ClusterConfig, store: Store | None = None, tls: bool = False
) -> Cluster:
    """The controller over the state dir: its store (`store`, else the one `config.database`
    names: SQLite in the state dir by default), tokens (made at first start; `tls`: the
    master serves TLS, and its tokens say so), output and node secrets; the cluster CA is
    made here too, at start, if it is not there yet."""
    fingerprint = ensure_ca(state_dir)
    if store is None:
        store = open_store(config.database, state_dir)
    owner = getpass.getuser()
    tokens = TokenStore(store, state_dir, fingerprint, tls)
    tokens.bootstrap(owner)
    outputs = open_outputs(state_dir, config.database, store)
    cluster = Cluster(config, store, tokens, outputs, NodeSecrets(store), owner=owner)
    if config.kube_partitions():  # else nothing of Kubernetes is imported
        from mgpu.master.kube.driver import services

        cluster.services += services(cluster)
    gcpause.watch()
    gcpause.tune()
    gcpause.freeze()  # what was loaded lives long: full collections skip it
    return cluster


def open_outputs(state_dir: Path, database: str | None, store: Store) -> OutputStore:
    """Job output: files in the state dir, or (a shared database) tables in it, every
    write checked by the store's fence, so every master reads every job's output."""
    if database:
        from mgpu.master.store.pgoutputs import PgOutputStore
        from mgpu.master.store.postgres import PostgresStore

        link = store.link if isinstance(store, PostgresStore) else None  # its tag too
        return PgOutputStore(database, store.fence, link)
    return FileOutputStore(state_dir / "output")


def create_app(
    state_dir: Path,
    config: ClusterConfig,
    announce: tuple[str, int, bool] | None = None,
    leadership: Leadership | None = None,
    store: Store | None = None,
    tls: bool = False,
) -> FastAPI:
    """The master's app; `store`: opened already (`mgpu master` opens it before serving,
    so that a database it cannot use is one line at start), else opened at startup;
    `leadership`: this master is one of several on a shared database (master/ha): it
    stands by, and opens the cluster from the database once it takes the lease; `tls`: it
    serves TLS (its tokens say so, mgpu.tokens.TLS_MARK)."""

    def write_audit(rows: list[AuditRow]) -> None:
        app.state.cluster.audit_rows(rows)

    # Refused logins and hellos: counted, one audit row per address and minute (guard.py).
    edge = EdgeState(
        state_dir,
        BadTokenThrottle(),
        FailedLogins(write_audit),
        FailedLogins(write_audit, kind="agent_refused", noun="hello"),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if leadership is not None:
            async with _stand_by(app, state_dir, config, leadership, edge.flush, announce, tls):
                yield
            return
        cluster = open_cluster(state_dir, config, store, tls)
        cluster.store.answer_within = ANSWER_WITHIN  # loaded: from now on no long wait
        app.state.cluster = cluster
        if announce is not None and announce[2]:
            _announce_join(state_dir, announce[0], announce[1])
        task = asyncio.create_task(cluster.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            cluster.flush_all()
            edge.flush()
            cluster.close()

    app = FastAPI(title="mgpu master", version="0.1.0", lifespan=lifespan)
    app.state.edge = edge
    # Inside Guard (who asks is known, the body bounded): job control answered once a key.
    app.add_middleware(RequestKeyGate)
    # Authentication and the body limit run before FastAPI reads a body.
    app.add_middleware(
        Guard,
        identify=lambda token: app.state.cluster.identify(token),
        throttle=edge.throttle,
        failures=edge.failures,
    )
    errors.install(app)
    if leadership is not None:
        app.state.leadership = leadership
        # Outermost: a master that does not lead has no controller for the rest to ask.
        app.add_middleware(StandbyGate, leadership=leadership)

        @app.exception_handler(Fenced)
        async def fenced(request: object, exc: Exception) -> JSONResponse:
            leadership.deposed(str(exc))  # exits (unless a test's on_lost returns)
            return JSONResponse({"detail": str(exc), "role": "standby", "leader": None}, 503)

    # The hottest request, answered without FastAPI's per-request machinery.
    install_submit(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


@asynccontextmanager
async def _stand_by(
    app: FastAPI,
    state_dir: Path,
    config: ClusterConfig,
    leadership: Leadership,
    flush_edge: Callable[[], None],
    announce: tuple[str, int, bool] | None,
    tls: bool,
) -> AsyncIterator[None]:
    """A master of several: stand by (the edge answers 503, master/http/standby.py) until
    the lease is this master's, then open the cluster from the database and schedule; at
    the end, the last writes, then the lease given up."""
    loop = asyncio.get_running_loop()
    took = asyncio.Event()

    def on_lead(generation: int) -> None:
        loop.call_soon_threadsafe(took.set)

    leadership.on_lead = on_lead
    default_handler = loop.get_exception_handler()

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # A write refused by the fence (a group commit's flush, say): another master leads.
        error = context.get("exception")
        if isinstance(error, Fenced):
            leadership.deposed(str(error))
        if default_handler is not None:
            default_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(on_error)

    async def lead() -> None:
        await took.wait()
        try:
            store = open_store(leadership.database, state_dir, link=leadership.link)
            store.fence = leadership.fence  # every write: only while this lease is its own
            cluster = open_cluster(state_dir, config, store, tls)
        except Exception as e:
            log.critical("cannot open the cluster as its leader: %s", e, exc_info=True)
            logging.shutdown()
            os._exit(EXIT_DEPOSED)  # the lease runs out; another master takes it
        store.answer_within = ANSWER_WITHIN  # loaded: from now on no long wait
        grace = config.ha.takeover_grace
        cluster.node_admin.grace(config.networking.timeout + 15 if grace is None else grace)
        cluster.node_admin.holds_lease = leadership.may_send  # no lease: no node judged
        app.state.cluster = cluster
        leadership.serving = True
        log.info("scheduling as the leader (generation %s)", leadership.generation)
        if announce is not None and announce[2]:
            _announce_join(state_dir, announce[0], announce[1])
        try:
            await cluster.run()
        except Fenced as e:
            leadership.deposed(str(e))
        finally:
            if leadership.lost is None:
                with contextlib.suppress(Fenced):
                    cluster.flush_all()
                    flush_edge()
            cluster.close()

    leadership.start()
    task = asyncio.create_task(lead())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(leadership.stop, True)  # after the last write


def _announce_join(state_dir: Path, host: str, port: int) -> None:
    """First start: say once how to join a GPU machine (as kubeadm and k3s do).  The token
    itself is never logged (logs are read by more people than the state dir): the command
    names the file it is in."""
    shown = host if host not in ("0.0.0.0", "::") else "<this machine's address>"
    log.info(
        "first start: tokens written to %s (join-token, admin-token, mode 0600). On each GPU "
        "machine run, with the join token copied from %s:"
        "\n    MGPU_JOIN_TOKEN=<join token> mgpu node --node-id <NODE_ID> --master-host %s "
        "--master-port %d",
        state_dir,
        state_dir / "join-token",
        shown,
        port,
    )
