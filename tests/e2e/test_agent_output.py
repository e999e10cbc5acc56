"""A job that writes as fast as it can (`yes`, `seq`) against a master that does not keep
up: the root agent queues a bounded amount of its output and leaves the rest in the spool
file; once the master reads again all of it arrives, in order, and the job's end after it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from helpers import until
from mgpu.agent.agent import OUTPUT_QUEUED_MAX, Agent, AgentOptions
from mgpu.agent.spawn import READ_CHUNK
from mgpu.protocol import Welcome, encode

LINES = 8_000_000  # `seq`: 68 MB, several times what the connection and the queue hold
FLOOD_LAUNCH = json.dumps(
    {"type": "launch", "job_id": "flood", "epoch": 1, "grant": {"gpus": [0]}, "allow_root": True}
    | {"argv": ["seq", "1", str(LINES)], "env": {"PATH": "/usr/bin:/bin"}}
)


def queued(agent: Agent) -> int:
    """Characters of output in the agent's outbox (what waits in its memory)."""
    return sum(len(text) for kind, text in agent.outbox if kind == "output")


async def take_output(ws: Any, got: dict[str, Any]) -> None:
    """Read the agent's frames as a master would, checking that stdout comes piece after
    piece (no gap, no overlap), until its `exited`, kept in `got`."""
    async for raw in ws:
        items = json.loads(raw)
        for msg in items if isinstance(items, list) else [items]:
            if msg["type"] == "output" and msg["stream"] == "o":
                assert msg["offset"] == got["next"], (msg["offset"], got["next"])
                got["next"] = msg["end"]
                data = msg["data"].encode()
                got["sha"].update(data)
                got["bytes"] += len(data)
            elif msg["type"] == "exited":
                got["exited"] = msg
                return


def all_before_the_end(got: dict[str, Any]) -> None:
    """All of `seq`'s output arrived, in order (checked piece by piece), then its end."""
    expected = subprocess.run(
        ["seq", "1", str(LINES)], capture_output=True, check=True, timeout=60
    ).stdout
    assert got["bytes"] == len(expected)
    assert got["sha"].hexdigest() == hashlib.sha256(expected).hexdigest()
    assert got["exited"]["exit_code"] == 0, got["exited"]


async def flood(tmp_path: Path) -> dict[str, Any]:
    import websockets

    got: dict[str, Any] = {"sha": hashlib.sha256(), "bytes": 0, "next": 0, "exited": None}
    release, done = asyncio.Event(), asyncio.Event()

    async def serve(ws: Any) -> None:
        json.loads(await ws.recv())  # hello
        await ws.send(encode(Welcome(heartbeat_interval=30)))
        await ws.send(FLOOD_LAUNCH)
        await release.wait()  # a master that does not read: the agent's frames back up
        await take_output(ws, got)
        done.set()

    async with websockets.serve(serve, "127.0.0.1", 0, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        agent = Agent(
            AgentOptions("n1", "127.0.0.1", port, tmp_path / "state", 1, container_runtime="none")
        )
        peak = [0]
        send = agent.send

        def measured(message: Any) -> None:
            send(message)
            peak[0] = max(peak[0], queued(agent))

        agent.send = measured  # type: ignore[method-assign]
        looks = [0]
        pump_all = agent.launcher.pump_all

        def counted() -> None:
            looks[0] += 1
            pump_all()

        agent.launcher.pump_all = counted  # type: ignore[method-assign]
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: queued(agent) >= OUTPUT_QUEUED_MAX, 60, "the queue to fill")
            seen = looks[0]
            await until(lambda: looks[0] >= seen + 5, 30, "five more looks at the spool")
            got["peak_stalled"] = peak[0]
            got["queued_stalled"] = queued(agent)
            release.set()
            await asyncio.wait_for(done.wait(), 120)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return got


def test_a_flooding_job_is_read_only_as_fast_as_the_master_takes_it(tmp_path: Path) -> None:
    got = asyncio.run(flood(tmp_path))
    # One more piece (READ_CHUNK, a newline escaped as two characters) past the limit at most.
    bound = OUTPUT_QUEUED_MAX + 2 * READ_CHUNK + 1024
    assert got["peak_stalled"] <= bound, got["peak_stalled"]
    assert got["queued_stalled"] >= OUTPUT_QUEUED_MAX  # it did fill (and then stopped)
    all_before_the_end(got)


async def flood_then_reconnect(tmp_path: Path) -> dict[str, Any]:
    """The first connection never reads and is cut once the job has ended; the second
    reads: the end the agent kept must come after all the output, sent again from 0."""
    import websockets

    got: dict[str, Any] = {"sha": hashlib.sha256(), "bytes": 0, "next": 0, "exited": None}
    cut, done = asyncio.Event(), asyncio.Event()
    agent: Agent | None = None

    async def serve(ws: Any) -> None:
        assert agent is not None
        hello = json.loads(await ws.recv())
        if not hello["running"]:  # the first connection
            await ws.send(encode(Welcome(heartbeat_interval=30)))
            await ws.send(FLOOD_LAUNCH)
            await cut.wait()
            ws.transport.abort()
            return
        await until(lambda: ("flood", 1) in agent._exits, 30, "the end kept for later")
        welcome = Welcome(heartbeat_interval=30, resume=[{"job_id": "flood", "epoch": 1}])
        await ws.send(encode(welcome))
        await take_output(ws, got)
        done.set()

    async with websockets.serve(serve, "127.0.0.1", 0, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        agent = Agent(
            AgentOptions("n1", "127.0.0.1", port, tmp_path / "state", 1, container_runtime="none")
        )
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: queued(agent) >= OUTPUT_QUEUED_MAX, 60, "the queue to fill")
            run = agent.launcher.find("flood")
            assert run is not None
            await asyncio.wait_for(run.exited.wait(), 60)
            cut.set()
            await asyncio.wait_for(done.wait(), 120)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return got


def test_an_end_kept_over_a_reconnect_follows_all_the_output(tmp_path: Path) -> None:
    got = asyncio.run(flood_then_reconnect(tmp_path))
    all_before_the_end(got)
