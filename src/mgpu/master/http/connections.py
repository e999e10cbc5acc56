"""The master's HTTP connections: a deadline for each request's head, a cap per address.

uvicorn times out only a kept-alive connection's idleness, and each byte received resets
that timer; a connection that has sent nothing yet is not timed at all.  So a connection
that sends nothing, or one header byte every few seconds, is held for ever, and one local
account could hold every descriptor of the master that way.  The protocol class made here
(a subclass of the one uvicorn picks itself: httptools', else h11's) closes a connection
whose request line and headers have not all come `header_timeout` seconds after it opened,
or after its previous answer ended.  Only that phase is timed: a body, a streamed answer
(`logs -f`, `/api/wait`) and a WebSocket (handed over once its headers are in) are not.

It also refuses at once, with a 503, a connection from an address that already holds
`per_address` of them.  An upgraded connection (a WebSocket) counts no more here: an agent's
must say hello within 10 s and at most a few wait for that at once (agents.py); a client's
needs a valid token, is counted by `ClientSockets` (per address, user and job: attach.py),
and its messages are at most CLIENT_MAX_MESSAGE bytes, refused as they are parsed (1009),
never held whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from mgpu.config import MasterAddr

log = logging.getLogger("mgpu.master")


@dataclass
class ConnectionLimits:
    """`cluster.master.header_timeout` and `connections_per_address` (config.py)."""

    header_timeout: float
    per_address: int
    open: dict[str, int] = field(default_factory=dict)
    """Connections held now, per address."""
    refusing: set[str] = field(default_factory=set)
    """Addresses at the cap whose refusal was logged (once until they go below it)."""

    def take(self, address: str) -> bool:
        held = self.open.get(address, 0)
        if held >= self.per_address:
            if address not in self.refusing:
                self.refusing.add(address)
                log.warning(
                    "%s holds %d connections: more are refused until some close",
                    address,
                    held,
                )
            return False
        self.open[address] = held + 1
        return True

    def give_back(self, address: str) -> None:
        held = self.open.get(address, 0) - 1
        if held > 0:
            self.open[address] = held
        else:
            self.open.pop(address, None)
        if held < self.per_address:
            self.refusing.discard(address)


AGENT_PATH = "/api/agent"
"""The agents' WebSocket (http/agents.py); every other one is a client's."""
CLIENT_MAX_MESSAGE = 64 * 1024
"""The largest message a client sends on a WebSocket: a frame of typed input (the client
reads its terminal 64 KiB at a time; protocol.MAX_TERMINAL_INPUT), a resize, a heartbeat.
Agents' messages may be far larger (server.py's `ws_max_size`)."""


class ClientSockets:
    """The clients' WebSockets open now, counted per address, per user and per job: one
    token holder must not hold the master's descriptors (or wake its loop) thousands of
    times over.  The caps are `cluster.master.websockets_per_*` (config.py)."""

    def __init__(self) -> None:
        self.by_address: Counter[str] = Counter()
        self.by_user: Counter[str] = Counter()
        self.by_job: Counter[str] = Counter()
        self._warned: set[str] = set()
        """Caps whose refusal was logged (once until that count goes below it)."""

    def take(self, address: str, user: str, job_id: str, caps: MasterAddr) -> str | None:
        """Count one more socket, or say in one sentence why not (nothing counted)."""
        checks = [
            (self.by_address, address, caps.websockets_per_address, f"from {address}"),
            (self.by_user, user, caps.websockets_per_user, f"of user {user}"),
            (self.by_job, job_id, caps.websockets_per_job, f"to job {job_id}"),
        ]
        for counts, key, cap, whose in checks:
            if counts[key] >= cap:
                if whose not in self._warned:
                    self._warned.add(whose)
                    log.warning("%d WebSockets %s: more are refused until some close", cap, whose)
                return f"too many open attachments {whose} (at most {cap}); close some first"
        for counts, key, _, _ in checks:
            counts[key] += 1
        return None

    def give_back(self, address: str, user: str, job_id: str) -> None:
        for counts, key, whose in (
            (self.by_address, address, f"from {address}"),
            (self.by_user, user, f"of user {user}"),
            (self.by_job, job_id, f"to job {job_id}"),
        ):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
            self._warned.discard(whose)


def _upgraded_path(upgraded: Any, http: Any, args: tuple[Any, ...]) -> str | None:
    """The path of a request just upgraded to a WebSocket (None: not known).  uvicorn's
    HTTP protocols leave it out of their scope for an upgrade; the WebSocket protocol has
    it once it has read the handshake, else it is the request's target (httptools' `url`,
    h11's event)."""
    scope = getattr(upgraded, "scope", None)
    path = scope.get("path") if isinstance(scope, dict) else None
    if isinstance(path, str):
        return path
    target = getattr(args[0], "target", None) if args else getattr(http, "url", None)
    if isinstance(target, bytes):
        return target.partition(b"?")[0].decode("latin-1")
    return None


def _cap_messages(protocol: Any, limit: int) -> None:
    """Make a client WebSocket's parser refuse (1009) a message over `limit` bytes before
    it holds it: uvicorn's websockets protocols take one size for every connection."""
    conn = getattr(protocol, "conn", None)  # websockets' sans-I/O protocol (uvicorn's default)
    if conn is not None and hasattr(conn, "max_message_size"):
        conn.max_message_size = limit
    elif hasattr(protocol, "max_size"):  # websockets' legacy protocol
        protocol.max_size = limit
    # (wsproto's buffer keeps the server's size: attach.py refuses larger input itself.)


def _refusal(address: str, limit: int) -> bytes:
    detail = f"too many connections from {address} (at most {limit} at once); try again later"
    body = json.dumps({"detail": detail}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_Protocol: Any = asyncio.Protocol  # the attributes used are uvicorn's protocols'


class _Guarded(_Protocol):  # type: ignore[misc]
    """Mixed into one of uvicorn's HTTP protocols: the head deadline, the per-address cap.

    It relies on what both (httptools' and h11's) share: `transport`, `loop`, `cycle` (the
    latest request whose head is complete, replaced by each new one),
    `on_response_complete` and `handle_websocket_upgrade`."""

    limits: ConnectionLimits

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._awaited: Any = None  # `cycle` while a new request's head is awaited
        self._address: str | None = None
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) and peer else None
        if isinstance(address, str):
            if not self.limits.take(address):
                transport.write(_refusal(address, self.limits.per_address))
                transport.close()
                return
            self._address = address
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._awaited:
            self._stop_deadline()  # the head is in: the request takes as long as it needs

    def handle_websocket_upgrade(self, *args: Any) -> None:
        self._release()  # the WebSocket protocol takes the transport (and its end) over
        super().handle_websocket_upgrade(*args)
        upgraded = self.transport.get_protocol()
        path = _upgraded_path(upgraded, self, args)
        if path is not None and path != AGENT_PATH:
            _cap_messages(upgraded, CLIENT_MAX_MESSAGE)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        transport = self.transport
        if transport.is_closing() or transport.get_protocol() is not self:
            return
        if self.cycle is None or self.cycle.response_complete:
            self._await_head()  # else a pipelined request's head came already

    @property
    def head_awaited(self) -> bool:
        """Whether a request's head is awaited, timed, now."""
        return self._deadline is not None

    def _await_head(self) -> None:
        self._stop_deadline()
        self._awaited = self.cycle
        self._deadline = self.loop.call_later(self.limits.header_timeout, self._head_late)

    def _head_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _release(self) -> None:
        self._stop_deadline()
        if self._address is not None:
            self.limits.give_back(self._address)
            self._address = None


def protocol_class(
    limits: ConnectionLimits, base: type[asyncio.Protocol] = AutoHTTPProtocol
) -> type[asyncio.Protocol]:
    """The HTTP protocol class for uvicorn's `http=`, its connections held to `limits`;
    `base` is the protocol uvicorn would use itself (httptools' when installed)."""
    return type("GuardedHTTPProtocol", (_Guarded, base), {"limits": limits})
