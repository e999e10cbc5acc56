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

What one client may cost is bounded.  Its messages are at most 64 KiB
(connections.CLIENT_MAX_MESSAGE; typed input larger than that closes the connection, 1009).
Typed input is flow-controlled: while the terminal's window of input in flight to its
agent is full (master/state/registry.py, `InputWindow`), no more is read from the client,
so TCP slows the client down and the master holds a window per terminal, whatever the
client sends.  And a client's WebSockets are counted, per address, user and job
(connections.ClientSockets, `cluster.master.websockets_per_*`): one more is refused
before the upgrade, a 429 with one sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from mgpu.master.control.cluster import Cluster, NotFound
from mgpu.master.control.jobctl import NotAllowed
from mgpu.master.http.deps import Asker, Ctl, Edge
from mgpu.master.http.errors import answer, error, missing
from mgpu.master.http.follow import JobNews, StepNews, follow, line
from mgpu.master.state.steps import Step
from mgpu.model import Job
from mgpu.protocol import MAX_TERMINAL_INPUT

__all__ = ["router"]

router = APIRouter()

TOO_LARGE = 1009
"""The WebSocket close code for a message too big to process (RFC 6455)."""


@router.websocket("/api/jobs/{run_id}/attach")
async def attach(
    ws: WebSocket,
    run_id: str,
    cl: Ctl,
    actor: Asker,
    edge: Edge,
    since: int = 0,
    output: int = 1,
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
    held = (actor.address or "?", actor.user, job.id)
    refusal = edge.sockets.take(*held, cl.config.cluster.master)
    if refusal is not None:
        await ws.send_denial_response(error(429, refusal))
        return
    try:
        await _attached(ws, cl, run_id, step, job, since, bool(output))
    finally:
        edge.sockets.give_back(*held)


async def _attached(
    ws: WebSocket, cl: Cluster, run_id: str, step: Step | None, job: Job, since: int, output: bool
) -> None:
    await ws.accept()
    heartbeat = cl.config.networking.heartbeat_interval
    await ws.send_text(line({"attached": run_id, "heartbeat": heartbeat}).decode())
    cl.client_alive(run_id)
    if step is not None:
        started = line({"started": True, "nodes": step.on_nodes})
        feed = follow(cl, step.id, StepNews(step), since, periodic=False)  # its end closes output
    else:
        started = b""
        news = JobNews(cl, job.id, attach=True)  # woken by the job's changes
        feed = follow(cl, job.id, news, since, output=output, periodic=False)
    sender = asyncio.create_task(_send_all(ws, started, feed))
    try:
        while True:
            room = cl.terminal_input_room(run_id)
            if room is not None and not await _wait_room(cl, run_id, room, sender, heartbeat):
                break  # the run ended while its input waited
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            cl.client_alive(run_id)
            data = message.get("bytes")
            if data:
                if len(data) > MAX_TERMINAL_INPUT:
                    why = f"typed input comes {MAX_TERMINAL_INPUT // 1024} KiB a message at most"
                    await ws.close(TOO_LARGE, why)
                    break
                cl.terminal_input(run_id, data)
            elif message.get("text"):
                _control(cl, run_id, message["text"])
    except WebSocketDisconnect:
        pass
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender


async def _wait_room(
    cl: Cluster, run_id: str, room: asyncio.Event, sender: asyncio.Task[None], heartbeat: float
) -> bool:
    """Wait until the run's input window has room again (True) or the run has ended
    (False).  Meanwhile the client is not read, its heartbeats neither: it is there (its
    connection is open, waiting on us), so it is kept alive here."""
    waiter = asyncio.ensure_future(room.wait())
    try:
        while True:
            done, _ = await asyncio.wait(
                {waiter, sender}, timeout=heartbeat, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter in done:
                return True
            if sender in done:
                return False
            cl.client_alive(run_id)
    finally:
        waiter.cancel()


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
