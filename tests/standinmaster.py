"""A real node agent run against a stand-in master: a WebSocket handler the test writes,
served on loopback, until the test's `done` event (tests/e2e/test_agent_launch.py,
test_run_limits.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu.agent.agent import Agent, AgentOptions

__all__ = ["agent_served_until"]


async def agent_served_until(
    serve: Any,
    done: asyncio.Event,
    tmp_path: Path,
    timeout: float = 30,
    after: Callable[[Agent], None] | None = None,
) -> Agent:
    """Run a real agent against the stand-in master `serve` until `done` (`timeout` seconds
    at most); `after(agent)` once it is stopped, whether `done` came or not."""
    import websockets

    async with websockets.serve(serve, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        agent = Agent(
            AgentOptions("n1", "127.0.0.1", port, tmp_path / "state", 1, container_runtime="none")
        )
        task = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if after is not None:
                after(agent)
    return agent
