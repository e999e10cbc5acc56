"""Which event loop, if any, runs on the calling thread.

The store and the unit of work are called both from the master's event loop and from
places without one (their threads, the controller tests, tools): on the loop they must
not block and hand their waits to it; elsewhere they may wait.  `running_loop` is the one
question they ask.
"""

from __future__ import annotations

import asyncio

__all__ = ["running_loop"]


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread (None: none runs here)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
