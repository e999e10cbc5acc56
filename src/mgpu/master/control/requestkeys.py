"""Idempotent job control and steps: a request sent again with its key is answered once.

A client whose cancel (hold, release, requeue, update, signal; a step's start or cancel;
an allocation's end) lost its answer sends it again with the same `Idempotency-Key`
(mgpu.idempotent lists the requests).  Without the key the second one would be done again:
a second step started, or a cancel answered "already ended" where the first said
"cancelled".  With it, the first answer is stored (`request_keys`, by user and key) in
the transaction that writes what the request did (state/keyhold.py: the route's change is
held for its answer), and a request with a key seen before gets that answer, from this
master or, after a failover, from the one that took over; one still being answered here
is waited for.  The key names one request: sent with another path or body it is
refused.  Keys are forgotten after a day (control/retention.py), as submits' are.

A key is one user's (looked up by user and key): another user's same key is their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mgpu.master.control.submit import SubmitError
from mgpu.master.control.submitkeys import KEY_PATTERN
from mgpu.master.state.keyhold import HELD, KeyHold
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.master.store.base import Store, StoreUnavailable

__all__ = ["Answer", "RequestKeys"]


@dataclass(frozen=True)
class Answer:
    """A request's answer as it was sent: its status, content type and body."""

    status: int
    media_type: str
    body: bytes


class RequestKeys:
    def __init__(self, store: Store, uow: UnitOfWork) -> None:
        self.store = store
        self.uow = uow
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
        hold = KeyHold(user, key)
        try:
            made = await self._held(hold, answer)
            kept = None
            if made.status < 500:  # done, or refused for good: not a master that failed
                record = {
                    "asked": digest,
                    "status": made.status,
                    "type": made.media_type,
                    "body": made.body.decode(errors="replace"),
                }
                kept = json.dumps(record)
            try:
                self.uow.flush_answer(hold, kept)  # with what the request did
            except StoreUnavailable as e:  # neither is stored (yet): the client asks again
                made = Answer(503, "application/json", json.dumps({"detail": str(e)}).encode())
        except BaseException as e:
            running.set_exception(e if isinstance(e, Exception) else SubmitError(str(e)))
            running.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            self._in_flight.pop((user, key), None)
        running.set_result(made)
        return made

    async def _held(self, hold: KeyHold, answer: Callable[[], Awaitable[Answer]]) -> Answer:
        """`answer()` with its user's change held for the answer (state/keyhold.py); should
        it fail, what it changed is written all the same, without an answer."""
        token = HELD.set(hold)
        try:
            return await answer()
        except BaseException:
            if hold.open:
                with contextlib.suppress(Exception):
                    self.uow.flush_answer(hold, None)
            raise
        finally:
            HELD.reset(token)


def _same(first: str, digest: str) -> None:
    if first != digest:
        raise SubmitError("this Idempotency-Key was sent with another request")
