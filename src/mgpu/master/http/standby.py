"""A master that does not lead answers 503 and says where the leader is.

Several masters on one database (master/ha): only the leader has a controller.  Every other
master, and the leader while it is still opening the cluster, answers every route but
`/healthz`, `/readyz`, `/metrics` and `/api/ca` with 503 and
`{"detail": ..., "role": ..., "leader": "HOST:PORT" | null}` and the header
`X-Mgpu-Leader: HOST:PORT` when it knows the leader; a WebSocket (an agent's link, a
terminal) is refused at its handshake with the same answer, so the peer sees an HTTP 503
and tries the leader.  The gate is the outermost middleware: nothing behind it (the token
check included) runs on a master that has no controller.

A leader whose lease ran out by its own clock (its database does not answer it) still
answers from its memory, the best answer while the database is paused; but it may be cut
off alone while another master leads, so its answers say so (`X-Mgpu-Lease: lapsed`): a
client that knows other masters asks them whether one leads (mgpu.client.session).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mgpu.master.ha.leadership import Leadership

__all__ = ["LAPSED_HEADER", "LEADER_HEADER", "OPEN_ON_STANDBY", "StandbyGate", "standby_answer"]

OPEN_ON_STANDBY = frozenset({"/healthz", "/readyz", "/metrics", "/api/ca"})
LEADER_HEADER = "X-Mgpu-Leader"
LAPSED_HEADER = "X-Mgpu-Lease"
"""`lapsed` on the answers of a leader whose lease ran out (see the module's text)."""


def standby_answer(leadership: Leadership) -> tuple[dict[str, str | None], list[tuple[str, str]]]:
    """The 503's body and headers."""
    leader = leadership.leader
    if leadership.leading:
        detail = "this master leads but is still opening the cluster; try again in a moment"
    elif leader:
        detail = f"this master is a standby; the leader is {leader}"
    else:
        detail = "this master is a standby; no leader yet"
    headers = [("retry-after", "1")]
    if leader:
        headers.append((LEADER_HEADER.lower(), leader))
    return {"detail": detail, "role": leadership.role, "leader": leader}, headers


class StandbyGate:
    def __init__(self, app: ASGIApp, leadership: Leadership) -> None:
        self.app = app
        self.leadership = leadership

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.leadership.serving
            or scope["type"] not in ("http", "websocket")
            or scope["path"] in OPEN_ON_STANDBY
        ):
            if scope["type"] == "http" and self.leadership.lapsed():
                send = _marked(send)
            await self.app(scope, receive, send)
            return
        body, extra = standby_answer(self.leadership)
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
        headers += [(k.encode(), v.encode()) for k, v in extra]
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1013})  # try again later
                return
            start = {"type": "websocket.http.response.start", "status": 503, "headers": headers}
            await send(start)
            await send({"type": "websocket.http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _marked(send: Send) -> Send:
    """`send` with the lapsed lease's header on the answer's start."""

    async def marked(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (b"x-mgpu-lease", b"lapsed")]
            message = {**message, "headers": headers}
        await send(message)

    return marked
