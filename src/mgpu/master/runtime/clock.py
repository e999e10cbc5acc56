"""Time for the controller, passed in (as Kueue's `WithClock`): the real one in the master,
a fake one in the controller tests, which then run in milliseconds.

`Clock` reads the time; `Timers` runs a callback soon (the group commit at the end of an
event-loop turn) or later (jobs queued before any node joined, judged a little later).  The
real `LoopTimers` uses the running asyncio loop, and runs the callback at once when there is
none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from mgpu.master.runtime.loop import running_loop

__all__ = ["Clock", "LoopTimers", "SystemClock", "Timers"]


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch: what is stored and shown."""
        ...

    def monotonic(self) -> float:
        """Seconds for intervals (the loop's re-plan period)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class Timers(Protocol):
    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the current work is done (end of this event-loop turn)."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run `callback` after `delay` seconds."""
        ...


class LoopTimers:
    """The running asyncio loop's timers; without a loop (start-up, shutdown) at once."""

    def call_soon(self, callback: Callable[[], None]) -> None:
        loop = running_loop()
        if loop is None:
            callback()
        else:
            loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        loop = running_loop()
        if loop is None:
            callback()
        else:
            loop.call_later(delay, callback)
