"""The master's HTTP API, the agents' WebSocket, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, HTTPException, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from pydantic import AfterValidator, BaseModel, Field

from mgpu import execspec, spec
from mgpu.config import ClusterConfig
from mgpu.master.control.cluster import Cluster, Conflict, NotFound
from mgpu.master.control.submit import SubmitError
from mgpu.master.http.attach import follow_line, make_attach_router
from mgpu.master.http.guard import FailedLogins, Guard
from mgpu.master.http.jobctl import make_jobctl_router
from mgpu.master.http.jobs import install_submit
from mgpu.master.http.partitions import make_partitions_router
from mgpu.master.http.queries import (
    ARRAY_TASKS_SHOWN,
    JobFilter,
    array_answer,
    by_task,
    json_in_slices,
    queue_answer,
    states_of,
)
from mgpu.master.http.reservations import make_reserve_router
from mgpu.master.http.sentences import validation_sentence as _validation_sentence
from mgpu.master.monitor.dashboard import make_router as dashboard_router
from mgpu.master.monitor.observe import PAGE_HEADERS, make_router
from mgpu.master.runtime import gcpause
from mgpu.master.runtime.turns import bulk_turn
from mgpu.master.security.auth import BadTokenThrottle, Identity, TokenStore
from mgpu.master.security.nodeauth import NodeSecrets
from mgpu.master.state.registry import AgentLink
from mgpu.master.state.steps import Step
from mgpu.master.store.outputs import OutputStore
from mgpu.master.store.sqlite import Store
from mgpu.model import Job
from mgpu.protocol import HelloError, Refused, encode, parse_agent_messages, parse_hello
from mgpu.safetext import escape_optional
from mgpu.tlsutil import ensure_ca

log = logging.getLogger("mgpu.master")


WAIT_MAX_IDS = 1000
"""Jobs one /api/wait may name (the client splits a longer list into several requests)."""
LOOKUP_SLICE = 100
"""Jobs read or rendered per loop turn by a request that names many."""
CANCEL_PAGE = 50
CANCEL_BUDGET = 0.02
"""Seconds of array cancelling per loop turn, the write of what it cancelled (one
transaction, its cost estimated from the last one) included; between them others run."""


class WaitRequest(BaseModel):
    ids: list[str]
    timeout: float = Field(default=30.0, ge=0, le=3600)


def _step_host(text: str) -> str:
    spec.validate_text(text, "the step's host")
    return text


class StepRequest(BaseModel):
    """`mgpu rsh HOST ARGV`: argv is checked as a submit's is (UTF-8 without NUL, sizes)."""

    host: Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_step_host)]
    argv: Annotated[list[str], Field(min_length=1), AfterValidator(execspec.validate_argv)]


class TokenRequest(BaseModel):
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
    admin: bool = False
    allow_root: bool = False


class DrainRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=1000)


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def open_cluster(state_dir: Path, config: ClusterConfig) -> Cluster:
    """The controller over the state dir: its store, tokens (made at first start), output
    and node secrets; the cluster CA is made here too, at start, if it is not there yet."""
    fingerprint = ensure_ca(state_dir)
    store = Store(state_dir / "mgpu.db")
    owner = getpass.getuser()
    tokens = TokenStore(store.db, state_dir, fingerprint)
    tokens.bootstrap(owner)
    outputs = OutputStore(state_dir / "output")
    cluster = Cluster(config, store, tokens, outputs, NodeSecrets(store.db), owner=owner)
    gcpause.watch()
    gcpause.tune()
    gcpause.freeze()  # what was loaded lives long: full collections skip it
    return cluster


def create_app(
    state_dir: Path, config: ClusterConfig, announce: tuple[str, int, bool] | None = None
) -> FastAPI:
    cluster: Cluster | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal cluster
        cluster = open_cluster(state_dir, config)
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
            failures.flush()
            refused_hellos.flush()
            cluster.outputs.close_all()
            cluster.store.close()

    throttle = BadTokenThrottle()

    def c() -> Cluster:
        assert cluster is not None
        return cluster

    # Refused logins and hellos: counted, one audit row per address and minute (guard.py).
    failures = FailedLogins(lambda rows: c().store.record_events(rows))
    refused_hellos = FailedLogins(
        lambda rows: c().store.record_events(rows), kind="agent_refused", noun="hello"
    )

    app = FastAPI(title="mgpu master", version="0.1.0", lifespan=lifespan)
    # Authentication and the body limit run before FastAPI reads a body.
    app.add_middleware(
        Guard, identify=lambda token: c().identify(token), throttle=throttle, failures=failures
    )

    def who(request: Request) -> Identity:
        ident: Identity = request.state.identity
        return ident

    def deny(request: Request, action: str, why: str) -> HTTPException:
        ident = who(request)
        address = request.client.host if request.client else "?"
        c().store.record_event(
            "denied", actor=ident.user, address=address, target=action, detail=why
        )
        return HTTPException(403, f"not authorised: {why}")

    def require_admin(request: Request, action: str) -> Identity:
        ident = who(request)
        if not ident.admin:
            raise deny(
                request, action, f"{action} needs an admin token ({ident.user} is not admin)"
            )
        return ident

    def require_owner(request: Request, job: Job, action: str) -> Identity:
        ident = who(request)
        if not ident.admin and job.user != ident.user:
            raise deny(request, f"{action} {job.id}", f"job {job.id} belongs to {job.user}")
        return ident

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _validation_sentence(exc))

    def find(job_id: str) -> Job:
        job = c().get_job(job_id)
        if job is None:
            raise NotFound(job_id)
        return job

    @app.exception_handler(NotFound)
    async def _on_not_found(request: Request, exc: NotFound) -> JSONResponse:
        return _error(404, f"no such job or node: {exc.args[0]}")

    # ---- jobs ---------------------------------------------------------------

    # The hottest request, answered without FastAPI's per-request machinery.
    install_submit(app, c, who, deny)

    @app.get("/api/jobs")
    async def queue(
        all: bool = False,
        limit: int = Query(default=0, ge=0),
        after: str | None = None,
        state: str | None = None,
        user: str | None = None,
        fold: bool = False,
    ) -> Response:
        """Every active job (`all`: and the last 1,000 ended), in submit order; `limit`
        jobs a page from just `after` the cursor, only those in `state`(s) of `user`."""
        flt = JobFilter(states_of(state), user or None)
        chunks = queue_answer(c(), all, limit, after, flt, fold)
        return StreamingResponse(chunks, media_type="application/json")

    @app.get("/api/jobs/{job_id}")
    async def show(
        job_id: str,
        limit: int = Query(default=ARRAY_TASKS_SHOWN, ge=0),
        state: str | None = None,
    ) -> Response:
        """One job; an array id gives {"array_job_id", "counts" by state, "tasks": the
        first `limit` (0: every one) in `state`(s), "more": how many are not listed}."""
        job = c().get_job(job_id)
        if job is None:
            body = await array_answer(c(), job_id, limit, JobFilter(states_of(state)))
            if body is None:
                raise NotFound(job_id)
            return Response(body, media_type="application/json")
        return _json_response(c().public_job(job))

    @app.get("/api/jobs/{job_id}/wait")
    async def wait(job_id: str, timeout: float = Query(default=30.0, ge=0, le=3600)) -> Any:
        """Answer once the job has ended (or after `timeout` seconds, whatever its state)."""
        deadline = time.monotonic() + timeout
        while True:
            job = find(job_id)
            left = deadline - time.monotonic()
            if job.terminal or left <= 0:
                return _json_response(c().public_job(job))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c().job_event(job_id).wait(), timeout=left)

    @app.post("/api/wait")
    async def wait_many(body: WaitRequest) -> Response:
        """Answer once every listed job has ended (or after `timeout` seconds)."""
        if len(body.ids) > WAIT_MAX_IDS:
            return _error(
                422,
                f"at most {WAIT_MAX_IDS} job ids per wait ({len(body.ids)} given): "
                "wait for them in several requests",
            )
        deadline = time.monotonic() + body.timeout
        jobs = await _lookup(c(), body.ids)
        # Ended jobs stay ended: only the others are looked at again, in memory.
        waited = [j.id for j in jobs.values() if not j.terminal]
        active = list(waited)
        while active:
            job = c().get_job(active[-1])
            left = deadline - time.monotonic()
            if job is not None and not job.terminal:
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c().job_event(job.id).wait(), timeout=left)
                continue
            active.pop()
        jobs.update(await _lookup(c(), waited))
        # Rendered a slice at a time, straight to JSON: FastAPI's own encoder would walk
        # 1,000 jobs in Python in one go.
        parts = []
        for i in range(0, len(body.ids), LOOKUP_SLICE):
            part = [c().public_job(jobs[j]) for j in body.ids[i : i + LOOKUP_SLICE]]
            parts.append(_json_bytes(part)[1:-1])
            await bulk_turn()
        body_bytes = b'{"jobs": [' + b",".join(p for p in parts if p) + b"]}"
        return Response(body_bytes, media_type="application/json")

    @app.post("/api/jobs/{job_id}/cancel")
    async def cancel(job_id: str, request: Request) -> Response:
        ident = who(request)
        address = _address(request)
        job = c().get_job(job_id)
        if job is not None:
            require_owner(request, job, "cancel")
            if c().cancel(job, actor=ident.user, address=address):
                return JSONResponse({"cancelled": [job.id], "already_ended": []})
            return JSONResponse({"cancelled": [], "already_ended": [job.id]})
        if not spec.may_be_array_id(job_id):  # not an array id either
            raise NotFound(job_id)
        # An array: its tasks a page at a time; every CANCEL_BUDGET of work is written in one
        # transaction and the loop is free before the next (the request's one audit event
        # goes with the first).
        # Pages of ids as tuples: the collector stops tracking a tuple of strings, where it
        # would walk a list of 100,000 ids in every full collection while this runs.
        cancelled: list[tuple[str, ...]] = []
        ended: list[tuple[str, ...]] = []
        found = False
        event: tuple[str, str | None, str | None, str] | None = (
            "cancel",
            ident.user,
            address,
            job_id,
        )
        started = time.monotonic()
        pending = 0  # cancelled, not written yet
        write_cost = 30e-6  # seconds per task, as the last write took (a first guess)
        for rows in c().array_pages(job_id, CANCEL_PAGE):
            found = True
            for task_id, _, user in rows:
                if user != ident.user and not ident.admin:
                    raise deny(request, f"cancel {task_id}", f"job {task_id} belongs to {user}")
            done, gone = c().cancel_tasks([r[:2] for r in rows], ident.user)
            cancelled.append(tuple(done))
            ended.append(tuple(gone))
            pending += len(done)
            if time.monotonic() - started + pending * write_cost >= CANCEL_BUDGET:
                written = time.monotonic()
                c().commit(event, "every task of the array")
                write_cost = (time.monotonic() - written) / max(pending, 1)
                event = None
                pending = 0
                await bulk_turn()
                started = time.monotonic()
        if not found:
            raise NotFound(job_id)
        c().commit(event, "every task of the array")
        body = {"cancelled": by_task(cancelled), "already_ended": by_task(ended)}
        return Response(await json_in_slices(body), media_type="application/json")

    @app.get("/api/jobs/{job_id}/output")
    async def output(
        job_id: str, request: Request, follow: bool = False, since: int = Query(default=0, ge=0)
    ) -> StreamingResponse:
        require_owner(request, find(job_id), "read the output of")
        return StreamingResponse(
            _output_stream(c(), job_id, follow, since), media_type="application/x-ndjson"
        )

    @app.post("/api/jobs/{job_id}/steps")
    async def start_step(job_id: str, body: StepRequest, request: Request) -> JSONResponse:
        """Start a process inside a running job's allocation (used by `mgpu rsh`)."""
        require_owner(request, find(job_id), "rsh into")
        try:
            step = c().start_step(job_id, body.host, body.argv)
        except SubmitError as e:
            return _error(409, str(e))
        return JSONResponse({"step_id": step.id}, status_code=201)

    @app.get("/api/steps/{step_id}/output")
    async def step_output(step_id: str, request: Request) -> StreamingResponse:
        step = c().steps.by_id.get(step_id)
        if step is None:
            raise NotFound(step_id)
        require_owner(request, find(step.job_id), "read the output of")
        return StreamingResponse(_step_stream(c(), step), media_type="application/x-ndjson")

    # ---- nodes --------------------------------------------------------------

    @app.get("/api/nodes")
    async def nodes() -> dict[str, Any]:
        return {"nodes": c().nodes_public()}

    @app.post("/api/nodes/{node_id}/drain")
    async def drain(node_id: str, body: DrainRequest, request: Request) -> dict[str, Any]:
        ident = require_admin(request, "drain")
        node = c().drain(node_id, body.reason, actor=ident.user, address=_address(request))
        return c().node_public(node)

    @app.delete("/api/nodes/{node_id}")
    async def remove_node(node_id: str, request: Request) -> Any:
        """Forget a node and its secret (`mgpu node remove`); see Cluster.remove_node."""
        ident = require_admin(request, "node remove")
        try:
            requeued = c().remove_node(node_id, actor=ident.user, address=_address(request))
        except Conflict as e:
            return _error(409, str(e))
        return {"removed": node_id, "requeued": requeued}

    @app.post("/api/nodes/{node_id}/resume")
    async def resume(node_id: str, request: Request) -> dict[str, Any]:
        ident = require_admin(request, "resume")
        node = c().resume(node_id, actor=ident.user, address=_address(request))
        return c().node_public(node)

    # ---- tokens and audit ---------------------------------------------------

    @app.get("/api/whoami")
    async def whoami(request: Request) -> dict[str, Any]:
        ident = who(request)
        return {"user": ident.user, "admin": ident.admin}

    @app.post("/api/tokens")
    async def token_create(body: TokenRequest, request: Request) -> JSONResponse:
        ident = require_admin(request, "token create")
        if body.allow_root:
            if not ident.owner:
                raise deny(request, "token create", "only the owner's admin-token grants root")
            if not c().config.security.allow_root_jobs:
                return _error(
                    400,
                    "root grants are off: set security.allow_root_jobs: true in the cluster "
                    "config to allow --allow-root tokens",
                )
        elif (reserved := c().root_name(body.user)) is not None:
            raise deny(
                request,
                "token create",
                f"{body.user} is {reserved}: a token for it needs --allow-root (owner only)",
            )
        token_id, token = c().tokens.create(body.user, body.admin, allow_root=body.allow_root)
        c().store.record_event(
            "token_create",
            actor=ident.user,
            address=_address(request),
            target=body.user,
            detail=f"id {token_id}"
            + (" admin" if body.admin else "")
            + (" allow-root" if body.allow_root else ""),
        )
        return JSONResponse({"user": body.user, "token": token, "id": token_id}, status_code=201)

    @app.get("/api/tokens")
    async def token_list(request: Request) -> dict[str, Any]:
        require_admin(request, "token list")
        return {"tokens": c().tokens.list()}

    @app.delete("/api/tokens/{token_id}")
    async def token_revoke(token_id: str, request: Request) -> dict[str, Any]:
        ident = require_admin(request, "token revoke")
        guarded = c().tokens.guarded(token_id)
        if guarded is not None and not ident.owner:
            why = f"only the cluster's owner may revoke {guarded}"
            raise deny(request, f"token revoke {token_id}", why)
        if not c().tokens.revoke(token_id):
            raise NotFound(token_id)
        c().store.record_event(
            "token_revoke", actor=ident.user, address=_address(request), target=token_id
        )
        return {"revoked": token_id}

    @app.get("/api/audit")
    async def audit(request: Request, since: float = Query(default=0.0, ge=0)) -> dict[str, Any]:
        require_admin(request, "audit")
        failures.flush()  # the refused logins and hellos counted so far, written now
        refused_hellos.flush()
        return {"events": [_shown_event(e) for e in c().store.events(since=since)]}

    @app.get("/api/ca")
    async def ca() -> PlainTextResponse:
        """The cluster CA, for peers to check against the fingerprint in their token."""
        return PlainTextResponse((state_dir / "ca.crt").read_text())

    # ---- health -------------------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        cl = c()
        online = sum(1 for n in cl.nodes.values() if n.schedulable)
        loop_alive = time.time() - cl.loop_tick < 10
        try:
            cl.store.set_meta("readyz", str(time.time()))
            writable = True
        except Exception:
            writable = False
        ok = writable and loop_alive
        body: dict[str, Any] = {"ready": ok, "store_writable": writable}
        body.update(scheduler_alive=loop_alive, nodes_online=online)
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        from mgpu.master.monitor.metrics import render_metrics

        return PlainTextResponse(render_metrics(c()), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        page = Path(__file__).resolve().parents[2] / "web" / "index.html"
        if page.exists():
            return HTMLResponse(page.read_text(encoding="utf-8"), headers=PAGE_HEADERS)
        return HTMLResponse(
            "<h1>mgpu</h1><p>See <code>mgpu queue</code>.</p>", headers=PAGE_HEADERS
        )

    # ---- agents -------------------------------------------------------------

    # Agent connections waiting for their hello: anyone who reaches the port may open one.
    hellos_awaited = 0
    hellos_limit = config.cluster.master.pending_hellos

    @app.websocket("/api/agent")
    async def agent_channel(ws: WebSocket) -> None:
        nonlocal hellos_awaited
        if hellos_awaited >= hellos_limit:
            # Closed, not refused: an agent (and bench/swarm.py) tries again after its
            # backoff, and a refused hello would stop it.  An HTTP refusal before the
            # accept would make an agent that guesses TLS switch to it for a try.
            with contextlib.suppress(Exception):
                await ws.accept()
                await ws.close(code=1013, reason="too many agents saying hello: try again")
            return
        cl = c()
        hellos_awaited += 1  # before the accept: counted by the time the peer may go on
        try:
            await ws.accept()
            first = parse_hello(await _hello_text(ws))
        except (HelloError, WebSocketDisconnect) as e:
            with contextlib.suppress(Exception):
                await ws.send_text(encode(Refused(reason=str(e) or "no hello")))
                await ws.close()
            return
        finally:
            hellos_awaited -= 1
        refusal = cl.refuse_hello(first)
        address = ws.client.host if ws.client else "?"
        if refusal is None and not cl.tokens.join(first.token):
            refusal = "not authorised: " + (
                "no join token given (mgpu node --token, or $MGPU_JOIN_TOKEN)"
                if not first.token
                else "wrong join token"
            )
            delay = throttle.delay(address)
            throttle.failed(address)
            if delay:
                await asyncio.sleep(delay)
        new_secret = None
        if refusal is None:
            # No await from here to agent_hello: a secret issued is a node accepted.
            verdict = cl.verify_node(first)
            refusal, new_secret = verdict.refusal, verdict.new_secret
            if verdict.bad_secret:
                delay = throttle.delay(address)
                throttle.failed(address)
                if delay:
                    await asyncio.sleep(delay)
        if refusal is not None:
            refused_hellos.failed(address, None, refusal, actor=first.node_id)
            log.warning("refused agent %s from %s: %s", first.node_id, ws.client, refusal)
            await ws.send_text(encode(Refused(reason=refusal)))
            await ws.close()
            return
        link = AgentLink(first.node_id, ws)
        welcome = cl.agent_hello(first, link, new_secret)
        await ws.send_text(encode(welcome))
        writer = asyncio.create_task(link.writer())
        try:
            while True:
                raw = await ws.receive_text()
                if link.closed:
                    break  # replaced by a newer connection of this node, or given up on
                errors: list[str] = []
                try:
                    messages = parse_agent_messages(raw, errors)
                except ValueError:  # ValidationError included: not JSON, or one bad message
                    log.warning("bad message from %s: %.200s", first.node_id, raw)
                    continue
                for error in errors:  # the frame's other messages are handled all the same
                    log.warning("bad message from %s skipped: %s", first.node_id, error)
                for msg in messages:
                    try:
                        cl.agent_message(first.node_id, msg)
                    except Exception:  # one message's bug must not cost the connection
                        log.exception(
                            "handling a %s message from %s failed", msg.type, first.node_id
                        )
        except WebSocketDisconnect:
            pass
        finally:
            link.close()
            cl.agent_disconnected(first.node_id, link)
            writer.cancel()

    app.include_router(make_router(c))
    app.include_router(dashboard_router(c))
    app.include_router(make_jobctl_router(c, who, deny))  # hold, release, requeue, update
    app.include_router(make_reserve_router(c, require_admin, _address))
    app.include_router(make_attach_router(c))  # terminals, allocations, their steps
    app.include_router(make_partitions_router(c))  # sinfo's partitions
    return app


HELLO_LIMIT = 4 << 20
"""Characters an agent's hello may have: 10,000 runs and 64 GPUs take about 1 MiB."""
HELLO_TIMEOUT = 10.0
"""Seconds from the connection's upgrade to its hello: an agent sends it at once."""


async def _hello_text(ws: WebSocket) -> str:
    """The first message of an agent's connection, bounded before it is parsed: whoever
    can reach the port may open one (the join token is in the hello), so a peer that
    sends nothing, or something huge, must not hold the connection and its memory."""
    try:
        message = await asyncio.wait_for(ws.receive(), HELLO_TIMEOUT)
    except TimeoutError:
        raise HelloError(f"no hello within {HELLO_TIMEOUT:g} s") from None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        raise HelloError("the first message must be hello (it is not text)")
    if len(text) > HELLO_LIMIT:
        raise HelloError(f"the hello is {len(text)} characters long; at most {HELLO_LIMIT}")
    return str(text)


AUDIT_TEXT_FIELDS = ("actor", "address", "target", "detail")


def _shown_event(event: dict[str, Any]) -> dict[str, Any]:
    """An audit row with its text escaped (mgpu.safetext): a refused request's path, a
    node's id or a refusal's sentence is whatever a client sent (`GET /%1b]0;x%07`), and
    an admin reads these in a terminal, through `jq -r` as well as `mgpu audit`."""
    for key in AUDIT_TEXT_FIELDS:
        event[key] = escape_optional(event[key])
    return event


def _json_bytes(body: Any) -> bytes:
    """Jobs as JSON: orjson (ten times quicker than json on them; FastAPI's encoder walks
    each value in Python first); json for what orjson refuses (a lone surrogate)."""
    try:
        return orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(body).encode()


def _json_response(body: Any) -> Response:
    return Response(_json_bytes(body), media_type="application/json")


async def _lookup(cluster: Cluster, ids: list[str]) -> dict[str, Job]:
    """Jobs by id, a slice at a time (one store query each) with the loop free between."""
    found: dict[str, Job] = {}
    for i in range(0, len(ids), LOOKUP_SLICE):
        found.update(cluster.get_jobs(ids[i : i + LOOKUP_SLICE]))
        await bulk_turn()
    for job_id in ids:
        if job_id not in found:
            raise NotFound(job_id)
    return found


async def _output_stream(
    cluster: Cluster, job_id: str, follow: bool, since: int
) -> AsyncIterator[bytes]:
    """JSON lines: output records, then (when following) status lines and a final end line.

    The records come from the job's output file, a chunk at a time, as they are written
    there (see outputs.py): memory per reader is one chunk, whatever the file's size."""
    wake = cluster.outputs.subscribe(job_id) if follow else None
    reader = cluster.outputs.reader(job_id, since, follow=follow)
    try:
        if wake is None:
            async for chunk in reader.chunks():
                yield chunk
            return
        last_status = None
        while True:
            wake.clear()  # before reading: an append from here on wakes us again
            async for chunk in reader.chunks():
                yield chunk
            job = cluster.get_job(job_id)
            if job is None:
                return
            status = follow_line(cluster, job)
            if "end" in status:  # and the file has been read to its end just now
                yield (json.dumps(status) + "\n").encode()
                return
            if status != last_status:
                last_status = status
                yield (json.dumps(status) + "\n").encode()
            try:
                await asyncio.wait_for(wake.wait(), timeout=1.0)
            except TimeoutError:
                yield b'{"ping":1}\n'
    finally:
        reader.close()
        if wake is not None:
            cluster.outputs.unsubscribe(job_id, wake)


async def _step_stream(cluster: Cluster, step: Step) -> AsyncIterator[bytes]:
    """A step's output as JSON lines, then {"end": true, "exit_code": ...}."""
    wake = cluster.outputs.subscribe(step.id)
    reader = cluster.outputs.reader(step.id)
    try:
        while True:
            wake.clear()
            async for chunk in reader.chunks():
                yield chunk
            if step.done:
                end = {"end": True, "exit_code": step.exit_code, "error": step.error}
                yield (json.dumps(end) + "\n").encode()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=1.0)
    finally:
        reader.close()
        cluster.outputs.unsubscribe(step.id, wake)


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
