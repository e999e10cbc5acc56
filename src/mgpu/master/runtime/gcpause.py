"""The cyclic garbage collector and the master's long-lived state.

With 100,000 jobs in memory a full collection walks millions of objects (hundreds of
milliseconds, the event loop held all along), although none of them is garbage: jobs are
freed by reference counting when they leave memory.  `gc.freeze()` moves what exists into
the permanent generation that collections skip; the master calls it once its state is
loaded and after any submit that added many jobs.  Collections that still take long are
logged (`watch`), so a regression shows.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("mgpu.master")

__all__ = ["BULK", "YOUNG", "after_bulk", "freeze", "paused", "tune", "watch"]

BULK = 10_000
"""A submit of at least this many jobs freezes them (and what else is long-lived)."""
SLOW = 0.05
"""A collection that takes longer is logged (seconds)."""
YOUNG = 10_000
"""Allocations between two collections of the youngest generation (CPython's default is
700).  A job's way through the master (a request, its validation, the store's records, the
agent's messages) allocates thousands of objects, and each young collection also walks the
containers a pass or a request holds at that moment (lists over 1,000 nodes' views): at
1,000 simulated nodes the default collected ~100 times in 2,000 jobs, 0.11-0.13 ms of CPU
a job (bench/swarm.py), this about twice, 0.02-0.05 ms a job.  Garbage without cycles is
freed by reference counting whatever this is; only cyclic garbage waits a little longer."""

_started: list[float] = []
slowest = 0.0
"""The longest collection seen since `watch` (seconds)."""


_pausing = 0
_enable_after = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection while many long-lived objects are made (a big array's tasks,
    built a slice at a time with the loop free between): each slice would be promoted and
    walked by the full collections it triggers, hundreds of milliseconds each.  Other
    coroutines run meanwhile; what cycles they leave is collected once this is over.
    Nests (two big submits at once): the collector resumes when the last one ends."""
    global _pausing, _enable_after
    if _pausing == 0:
        _enable_after = gc.isenabled()
        gc.disable()
    _pausing += 1
    try:
        yield
    finally:
        _pausing -= 1
        if _pausing == 0 and _enable_after:
            gc.enable()


def freeze() -> None:
    gc.freeze()


def tune() -> None:
    """Collect the youngest generation every YOUNG allocations (the older ones as before)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)


def after_bulk(count: int) -> None:
    if count >= BULK:
        gc.freeze()


def _timer(phase: str, info: dict[str, Any]) -> None:
    global slowest
    if phase == "start":
        _started[:] = [time.perf_counter()]
        return
    if not _started:
        return
    took = time.perf_counter() - _started.pop()
    slowest = max(slowest, took)
    if took > SLOW:
        log.warning(
            "garbage collection of generation %s took %.0f ms (%d objects frozen)",
            info.get("generation"),
            took * 1000,
            gc.get_freeze_count(),
        )


def watch() -> None:
    """Time every collection (once per process)."""
    if _timer not in gc.callbacks:
        gc.callbacks.append(_timer)
