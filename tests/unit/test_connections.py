"""The master's HTTP protocol (master/http/connections.py) on a fake transport: when a request's
head is awaited (timed), pipelined requests, the deadline's close, the cap per address."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from mgpu.master.http.connections import ConnectionLimits, protocol_class


class FakeTransport(asyncio.Transport):
    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer
        self.out = bytearray()
        self.closed = asyncio.Event()
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        extra = {"peername": (self.peer, 40000), "sockname": ("127.0.0.1", 8080)}
        return extra.get(name, default)

    def write(self, data: Any) -> None:
        self.out += data

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.protocol.connection_lost(None)  # a real transport calls it soon after

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol


class App:
    """Answers 200; `/gated` only once `gate` is set; `answered` counts the answers."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.answered = 0
        self.changed = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/gated":
            await self.gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        self.answered += 1
        self.changed.set()

    async def answers(self, n: int) -> None:
        while self.answered < n:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)


def request(path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: master\r\n\r\n".encode()


BASES = pytest.mark.parametrize("base", [HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])


class Master:
    def __init__(self, limits: ConnectionLimits, base: Any) -> None:
        self.app = App()
        self.config = Config(app=self.app, http=protocol_class(limits, base), lifespan="off")
        self.config.load()
        self.state = ServerState()

    def connect(self, peer: str = "127.0.0.1") -> tuple[Any, FakeTransport]:
        cls = self.config.http_protocol_class
        proto = cls(config=self.config, server_state=self.state, app_state={})
        transport = FakeTransport(peer)
        transport.protocol = proto
        proto.connection_made(transport)
        return proto, transport


@BASES
def test_a_head_is_timed_from_the_start_and_after_each_answer(base: Any) -> None:
    async def main() -> None:
        master = Master(ConnectionLimits(header_timeout=60, per_address=10), base)
        proto, _ = master.connect()
        assert proto.head_awaited
        proto.data_received(request()[:10])
        assert proto.head_awaited  # part of a head: still timed
        proto.data_received(request()[10:])
        assert not proto.head_awaited  # the request runs untimed
        await master.app.answers(1)
        assert proto.head_awaited

    asyncio.run(main())


@BASES
def test_a_pipelined_request_is_not_timed_when_the_one_before_ends(base: Any) -> None:
    async def main() -> None:
        master = Master(ConnectionLimits(header_timeout=60, per_address=10), base)
        proto, _ = master.connect()
        proto.data_received(request() + request("/gated"))
        await master.app.answers(1)
        assert not proto.head_awaited  # /gated's head came with the first: it runs
        master.app.gate.set()
        await master.app.answers(2)
        assert proto.head_awaited

    asyncio.run(main())


@BASES
def test_a_late_head_closes_the_connection(base: Any) -> None:
    async def main() -> None:
        master = Master(ConnectionLimits(header_timeout=0.05, per_address=10), base)
        _, transport = master.connect()
        await asyncio.wait_for(transport.closed.wait(), 5)
        assert not transport.out  # closed without an answer

    asyncio.run(main())


@BASES
def test_the_cap_is_per_address_and_freed_on_close(base: Any) -> None:
    async def main() -> None:
        limits = ConnectionLimits(header_timeout=60, per_address=2)
        master = Master(limits, base)
        first, _ = master.connect("10.0.0.1")
        master.connect("10.0.0.1")
        refused, transport = master.connect("10.0.0.1")
        assert transport.is_closing() and not refused.head_awaited
        assert transport.out.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"too many connections from 10.0.0.1 (at most 2 at once)" in transport.out
        _, other = master.connect("10.0.0.2")
        assert not other.is_closing()
        assert limits.open == {"10.0.0.1": 2, "10.0.0.2": 1}  # a refusal took nothing
        first.transport.close()
        assert limits.open["10.0.0.1"] == 1
        _, again = master.connect("10.0.0.1")
        assert not again.is_closing()

    asyncio.run(main())


@pytest.mark.parametrize("held", [0, 1])
def test_give_back_forgets_an_address_at_zero(held: int) -> None:
    limits = ConnectionLimits(header_timeout=1, per_address=3)
    for _ in range(held + 1):
        assert limits.take("a")
    limits.give_back("a")
    assert limits.open == ({"a": held} if held else {})
