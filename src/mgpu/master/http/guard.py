"""The master's front door: who is asking, and how much they may send.

`Guard` is an ASGI middleware so that both checks happen before FastAPI reads a
request's body (it reads the body before any dependency runs): a request without a
valid token is refused at once and its body is never read; a body larger than the
route's limit is refused with 413, at once when Content-Length says so, else as soon
as the bytes received pass the limit (a chunked upload is cut there).  A refused body
of a modest size is dropped as it arrives, so the client can finish sending and read
the answer; a huge one ends the connection.

Refused logins are counted per address (`FailedLogins`) and written to the audit log
as one row per address and window, so a flood of bad tokens costs a counter, not a
database write each.  Refused agent hellos are counted the same way (`agent_refused`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mgpu.master.runtime.loop import running_loop
from mgpu.master.runtime.turns import RequestTurns
from mgpu.master.security.auth import BadTokenThrottle, Identity
from mgpu.master.store.base import RETRY_AFTER_S, StoreUnavailable

SUBMIT_BODY_LIMIT = 4 << 20
"""POST /api/jobs: a full environment and a job script fit with room to spare."""
BODY_LIMIT = 256 << 10
"""Every other route: ids, names, a step's argv."""

DRAIN_LIMIT = 16 << 20
"""A refused body up to this size is read and dropped (no memory kept) so that the client
can finish sending and read the answer; a larger one, or a chunked one, ends the
connection instead."""

OPEN_PATHS = frozenset({"/", "/healthz", "/readyz", "/metrics", "/api/ca", "/openapi.json"})
AGENT_PATH = "/api/agent"
"""The agents' WebSocket proves its join token in its hello instead."""


def client_address(conn: HTTPConnection) -> str:
    """The address a request or WebSocket comes from ("?" when the server does not say)."""
    return conn.client.host if conn.client else "?"


def is_open(path: str) -> bool:
    """Routes answered without a user token: health, metrics, the page and the CA."""
    return path in OPEN_PATHS or path.startswith(("/web/", "/docs")) or path == AGENT_PATH


def body_limit(method: str, path: str) -> int:
    # A job, or a step of an allocation: each carries its submitter's environment.
    big = path == "/api/jobs" or (path.startswith("/api/allocations/") and path.endswith("/steps"))
    big = big or (path.startswith("/api/jobs/") and path.endswith("/srun"))  # srun in a job
    return SUBMIT_BODY_LIMIT if method == "POST" and big else BODY_LIMIT


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def too_large(method: str, path: str, limit: int) -> str:
    return f"request body too large: {method} {path} takes at most {_size(limit)}"


MAX_REASONS = 5
"""Distinct reasons named in one audit row; more are summed up as "..."."""

AuditRow = tuple[str, str | None, str | None, str | None, str | None]
"""(kind, actor, address, target, detail)"""


@dataclass
class _Failures:
    count: int = 0
    path: str | None = ""
    reasons: dict[str, None] = field(default_factory=dict)  # ordered set
    more: bool = False


class FailedLogins:
    """Refused requests per address (and actor, when one is named), written as one audit
    row (`kind`) each when the window closes (or earlier, when someone reads the audit
    log)."""

    def __init__(
        self,
        write: Callable[[list[AuditRow]], None],
        window: float = 60.0,
        max_addresses: int = 10000,
        kind: str = "auth_failed",
        noun: str = "request",
    ) -> None:
        self._write = write
        self.window = window
        self.max_addresses = max_addresses
        self.kind = kind
        self.noun = noun
        self._by_address: dict[tuple[str, str | None], _Failures] = {}
        self._timer: asyncio.TimerHandle | None = None

    def failed(self, address: str, path: str | None, why: str, actor: str | None = None) -> None:
        key = (address, actor)
        if key not in self._by_address and len(self._by_address) >= self.max_addresses:
            self.flush()  # memory stays bounded whatever the number of addresses
        entry = self._by_address.setdefault(key, _Failures())
        entry.count += 1
        entry.path = path
        if why in entry.reasons or len(entry.reasons) < MAX_REASONS:
            entry.reasons[why] = None
        else:
            entry.more = True
        if self._timer is None:
            loop = running_loop()
            if loop is not None:  # else (a unit test) written on the next flush
                self._timer = loop.call_later(self.window, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._by_address:
            return
        rows: list[AuditRow] = []
        for (address, actor), f in self._by_address.items():
            noun = self.noun if f.count == 1 else f"{self.noun}s"
            why = ", ".join([*f.reasons, "..."] if f.more else f.reasons)
            rows.append((self.kind, actor, address, f.path, f"{f.count} refused {noun}: {why}"))
        self._by_address.clear()
        self._write(rows)


class Guard:
    """Authenticate (the token in `Authorization: Bearer`), then bound the body."""

    def __init__(
        self,
        app: ASGIApp,
        identify: Callable[[str | None], Identity | None],
        throttle: BadTokenThrottle,
        failures: FailedLogins,
    ) -> None:
        self.app = app
        self.identify = identify
        self.throttle = throttle
        self.failures = failures
        self.turns = RequestTurns()

    async def _authenticate(self, scope: Scope, headers: Headers) -> str | None:
        """Put the caller's identity in the scope's state; else why not (throttled)."""
        header = headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else None
        ident = self.identify(token)
        address = client_address(HTTPConnection(scope))
        if ident is None:
            delay = self.throttle.delay(address)
            self.throttle.failed(address)
            why = "no token given" if not token else "unknown or revoked token"
            self.failures.failed(address, scope["path"], why)
            if delay:
                await asyncio.sleep(delay)  # slows down guessing, costs the honest nothing
            hint = " (set $MGPU_TOKEN or ~/.config/mgpu/token)" if not token else ""
            return f"not authorised: {why}{hint}"
        self.throttle.succeeded(address)
        scope.setdefault("state", {})["identity"] = ident
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not is_open(scope["path"]):
            # A client's WebSocket (a terminal, an allocation): the same token, refused
            # with an HTTP answer before the upgrade.
            refusal = await self._authenticate(scope, Headers(scope=scope))
            if refusal is not None:
                await receive()  # websocket.connect
                if "websocket.http.response" not in scope.get("extensions", {}):
                    await send({"type": "websocket.close", "code": 1008})  # a bare 403
                    return
                body = json.dumps({"detail": refusal}).encode()
                start = {"type": "websocket.http.response.start", "status": 401}
                start["headers"] = [(b"content-type", b"application/json")]
                await send(start)
                await send({"type": "websocket.http.response.body", "body": body})
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.turns.enter()  # a burst of requests is spread over turns of the loop
        headers = Headers(scope=scope)
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            declared = int(headers.get("content-length", "0"))
        except ValueError:
            declared = 0
        # After a refusal, a body still on its way is either dropped as it comes (uvicorn
        # discards what arrives after the answer) or, when big or of unknown size, cut off.
        cut_off = declared > DRAIN_LIMIT or "transfer-encoding" in headers
        if not is_open(path):
            try:
                refusal = await self._authenticate(scope, headers)
            except StoreUnavailable as e:  # a token not seen yet, the database away
                await _refuse(send, 503, str(e), close=cut_off, retry_after=True)
                return
            if refusal is not None:
                await _refuse(send, 401, refusal, close=cut_off)
                return
        limit = body_limit(method, path)
        if declared > limit:
            await _refuse(send, 413, too_large(method, path, limit), close=cut_off)
            return
        received = 0
        cut = False

        async def limited_receive() -> Message:
            nonlocal received, cut
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    cut = True  # FastAPI answers an HTTPException raised here as it is
                    raise HTTPException(413, too_large(method, path, limit))
            return message

        async def closing_send(message: Message) -> None:
            if cut and message["type"] == "http.response.start":
                # The rest of the upload is not wanted: end the connection after the 413.
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        await self.app(scope, limited_receive, closing_send)


async def _refuse(
    send: Send, status: int, detail: str, close: bool, retry_after: bool = False
) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:
        headers.append((b"connection", b"close"))
    if retry_after:
        headers.append((b"retry-after", b"%d" % RETRY_AFTER_S))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
