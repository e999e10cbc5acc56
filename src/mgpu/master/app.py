"""The master's HTTP API, the agents' WebSocket, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import HTTPConnection

from mgpu.config import ClusterConfig
from mgpu.master.auth import BadTokenThrottle, Identity
from mgpu.master.cluster import Cluster, Conflict, NotFound
from mgpu.master.observe import make_router
from mgpu.master.registry import AgentLink
from mgpu.master.steps import Step
from mgpu.master.submit import JobSpec, SubmitError
from mgpu.model import Job, JobState
from mgpu.protocol import HelloError, Refused, encode, parse_agent_messages, parse_hello

log = logging.getLogger("mgpu.master")


class WaitRequest(BaseModel):
    ids: list[str] = Field(max_length=100000)
    timeout: float = Field(default=30.0, ge=0, le=3600)


class StepRequest(BaseModel):
    host: str = Field(min_length=1, max_length=255)
    argv: list[str] = Field(min_length=1)


class TokenRequest(BaseModel):
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
    admin: bool = False
    allow_root: bool = False


class DrainRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=1000)


OPEN_PATHS = frozenset({"/", "/healthz", "/readyz", "/metrics", "/api/ca", "/openapi.json"})


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


_SHOULD = re.compile(r"^(?:Input|String|List|Dictionary|Value|Tuple|Set) should ")


def _shown(part: object) -> str:
    """A piece of an error location as the user may see it: printable, short, encodable."""
    text = str(part)
    if len(text) > 40 or not text.isprintable():
        return ascii(text[:40] + ("..." if len(text) > 40 else ""))
    return text


def _validation_sentence(exc: RequestValidationError | ValidationError) -> str:
    """One sentence for a refused request, naming the option as the user typed it
    (``--gpus-per-node``, ``--env[NAME]``), not the JSON field; no pydantic wording."""
    err = exc.errors()[0]
    kind = err.get("type", "")
    raw_loc = tuple(err.get("loc", ()))
    if kind == "json_invalid":
        why = (err.get("ctx") or {}).get("error", "")
        at = f" at character {raw_loc[1]}" if len(raw_loc) > 1 else ""
        return f"the request body is not valid JSON ({why}{at})"
    if kind in ("value_error", "assertion_error"):
        # Our own validators' messages are whole sentences that name the option.
        return str((err.get("ctx") or {}).get("error", err.get("msg", "invalid value")))
    loc = [p for p in raw_loc if p not in ("body", "query", "path")]
    if kind == "string_unicode":  # a key pydantic cannot read as text (a lone surrogate)
        return f"{_where(loc) if loc else 'a field name of the request'} is not valid UTF-8"
    if not loc:
        if kind == "missing":
            return "the request body is missing; send a JSON object"
        if kind in ("model_attributes_type", "model_type", "dict_type"):
            return "the request body must be a JSON object"
        return "the request body " + _predicate(str(err.get("msg", "")))
    where = _where(loc)
    if kind == "extra_forbidden":
        return f"{where} is not an option of this request"
    if kind == "missing":
        return f"{where} is required"
    return f"{where} {_predicate(str(err.get('msg', '')))}"


def _where(loc: list[Any]) -> str:
    """A JSON location as the option the user typed: `--gpus-per-node`, `--env[NAME]`."""
    return "--" + _shown(loc[0]).replace("_", "-") + "".join(f"[{_shown(p)}]" for p in loc[1:])


def _predicate(msg: str) -> str:
    """pydantic's "Input should be a valid integer" as "must be a valid integer"."""
    if _SHOULD.match(msg):
        return _SHOULD.sub("must ", msg)
    return f"is not valid: {msg[:1].lower()}{msg[1:]}" if msg else "is not valid"


def create_app(
    state_dir: Path, config: ClusterConfig, announce: tuple[str, int, bool] | None = None
) -> FastAPI:
    cluster: Cluster | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal cluster
        cluster = Cluster(state_dir, config)
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
            cluster.outputs.close_all()
            cluster.store.close()

    throttle = BadTokenThrottle()

    def c() -> Cluster:
        assert cluster is not None
        return cluster

    async def authenticate(conn: HTTPConnection) -> None:
        """Every route needs a user token except health, metrics, the page and the CA."""
        path = conn.url.path
        if path in OPEN_PATHS or path.startswith(("/web/", "/docs")) or path == "/api/agent":
            return
        header = conn.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else None
        ident = c().identify(token)
        address = conn.client.host if conn.client else "?"
        if ident is None:
            delay = throttle.delay(address)
            throttle.failed(address)
            why = "no token given" if not token else "unknown or revoked token"
            c().store.record_event("auth_failed", address=address, target=path, detail=why)
            if delay:
                await asyncio.sleep(delay)  # slows down guessing, costs the honest nothing
            hint = " (set $MGPU_TOKEN or ~/.config/mgpu/token)" if not token else ""
            raise HTTPException(401, f"not authorised: {why}{hint}")
        throttle.succeeded(address)
        conn.state.identity = ident

    app = FastAPI(
        title="mgpu master",
        version="0.1.0",
        lifespan=lifespan,
        dependencies=[Depends(authenticate)],
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

    @app.post("/api/jobs")
    async def submit(spec: JobSpec, request: Request) -> JSONResponse:
        """Queue a job: `spec` is already checked field by field (`mgpu.master.submit`)."""
        ident = who(request)
        user = ident.user
        if spec.user and spec.user != ident.user:
            if not ident.admin:
                raise deny(request, "submit", f"{ident.user} may not submit as {spec.user}")
            user = spec.user
        grant = c().root_grant(ident)
        reserved = None if grant else c().root_name(user)
        if reserved is not None:
            why = f"{user} is {reserved}: only the owner's admin-token or an --allow-root token"
            raise deny(request, "submit", f"{why} may submit as {user}")
        try:
            result = await c().submit(spec, user, address=_address(request), allow_root=grant)
        except SubmitError as e:
            c().store.record_event(
                "submit_refused", actor=user, address=_address(request), detail=str(e)
            )
            return _error(400, str(e))
        body: dict[str, Any] = {"job_id": result.job_id}
        if result.task_ids is not None:
            body["task_ids"] = result.task_ids
        if result.dropped_env:  # set by the scheduler itself: said once, not passed
            body["dropped_env"] = result.dropped_env
        return JSONResponse(body, status_code=201)

    @app.get("/api/jobs")
    async def queue(all: bool = False) -> dict[str, Any]:
        return c().queue(include_finished=all)

    @app.get("/api/jobs/{job_id}")
    async def show(job_id: str) -> dict[str, Any]:
        """One job; an array id gives {"array_job_id", "tasks": [every task]}."""
        job = c().get_job(job_id)
        if job is None:
            tasks = c().array_tasks(job_id)
            if not tasks:
                raise NotFound(job_id)
            return {"array_job_id": job_id, "tasks": [c().public_job(t) for t in tasks]}
        return c().public_job(job)

    @app.get("/api/jobs/{job_id}/wait")
    async def wait(job_id: str, timeout: float = Query(default=30.0, ge=0, le=3600)) -> Any:
        """Answer once the job has ended (or after `timeout` seconds, whatever its state)."""
        deadline = time.monotonic() + timeout
        while True:
            job = find(job_id)
            left = deadline - time.monotonic()
            if job.terminal or left <= 0:
                return c().public_job(job)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c().job_event(job_id).wait(), timeout=left)

    @app.post("/api/wait")
    async def wait_many(body: WaitRequest) -> dict[str, Any]:
        """Answer once every listed job has ended (or after `timeout` seconds)."""
        deadline = time.monotonic() + body.timeout
        for job_id in body.ids:
            while True:
                job = find(job_id)
                left = deadline - time.monotonic()
                if job.terminal or left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c().job_event(job_id).wait(), timeout=left)
        jobs = [find(j) for j in body.ids]
        return {"jobs": [c().public_job(j) for j in jobs]}

    @app.post("/api/jobs/{job_id}/cancel")
    async def cancel(job_id: str, request: Request) -> dict[str, Any]:
        jobs = c().resolve(job_id)
        for j in jobs:
            require_owner(request, j, "cancel")
        actor = who(request).user
        done = [j.id for j in jobs if c().cancel(j, actor=actor, address=_address(request))]
        return {"cancelled": done, "already_ended": [j.id for j in jobs if j.id not in done]}

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
        users = {j.id: j.user for j in c().jobs.values()}
        node = c().drain(node_id, body.reason, actor=ident.user, address=_address(request))
        return node.to_public(users)

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
        users = {j.id: j.user for j in c().jobs.values()}
        node = c().resume(node_id, actor=ident.user, address=_address(request))
        return node.to_public(users)

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
        if not c().tokens.revoke(token_id):
            raise NotFound(token_id)
        c().store.record_event(
            "token_revoke", actor=ident.user, address=_address(request), target=token_id
        )
        return {"revoked": token_id}

    @app.get("/api/audit")
    async def audit(request: Request, since: float = Query(default=0.0, ge=0)) -> dict[str, Any]:
        require_admin(request, "audit")
        return {"events": c().store.events(since=since)}

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
        from mgpu.master.metrics import render_metrics

        return PlainTextResponse(render_metrics(c()), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        page = Path(__file__).resolve().parent.parent / "web" / "index.html"
        if page.exists():
            return HTMLResponse(page.read_text(encoding="utf-8"))
        return HTMLResponse("<h1>mgpu</h1><p>See <code>mgpu queue</code>.</p>")

    # ---- agents -------------------------------------------------------------

    @app.websocket("/api/agent")
    async def agent_channel(ws: WebSocket) -> None:
        await ws.accept()
        cl = c()
        try:
            first = parse_hello(await ws.receive_text())
        except (HelloError, WebSocketDisconnect) as e:
            with contextlib.suppress(Exception):
                await ws.send_text(encode(Refused(reason=str(e) or "no hello")))
                await ws.close()
            return
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
            cl.store.record_event(
                "agent_refused", actor=first.node_id, address=address, detail=refusal
            )
        if refusal is not None:
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
                try:
                    messages = parse_agent_messages(raw)
                except ValidationError:
                    log.warning("bad message from %s: %.200s", first.node_id, raw)
                    continue
                for msg in messages:
                    cl.agent_message(first.node_id, msg)
        except WebSocketDisconnect:
            pass
        finally:
            link.close()
            cl.agent_disconnected(first.node_id, link)
            writer.cancel()

    app.include_router(make_router(c))
    return app


async def _output_stream(
    cluster: Cluster, job_id: str, follow: bool, since: int
) -> AsyncIterator[bytes]:
    """JSON lines: output records, then (when following) status lines and a final end line."""
    q = cluster.outputs.subscribe(job_id) if follow else None
    try:
        records = cluster.outputs.read(job_id, since)
        seen = since + len(records)
        if records:
            yield "".join(json.dumps(r) + "\n" for r in records).encode()
        if q is None:
            return
        last_status = None
        while True:
            job = cluster.get_job(job_id)
            if job is None:
                return
            if job.terminal:
                # Drain anything written between our read and the end.
                rest = cluster.outputs.read(job_id, seen)
                if rest:
                    yield "".join(json.dumps(r) + "\n" for r in rest).encode()
                end = {"end": True, "state": job.state.value, "exit_code": job.exit_code}
                end["reason"] = job.reason
                yield (json.dumps(end) + "\n").encode()
                return
            status: dict[str, Any] = {"status": job.state.value, "reason": job.reason}
            if job.state == JobState.QUEUED:
                status["position"] = cluster.queue_position(job)
            if status != last_status:
                last_status = status
                yield (json.dumps(status) + "\n").encode()
            try:
                item = await asyncio.wait_for(q.get(), timeout=1.0)
            except TimeoutError:
                yield b'{"ping":1}\n'
                continue
            batch = []
            while item is not None:
                index, rec = item
                if index >= seen:
                    batch.append(rec)
                    seen = index + 1
                if q.empty():
                    break
                item = q.get_nowait()
            if batch:
                yield "".join(json.dumps(r) + "\n" for r in batch).encode()
            if item is None:
                job = cluster.get_job(job_id)
                if job is not None and not job.terminal:
                    continue
    finally:
        if q is not None:
            cluster.outputs.unsubscribe(job_id, q)


async def _step_stream(cluster: Cluster, step: Step) -> AsyncIterator[bytes]:
    """A step's output as JSON lines, then {"end": true, "exit_code": ...}."""
    q = cluster.outputs.subscribe(step.id)
    try:
        seen = 0
        while True:
            records = cluster.outputs.read(step.id, seen)
            seen += len(records)
            if records:
                yield "".join(json.dumps(r) + "\n" for r in records).encode()
            if step.done:
                end = {"end": True, "exit_code": step.exit_code, "error": step.error}
                yield (json.dumps(end) + "\n").encode()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(q.get(), timeout=1.0)
    finally:
        cluster.outputs.unsubscribe(step.id, q)


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
