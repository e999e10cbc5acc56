"""A master whose lease ran out sends agents nothing (master/state/registry.py's AgentLink
with `may_send`, master/ha/leadership.py): what was queued is dropped, the link closed.
To an agent that watches for the leader itself, a master only out of its lease (`may_hold`:
a paused database) holds what it sends until the lease is renewed, and drops it with the
link once it learns it was deposed."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers import until
from mgpu.master.state.registry import HOLD_POLL, AgentLink
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
        await until(lambda: ws.frames, 5, "the message sent")
        link.close()
        await asyncio.wait_for(writer, 5)
        return ws

    assert len(asyncio.run(main()).frames) == 1


async def _held_a_while(link: AgentLink) -> None:
    """Until the writer has taken what was queued, then four of its looks at the lease."""
    await until(link.outbox.empty, 5, "the writer to take the messages")
    await asyncio.sleep(HOLD_POLL * 4)


def _watching_link(ws: FakeWebSocket, sending: list[bool], holding: list[bool]) -> AgentLink:
    link = AgentLink("n1", ws, may_send=lambda: sending[0], may_hold=lambda: holding[0])
    link.watches_leader = True
    return link


def test_a_watching_agents_messages_wait_for_the_lease_to_be_renewed() -> None:
    sending, holding = [False], [True]  # out of its lease: the database paused

    async def main() -> tuple[AgentLink, FakeWebSocket]:
        ws = FakeWebSocket()
        link = _watching_link(ws, sending, holding)
        writer = asyncio.create_task(link.writer())
        link.send(Kill(job_id="a1", reason="cancelled"))
        link.send(Kill(job_id="a2", reason="cancelled"))
        await _held_a_while(link)  # the writer has taken them and waits: nothing out, open
        assert ws.frames == [] and not link.closed and not ws.closed
        sending[0], holding[0] = True, False  # renewed
        await until(lambda: ws.frames, 5, "sent once the lease was renewed")
        link.close()
        await asyncio.wait_for(writer, 5)
        return link, ws

    _, ws = asyncio.run(main())
    sent = "".join(ws.frames)
    assert '"a1"' in sent and '"a2"' in sent and sent.index('"a1"') < sent.index('"a2"')


def test_held_messages_are_dropped_with_the_link_once_the_master_was_deposed() -> None:
    sending, holding = [False], [True]

    async def main() -> tuple[AgentLink, FakeWebSocket]:
        ws = FakeWebSocket()
        link = _watching_link(ws, sending, holding)
        writer = asyncio.create_task(link.writer())
        link.send(Kill(job_id="a1", reason="cancelled"))
        await _held_a_while(link)
        assert not link.closed
        holding[0] = False  # another master took the lease: this one may not wait any more
        await asyncio.wait_for(writer, 5)
        return link, ws

    link, ws = asyncio.run(main())
    assert link.closed and ws.frames == [] and ws.closed


def test_an_agent_that_does_not_watch_for_the_leader_is_let_go_at_once() -> None:
    async def main() -> tuple[AgentLink, FakeWebSocket]:
        ws = FakeWebSocket()
        link = AgentLink("n1", ws, may_send=lambda: False, may_hold=lambda: True)
        writer = asyncio.create_task(link.writer())
        link.send(Kill(job_id="a1", reason="cancelled"))
        await asyncio.wait_for(writer, 5)
        return link, ws

    link, ws = asyncio.run(main())
    assert link.closed and ws.frames == [] and ws.closed
