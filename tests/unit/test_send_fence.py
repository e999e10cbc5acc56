"""A master whose lease ran out sends agents nothing (master/state/registry.py's AgentLink
with `may_send`, master/ha/leadership.py): what was queued is dropped, the link closed."""

from __future__ import annotations

import asyncio
from typing import Any

from mgpu.master.state.registry import AgentLink
from mgpu.protocol import Kill, Launch


class FakeWebSocket:
    def __init__(self) -> None:
        self.frames: list[str] = []
        self.closed = False

    async def send_text(self, text: str) -> None:
        self.frames.append(text)

    async def close(self, code: int = 1000, reason: Any = None) -> None:
        self.closed = True


def test_nothing_queued_goes_out_once_the_lease_ran_out() -> None:
    leading = [True]

    async def main() -> FakeWebSocket:
        ws = FakeWebSocket()
        link = AgentLink("n1", ws, may_send=lambda: leading[0])
        link.send(Kill(job_id="a1", reason="cancelled"))  # queued while it may send...
        leading[0] = False  # ...then its lease runs out before the writer runs
        writer = asyncio.create_task(link.writer())
        await asyncio.wait_for(writer, 5)
        assert link.closed
        link.send(Kill(job_id="a2", reason="cancelled"))  # dropped: the link is closed
        return ws

    ws = asyncio.run(main())
    assert ws.frames == [] and ws.closed


def test_a_send_after_the_lease_ran_out_closes_the_link() -> None:
    async def main() -> tuple[AgentLink, FakeWebSocket]:
        ws = FakeWebSocket()
        link = AgentLink("n1", ws, may_send=lambda: False)
        writer = asyncio.create_task(link.writer())
        launch = Launch.model_construct(type="launch", job_id="a1")
        link.send(launch)
        await asyncio.wait_for(writer, 5)
        return link, ws

    link, ws = asyncio.run(main())
    assert link.closed and ws.frames == [] and ws.closed


def test_a_single_master_sends_as_before() -> None:
    async def main() -> FakeWebSocket:
        ws = FakeWebSocket()
        link = AgentLink("n1", ws)
        writer = asyncio.create_task(link.writer())
        link.send(Kill(job_id="a1", reason="cancelled"))
        for _ in range(500):
            if ws.frames:
                break
            await asyncio.sleep(0.01)
        link.close()
        await asyncio.wait_for(writer, 5)
        return ws

    assert len(asyncio.run(main()).frames) == 1
