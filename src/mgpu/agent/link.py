"""The agent's WebSocket to one master: opened in TLS or plain as `mgpu.masters.Transport`
says, never redirected, and a standby's refusal (503 at the handshake) read for its hint.

Which master to dial, and whether a hint may be followed, is `mgpu.masters.Search`'s."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import websockets
from websockets.asyncio.client import connect

from mgpu.masters import Transport, leader_elsewhere

MULTI_OPEN_TIMEOUT = 3.0
"""Seconds for one master of several to answer the handshake (a stopped one accepts the
connection and says nothing) before the next is dialled."""
PING_INTERVAL = 1.0
PING_TIMEOUT = 3.0
"""With several masters, the link is pinged: a leader that answers no ping this long is
left for the others (with one master: no pings, as before)."""
CLOSE_TIMEOUT = 1.0
"""With several masters, seconds to wait for the other side's close frame (a stopped
leader sends none) before the link is dropped."""


class StandbyMaster(ConnectionError):
    """The master dialled is a standby (503 at the handshake); `leader`: its hint."""

    def __init__(self, message: str, leader: str | None) -> None:
        super().__init__(message)
        self.leader = leader


class _Unredirected(connect):
    """A master never redirects its agents: a 3xx is a failed dial, not a new address (a
    redirect would carry the link, and the hello after it, wherever it points)."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def open_link(url: str, ssl: Any, several: bool) -> _Unredirected:
    """`async with open_link(...) as ws`: the WebSocket to the master at `url` (`ssl`: the
    context verifying the cluster's CA, or None for plain); with several masters, pinged
    and quick to give up, so that a stopped leader is left within seconds."""
    return _Unredirected(
        url,
        max_size=64 * 1024 * 1024,
        open_timeout=MULTI_OPEN_TIMEOUT if several else 10,
        ping_interval=PING_INTERVAL if several else None,
        ping_timeout=PING_TIMEOUT if several else None,
        close_timeout=CLOSE_TIMEOUT if several else 10,
        compression=None,
        ssl=ssl,
    )


def said_nothing(error: BaseException) -> bool:
    """The master went silent: it never answered the handshake, or stopped answering the
    link's pings (a frozen master keeps the connection open and says nothing)."""
    if isinstance(error, TimeoutError):
        return True
    if not isinstance(error, websockets.ConnectionClosed) or error.sent is None:
        return False
    return error.rcvd is None and error.sent.reason == KEEPALIVE_TIMEOUT


KEEPALIVE_TIMEOUT = "keepalive ping timeout"
"""The reason websockets closes a link with when its pings go unanswered."""


def standby_refusal(error: websockets.InvalidStatus, where: str) -> StandbyMaster | None:
    """The StandbyMaster a refused handshake means (a 503), else None."""
    response = error.response
    if response.status_code != 503:
        return None
    leader = _standby_leader(response.body, response.headers.get("X-Mgpu-Leader"))
    said = f"the leader is {leader}" if leader else "no leader yet"
    return StandbyMaster(f"the master at {where} is a standby; {said}", leader)


def _standby_leader(body: bytes | bytearray | None, header: str | None) -> str | None:
    """Where a standby's 503 says the leader is: its JSON `leader`, else the header."""
    try:
        leader = json.loads(body or b"{}").get("leader")
    except (ValueError, AttributeError):
        leader = None
    return leader if isinstance(leader, str) and leader else (header or None)


_ip_cache: dict[str, str] = {}


def ip_towards(host: str) -> str:
    """The local address this machine uses to reach `host` (what others can reach us at)."""
    ip = _ip_cache.get(host)
    if ip is None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, 9))
                ip = str(s.getsockname()[0])
        except OSError:
            ip = "127.0.0.1"
        _ip_cache[host] = ip
    return ip


WATCH_EVERY = 2.0
"""Seconds between two askings of the other masters, with several, whether one leads now."""


async def watch_leader(
    here: tuple[str, int],
    masters: list[tuple[str, int]],
    transport: Transport,
    context: Any,
    ws: Any,
) -> tuple[str, int]:
    """With several masters, while linked to `here`: ask the others' `/readyz` every
    WATCH_EVERY seconds; once one leads (`here` was deposed: cut off from the database, or
    stopped and found out), close the link `ws` and say which.  A master out of its lease
    keeps such an agent (it lets others go): through a paused database, when none leads,
    the agent stays, and its node is shown connected."""
    while True:
        await asyncio.sleep(WATCH_EVERY)
        leader = await asyncio.to_thread(leader_elsewhere, masters, here, transport, context)
        if leader is not None:
            await ws.close()
            return leader
