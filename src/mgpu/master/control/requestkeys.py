"""Idempotent job control and steps: a request sent again with its key is answered once.

A client whose cancel (hold, release, requeue, update, signal; a step's start or cancel;
an allocation's end) lost its answer sends it again with the same `Idempotency-Key`
(mgpu.idempotent lists the requests).  Without the key the second one would be done again:
a second step started, or a cancel answered "already ended" where the first said
"cancelled".  With it, the first answer is stored (`request_keys`, by user and key) right
after the request was done, and a request with a key seen before gets that answer, from
this master or, after a failover, from the one that took over; one still being answered
here is waited for.  The key names one request: sent with another path or body it is
refused.  Keys are forgotten after a day (control/retention.py), as submits' are.

A key is one user's (looked up by user and key): another user's same key is their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mgpu.master.control.submit import SubmitError
from mgpu.master.control.submitkeys import KEY_PATTERN
from mgpu.master.store.base import Store

__all__ = ["Answer", "RequestKeys"]


@dataclass(frozen=True)
class Answer:
    """A request's answer as it was sent: its status, content type and body."""

    status: int
    media_type: str
    body: bytes


class RequestKeys:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._in_flight: dict[tuple[str, str], tuple[str, asyncio.Future[Answer]]] = {}
        """(user, key) of the requests being answered here: what they asked, the answer."""

    async def once(
        self, user: str, key: str, asked: str, answer: Callable[[], Awaitable[Answer]]
    ) -> Answer:
        """The answer of `user`'s request with this key: the first one's (stored, or being
        made here), or `answer()`'s now.  `asked`: the request (its path and body, hashed
        here); the same key with another is refused (SubmitError)."""
        if not KEY_PATTERN.fullmatch(key):
            raise SubmitError("Idempotency-Key: 8 to 128 letters, digits or '_.:-'")
        digest = hashlib.sha256(asked.encode(errors="surrogatepass")).hexdigest()
        if (first := self._in_flight.get((user, key))) is not None:
            _same(first[0], digest)
            return await asyncio.shield(first[1])
        stored = self.store.request_answer(user, key)
        if stored is not None:
            record = json.loads(stored)
            _same(str(record["asked"]), digest)
            return Answer(int(record["status"]), str(record["type"]), record["body"].encode())
        running: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._in_flight[user, key] = (digest, running)
        try:
            made = await answer()
            if made.status < 500:  # done, or refused for good: not a master that failed
                record = {
                    "asked": digest,
                    "status": made.status,
                    "type": made.media_type,
                    "body": made.body.decode(errors="replace"),
                }
                self.store.save_request_answer(user, key, json.dumps(record))
        except BaseException as e:
            running.set_exception(e if isinstance(e, Exception) else SubmitError(str(e)))
            running.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            self._in_flight.pop((user, key), None)
        running.set_result(made)
        return made


def _same(first: str, digest: str) -> None:
    if first != digest:
        raise SubmitError("this Idempotency-Key was sent with another request")
