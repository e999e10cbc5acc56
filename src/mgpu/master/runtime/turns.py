"""One slice of bulk work per turn of the event loop, whoever asks.

Big requests (cancelling a 100,000-task array, listing every job) and the full scheduling
pass work a slice of a few milliseconds at a time with the loop free in between.  Several
of them at once would each run a slice in the same turn of the loop (every coroutine
resumed by `sleep(0)` runs in the next turn), so three requests made each turn three
slices long.  Between two slices they `await bulk_turn()`: it claims the next turn of the
loop that no other bulk slice has claimed, so a turn carries one slice at most, and
everything else (heartbeats, `/healthz`, small requests) runs between.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque

from mgpu.master.runtime.loop import running_loop

__all__ = ["REQUESTS_PER_TURN", "RequestTurns", "bulk_turn"]

_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def bulk_turn() -> None:
    """Let the loop run, then wait for a turn no other bulk slice has claimed and claim it
    (in place of the `sleep(0)` between two slices of synchronous bulk work)."""
    await asyncio.sleep(0)
    loop = running_loop()
    if loop is None:  # driven by hand, without a loop (tests/controller): nobody to wait for
        return
    lock = _locks.get(loop)
    if lock is None:
        lock = _locks[loop] = asyncio.Lock()
    await lock.acquire()
    loop.call_soon(lock.release)  # free again from the next turn on, not in this one


REQUESTS_PER_TURN = 16
"""HTTP requests that may begin in one turn of the event loop (a few milliseconds of work)."""


class RequestTurns:
    """At most `per_turn` HTTP requests begin in one turn of the loop; the others wait, in
    the order they came, for the next turns.

    Three hundred connections arriving at once are otherwise all handed to the app in the
    same turn: each costs well under a millisecond, but together they hold the loop for
    hundreds (nothing else runs meanwhile, heartbeats included).  Spread over turns they
    cost the same in all, and what else the loop has to do runs between.  Each is still
    answered in turn: a request that comes during such a burst waits for those before it
    (queueing, not a stall).  Made on the loop that serves the requests."""

    def __init__(self, per_turn: int = REQUESTS_PER_TURN) -> None:
        self.per_turn = per_turn
        self._used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._armed = False

    async def enter(self) -> None:
        """Return when this request may begin (at once, unless this turn is full)."""
        if self._used < self.per_turn and not self._waiters:
            self._used += 1
            self._arm()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._arm()
        await future

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn: let the next waiters begin."""
        self._armed = False
        self._used = 0
        while self._waiters and self._used < self.per_turn:
            future = self._waiters.popleft()
            if not future.done():  # its request was given up meanwhile
                future.set_result(None)
                self._used += 1
        if self._waiters or self._used:
            self._arm()
