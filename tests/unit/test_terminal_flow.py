"""Flow control of typed input on the node, and the count of clients' WebSockets.

The agent's `Terminal` acknowledges every byte of typed input once it has left (written to
the pty, or dropped), a few KiB at a time, so the master's window for that terminal
refills; dropped input is logged at most every WARN_EVERY seconds, with a count.  The
master's `ClientSockets` refuses a WebSocket past its address's, user's or job's cap, with
one sentence, and gives each back."""

from __future__ import annotations

import asyncio
import logging
import os
import tty
from pathlib import Path

import pytest

from mgpu.agent import terminal as terminal_mod
from mgpu.agent.terminal import DropLog, Terminal
from mgpu.config import MasterAddr
from mgpu.master.http.connections import ClientSockets, _upgraded_path
from mgpu.protocol import TERMINAL_ACK_EVERY

# ---- the agent's terminal ----------------------------------------------------------


def _terminal(tmp_path: Path) -> tuple[Terminal, int]:
    out = tmp_path / "out"
    out.touch()
    return Terminal.open(24, 80, None, out)


def _read_all(fd: int, n: int) -> bytes:
    got = b""
    while len(got) < n:
        got += os.read(fd, n - len(got))
    return got


def test_input_is_acknowledged_as_it_reaches_the_pty(tmp_path: Path) -> None:
    total = 100 + 4 * TERMINAL_ACK_EVERY

    async def main() -> tuple[list[int], bytes]:
        term, slave = _terminal(tmp_path)
        tty.setraw(slave)  # the program reads bytes as they come, no line discipline
        acks: list[int] = []
        try:
            term.write(b"x" * 100, acks.append)
            assert acks == []  # a few bytes: acknowledged with more, later
            reading = asyncio.create_task(asyncio.to_thread(_read_all, slave, total))
            term.write(b"y" * (total - 100), acks.append)  # more than the pty takes at once
            got = await asyncio.wait_for(reading, 30)
        finally:
            term.close()
            os.close(slave)
        return acks, got

    acks, got = asyncio.run(main())
    assert got == b"x" * 100 + b"y" * (total - 100)
    # Acknowledged a step at a time, as the program read: all but less than a step.
    assert all(n >= TERMINAL_ACK_EVERY for n in acks[:-1])
    assert 0 <= total - sum(acks) < TERMINAL_ACK_EVERY


def test_input_still_waiting_is_acknowledged_when_the_terminal_closes(tmp_path: Path) -> None:
    async def main() -> list[int]:
        term, slave = _terminal(tmp_path)
        acks: list[int] = []
        # A program that never reads: the pty's buffer fills, the rest waits in the agent.
        for _ in range(16):
            term.write(b"z" * 65536, acks.append)
        written = sum(acks)
        term.close()
        os.close(slave)
        assert sum(acks) > written  # what still waited was given back at the close
        return acks

    assert sum(asyncio.run(main())) == 16 * 65536


def test_input_past_the_agents_buffer_is_dropped_acknowledged_and_logged_rarely(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(terminal_mod, "MAX_PENDING_INPUT", 64 * 1024)

    async def main() -> list[int]:
        term, slave = _terminal(tmp_path)
        acks: list[int] = []
        try:
            for _ in range(200):  # 12.5 MiB at a program that never reads
                term.write(b"q" * 65536, acks.append)
        finally:
            term.close()
            os.close(slave)
        return acks

    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        acks = asyncio.run(main())
    assert sum(acks) == 200 * 65536  # dropped bytes refill the master's window too
    warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_dropped_input_is_logged_once_a_period_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    drops = DropLog("terminal /dev/pts/9", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        for _ in range(1000):
            drops.dropped(100)
            now[0] += 0.1  # 100 s in all
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4  # at 0, 30, 60 and 90 s
    assert "100 bytes dropped (1 times) since it started" in lines[0]
    assert "30000 bytes dropped (300 times) since the last warning" in lines[1]


# ---- clients' WebSockets on the master ---------------------------------------------------

CAPS = MasterAddr(websockets_per_address=5, websockets_per_user=4, websockets_per_job=3)


def test_a_jobs_cap_then_a_users_then_an_addresss() -> None:
    sockets = ClientSockets()
    for _ in range(3):
        assert sockets.take("10.0.0.1", "alice", "7", CAPS) is None
    refusal = sockets.take("10.0.0.1", "alice", "7", CAPS)
    assert refusal == "too many open attachments to job 7 (at most 3); close some first"
    assert sockets.take("10.0.0.1", "alice", "8", CAPS) is None  # user at 4 now
    assert "of user alice (at most 4)" in str(sockets.take("10.0.0.2", "alice", "9", CAPS))
    assert sockets.take("10.0.0.1", "bob", "9", CAPS) is None  # the address at 5 now
    assert "from 10.0.0.1 (at most 5)" in str(sockets.take("10.0.0.1", "carol", "10", CAPS))
    assert sockets.take("10.0.0.2", "carol", "10", CAPS) is None  # another address
    # A refusal counts nothing; each close gives its three counts back.
    assert dict(sockets.by_job) == {"7": 3, "8": 1, "9": 1, "10": 1}
    sockets.give_back("10.0.0.1", "alice", "7")
    assert sockets.take("10.0.0.1", "alice", "7", CAPS) is None
    for address, user, job in [("10.0.0.1", "alice", "7")] * 3 + [
        ("10.0.0.1", "alice", "8"),
        ("10.0.0.1", "bob", "9"),
        ("10.0.0.2", "carol", "10"),
    ]:
        sockets.give_back(address, user, job)
    assert not sockets.by_address and not sockets.by_user and not sockets.by_job


def test_a_refusal_is_logged_once_until_the_count_goes_below_its_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sockets = ClientSockets()
    with caplog.at_level(logging.WARNING, logger="mgpu.master"):
        for _ in range(3):
            sockets.take("10.0.0.1", "alice", "7", CAPS)
        for _ in range(100):
            assert sockets.take("10.0.0.1", "alice", "7", CAPS) is not None
        sockets.give_back("10.0.0.1", "alice", "7")
        sockets.take("10.0.0.1", "alice", "7", CAPS)
        assert sockets.take("10.0.0.1", "alice", "7", CAPS) is not None
    assert len([r for r in caplog.records if "to job 7" in r.getMessage()]) == 2


def test_the_path_of_an_upgraded_request_whichever_protocol_has_it() -> None:
    class Has:
        def __init__(self, **fields: object) -> None:
            self.__dict__.update(fields)

    sans_io = Has(scope={"path": "/api/agent"})
    assert _upgraded_path(sans_io, Has(), ()) == "/api/agent"
    httptools = Has(url=b"/api/jobs/7/attach?since=0")
    assert _upgraded_path(Has(), httptools, ()) == "/api/jobs/7/attach"
    h11_event = Has(target=b"/api/agent")
    assert _upgraded_path(Has(), Has(), (h11_event,)) == "/api/agent"
    assert _upgraded_path(Has(), Has(), ()) is None  # unknown: not capped (the route checks)
