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

__all__ = ["bulk_turn"]

_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def bulk_turn() -> None:
    """Let the loop run, then wait for a turn no other bulk slice has claimed and claim it
    (in place of the `sleep(0)` between two slices of synchronous bulk work)."""
    await asyncio.sleep(0)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # driven by hand, without a loop (tests/controller): nobody to wait for
        return
    lock = _locks.get(loop)
    if lock is None:
        lock = _locks[loop] = asyncio.Lock()
    await lock.acquire()
    loop.call_soon(lock.release)  # free again from the next turn on, not in this one
