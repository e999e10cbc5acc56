"""The edge of idempotent requests (master/control/requestkeys.py): a POST that mgpu.idempotent
lists, with an `Idempotency-Key` header, is answered once per (user, key).

An ASGI middleware inside `Guard` (the asker is known, the body bounded): it reads the
request's body, lets the route answer the first time and keeps that answer (status, type,
body), and sends a request with a key seen before the kept answer without running the
route again.  A request without a key, or to another path, passes through untouched.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mgpu.idempotent import keyed
from mgpu.master.control.requestkeys import Answer, RequestKeys
from mgpu.master.control.submit import SubmitError
from mgpu.master.store.fence import Fenced

__all__ = ["RequestKeyGate"]


class RequestKeyGate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._keys: RequestKeys | None = None

    def _keys_of(self, scope: Scope) -> RequestKeys | None:
        cluster = getattr(scope["app"].state, "cluster", None)
        if cluster is None:
            return None
        if self._keys is None or self._keys.store is not cluster.store:
            self._keys = RequestKeys(cluster.store, cluster.uow)  # a new term's: its own
        return self._keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not keyed(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        key = Headers(scope=scope).get("idempotency-key")
        ident = scope.get("state", {}).get("identity")
        keys = self._keys_of(scope)
        if key is None or ident is None or keys is None:
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        asked = f"{scope['path']}?{scope.get('query_string', b'').decode()}\n{body.decode()}"
        try:
            answer = await keys.once(ident.user, key, asked, lambda: self._answer(scope, body))
        except SubmitError as e:
            answer = Answer(400, "application/json", json.dumps({"detail": str(e)}).encode())
        except Fenced as e:  # writing the answer found another master leading
            leadership = getattr(scope["app"].state, "leadership", None)
            if leadership is not None:
                leadership.deposed(str(e))  # as the app's own handler of it does
            said = {"detail": str(e), "role": "standby", "leader": None}
            answer = Answer(503, "application/json", json.dumps(said).encode())
        await _send(send, answer)

    async def _answer(self, scope: Scope, body: bytes) -> Answer:
        """The route's answer to the request, kept whole (these are small JSON)."""
        given = False
        status, media_type, parts = 500, "application/json", []

        async def replay() -> Message:
            nonlocal given
            if given:
                return {"type": "http.disconnect"}
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def keep(message: Message) -> None:
            nonlocal status, media_type
            if message["type"] == "http.response.start":
                status = int(message["status"])
                media_type = Headers(raw=message.get("headers", [])).get("content-type", media_type)
            elif message["type"] == "http.response.body":
                parts.append(bytes(message.get("body", b"")))

        await self.app(scope, replay, keep)
        return Answer(status, media_type, b"".join(parts))


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message: dict[str, Any] = dict(await receive())
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _send(send: Send, answer: Answer) -> None:
    headers = [
        (b"content-type", answer.media_type.encode("latin-1")),
        (b"content-length", str(len(answer.body)).encode()),
    ]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
