"""The one connection of a client that holds a run: its terminal, its allocation.

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
from collections.abc import AsyncIterator

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from mgpu.master.control.cluster import Cluster, NotFound
from mgpu.master.control.jobctl import NotAllowed
from mgpu.master.http.deps import Asker, Ctl
from mgpu.master.http.errors import answer, missing
from mgpu.master.http.follow import JobNews, StepNews, follow, line
from mgpu.protocol import MAX_TERMINAL_INPUT

__all__ = ["router"]

router = APIRouter()


@router.websocket("/api/jobs/{run_id}/attach")
async def attach(
    ws: WebSocket, run_id: str, cl: Ctl, actor: Asker, since: int = 0, output: int = 1
) -> None:
    step = cl.step(run_id)
    job = cl.get_job(step.job_id if step is not None else run_id)
    try:
        if job is None or since < 0:
            raise missing("job or step", run_id)
        actor.owns(job, "attach to")
    except (NotFound, NotAllowed) as e:
        await ws.send_denial_response(answer(ws, e))
        return
    await ws.accept()
    hello = {"attached": run_id, "heartbeat": cl.config.networking.heartbeat_interval}
    await ws.send_text(line(hello).decode())
    cl.client_alive(run_id)
    if step is not None:
        started = line({"started": True, "nodes": step.on_nodes})
        feed = follow(cl, step.id, StepNews(step), since)
    else:
        started = b""
        feed = follow(cl, job.id, JobNews(cl, job.id, attach=True), since, output=bool(output))
    sender = asyncio.create_task(_send_all(ws, started, feed))
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            cl.client_alive(run_id)
            data = message.get("bytes")
            if data:
                for i in range(0, len(data), MAX_TERMINAL_INPUT):
                    cl.terminal_input(run_id, data[i : i + MAX_TERMINAL_INPUT])
            elif message.get("text"):
                _control(cl, run_id, message["text"])
    except WebSocketDisconnect:
        pass
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender


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
            cl.resize_terminal(run_id, rows, cols)


async def _send_all(ws: WebSocket, first: bytes, feed: AsyncIterator[bytes]) -> None:
    """`first`, everything the feed yields, then the connection closed (the run has ended)."""
    if first:
        await ws.send_text(first.decode())
    async for chunk in feed:
        await ws.send_text(chunk.decode())
    await ws.close()
