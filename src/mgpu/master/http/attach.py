"""The routes of a client that holds a run: its terminal, its allocation, its steps.

`GET /api/jobs/{id}/attach` (a WebSocket; `id` a job or a step) is the one connection of
`mgpu srun --pty` and `mgpu alloc` (master/control/sessions.py).  The master sends text frames of
JSON lines, as the output stream's (`/api/jobs/{id}/output?follow=1`): output records
(`{"s", "d", "n"}`, read from the run's output file, so they are what `mgpu logs` shows),
the state while it waits (`{"status", "reason", "position"}`), `{"started": true, ...}`
once its process runs (the client then puts its terminal in raw mode), and a last
`{"end": true, ...}`; first of all `{"attached": ID, "heartbeat": S}`.  The client sends
binary frames of typed bytes, `{"resize": [rows, cols]}`, and `{"hb": 1}` at least every
S seconds: silence longer than the node timeout ends the run.

Why a WebSocket and not the NDJSON stream plus a POST per key: one connection that
carries both ways, no HTTP request (headers, routing, token check) per keystroke, and
the connection's end is the client's.  The client speaks it with the standard library
(mgpu.client.websocket).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema

from mgpu import execspec, spec
from mgpu.master.control.allocations import StepRequest
from mgpu.master.control.cluster import Cluster
from mgpu.master.control.submit import PtySize, SubmitError
from mgpu.master.state.steps import Step
from mgpu.model import Job, JobState
from mgpu.protocol import MAX_TERMINAL_INPUT

__all__ = ["make_attach_router"]


def _node_names(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise spec.SpecError("--nodelist must be text such as node001,node002")
    spec.validate_text(value, "--nodelist")
    if len(value) > 64 * 1024:
        raise spec.SpecError("--nodelist is too long")
    try:
        return list(spec.parse_node_list(value))
    except spec.SpecError as e:
        raise spec.SpecError(f"--nodelist: {e}") from None


class AllocStepBody(BaseModel):
    """`mgpu srun` inside an allocation: what to run, where, and how (checked as a
    submit's fields are)."""

    model_config = ConfigDict(extra="forbid")

    argv: Annotated[list[str], Field(min_length=1), AfterValidator(execspec.validate_argv)]
    env: Annotated[dict[str, str], AfterValidator(execspec.validate_env)] = Field(
        default_factory=dict
    )
    cwd: Annotated[str, AfterValidator(execspec.validate_cwd)] | None = None
    nodelist: Annotated[
        list[str], PlainValidator(_node_names), WithJsonSchema({"type": "string"})
    ] = Field(default_factory=list)
    """Only these of the allocation's nodes (`-w`, a,b or node[001-002]); none: all."""
    pty: bool = False
    pty_size: PtySize = None


class EndBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int = Field(ge=0, le=255)


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def make_attach_router(c: Callable[[], Cluster]) -> APIRouter:
    router = APIRouter()

    def denied(ident: Any, job: Job, action: str, address: str) -> str | None:
        """Why `ident` may not act on `job` (audited), or None."""
        if ident.admin or job.user == ident.user:
            return None
        why = f"job {job.id} belongs to {job.user}"
        c().store.record_event(
            "denied", actor=ident.user, address=address, target=f"{action} {job.id}", detail=why
        )
        return f"not authorised: {why}"

    def address(request: Request | WebSocket) -> str:
        return request.client.host if request.client else "?"

    @router.websocket("/api/jobs/{run_id}/attach")
    async def attach(ws: WebSocket, run_id: str, since: int = 0, output: int = 1) -> None:
        cl = c()
        step = cl.steps.by_id.get(run_id)
        job = cl.get_job(step.job_id if step is not None else run_id)
        if job is None or since < 0:
            await ws.send_denial_response(_error(404, f"no such job or step: {run_id}"))
            return
        why = denied(ws.state.identity, job, "attach to", address(ws))
        if why is not None:
            await ws.send_denial_response(_error(403, why))
            return
        await ws.accept()
        hello = {"attached": run_id, "heartbeat": cl.config.networking.heartbeat_interval}
        await ws.send_text(_line(hello))
        cl.sessions.touch(run_id)
        feed = _step_feed(cl, step, since) if step else _job_feed(cl, job.id, since, bool(output))
        sender = asyncio.create_task(_send_all(ws, feed))
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                cl.sessions.touch(run_id)
                data = message.get("bytes")
                if data:
                    for i in range(0, len(data), MAX_TERMINAL_INPUT):
                        cl.sessions.terminal_input(run_id, data[i : i + MAX_TERMINAL_INPUT])
                elif message.get("text"):
                    _control(cl, run_id, message["text"])
        except WebSocketDisconnect:
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender

    @router.post("/api/allocations/{job_id}/steps")
    async def start_step(job_id: str, body: AllocStepBody, request: Request) -> JSONResponse:
        """`mgpu srun` inside an allocation: a step on its nodes and GPUs."""
        cl = c()
        job = cl.get_job(job_id)
        if job is None:
            return _error(404, f"no such job or node: {job_id}")
        ident = request.state.identity
        why = denied(ident, job, "start a step in", address(request))
        if why is not None:
            return _error(403, why)
        req = StepRequest(
            argv=body.argv,
            env=body.env,
            cwd=body.cwd,
            nodes=body.nodelist,
            pty=body.pty,
            pty_size=body.pty_size,
        )
        try:
            step = cl.allocations.start_step(job_id, req)
        except SubmitError as e:
            return _error(409, str(e))
        shown = " ".join(body.argv)[:200]
        cl.store.record_event(
            "step", actor=ident.user, address=address(request), target=step.id, detail=shown
        )
        return JSONResponse({"step_id": step.id, "nodes": step.on_nodes}, status_code=201)

    @router.post("/api/allocations/{job_id}/end")
    async def end(job_id: str, body: EndBody, request: Request) -> JSONResponse:
        """The allocation's command ended (its client says so, with the exit code)."""
        cl = c()
        job = cl.get_job(job_id)
        if job is None:
            return _error(404, f"no such job or node: {job_id}")
        if job.kind != "allocation":
            return _error(409, f"job {job_id} is not an allocation (mgpu alloc)")
        ident = request.state.identity
        why = denied(ident, job, "end", address(request))
        if why is not None:
            return _error(403, why)
        ended = cl.allocations.end(job, body.exit_code)
        if ended:
            event = ("alloc_end", ident.user, address(request), job.id)
            cl.uow.flush(event=event, detail=f"exit code {body.exit_code}")
        job = cl.get_job(job_id) or job
        return JSONResponse({"ended": ended, "state": job.state.value})

    @router.post("/api/steps/{step_id}/cancel")
    async def cancel_step(step_id: str, request: Request) -> JSONResponse:
        cl = c()
        step = cl.steps.by_id.get(step_id)
        job = cl.get_job(step.job_id) if step is not None else None
        if step is None or job is None:
            return _error(404, f"no such step: {step_id}")
        ident = request.state.identity
        why = denied(ident, job, "cancel", address(request))
        if why is not None:
            return _error(403, why)
        cancelled = cl.allocations.cancel_step(step)
        if cancelled:
            cl.store.record_event(
                "step_cancel", actor=ident.user, address=address(request), target=step.id
            )
        return JSONResponse({"cancelled": cancelled})

    return router


def _control(cl: Cluster, run_id: str, text: str) -> None:
    """A control message from the client: a resize; a heartbeat needs nothing more."""
    try:
        message = json.loads(text)
    except ValueError:
        return
    size = message.get("resize") if isinstance(message, dict) else None
    if isinstance(size, list) and len(size) == 2:
        rows, cols = size
        if all(type(v) is int and 1 <= v <= 10000 for v in (rows, cols)):
            cl.sessions.resize(run_id, rows, cols)


async def _send_all(ws: WebSocket, feed: AsyncIterator[str]) -> None:
    """Everything the feed yields, then the connection closed (the run has ended)."""
    async for text in feed:
        await ws.send_text(text)
    await ws.close()


async def _either(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def follow_line(cl: Cluster, job: Job) -> dict[str, Any]:
    """What a follower of `job` is told now: its end once it has ended, else its state and
    reason (and place in the queue while queued)."""
    if job.terminal:
        return {
            "end": True,
            "state": job.state.value,
            "exit_code": job.exit_code,
            "reason": job.reason,
        }
    status: dict[str, Any] = {"status": job.state.value, "reason": job.reason}
    if job.state == JobState.QUEUED:
        status["position"] = cl.queue_position(job)
    return status


async def _job_feed(cl: Cluster, job_id: str, since: int, output: bool) -> AsyncIterator[str]:
    """A job's lines (see the module docstring), woken by its output and its changes."""
    wake = cl.outputs.subscribe(job_id)
    reader = cl.outputs.reader(job_id, since) if output else None
    last: dict[str, Any] | None = None
    started = False
    try:
        while True:
            wake.clear()  # before reading: an append from here on wakes us again
            changed = cl.job_event(job_id)
            if reader is not None:
                async for chunk in reader.chunks():
                    yield chunk.decode()
            job = cl.get_job(job_id)
            if job is None:
                return
            status = follow_line(cl, job)
            if "end" in status:  # and its output has been read to the end just now
                yield _line(status)
                return
            if status != last:
                last = status
                yield _line(status)
            if not started and job.state == JobState.RUNNING and job.start_time is not None:
                started = True
                slots = [{"node_id": s.node_id, "gpu_ids": s.gpu_ids} for s in job.allocation]
                yield _line({"started": True, "allocation": slots})
            await _either(wake, changed, timeout=1.0)
    finally:
        if reader is not None:
            reader.close()
        cl.outputs.unsubscribe(job_id, wake)


async def _step_feed(cl: Cluster, step: Step, since: int) -> AsyncIterator[str]:
    """A step's lines: started at once (its launch is on its way), output, its end."""
    wake = cl.outputs.subscribe(step.id)
    reader = cl.outputs.reader(step.id, since)
    try:
        yield _line({"started": True, "nodes": step.on_nodes})
        while True:
            wake.clear()
            async for chunk in reader.chunks():
                yield chunk.decode()
            if step.done:
                yield _line({"end": True, "exit_code": step.exit_code, "error": step.error})
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=1.0)
    finally:
        reader.close()
        cl.outputs.unsubscribe(step.id, wake)
