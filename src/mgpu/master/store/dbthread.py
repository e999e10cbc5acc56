"""The database off the event loop: one thread runs a store's every statement, in order.

A PostgreSQL server that is paused (SIGSTOP, a frozen VM) or cut off does not answer, and
a statement sent to it waits as long as that lasts: TCP sees nothing wrong while the
server's kernel still acknowledges.  Run on the event loop, that wait stopped the master
whole (health checks, users' commands, agents' heartbeats).  So the store's connection
belongs to one `DbThread`, which runs what it is given one at a time, in the order given:
a write given after another commits after it (a job's states reach the database in the
order they were reached), and a read sees every write given before it.

The event loop gives work and waits for it a bounded time at most (`Later.wait`), or not
at all: the group commits hand their batch over and go on, and what waited on the write
(messages to agents, a submit's answer) follows once it is done (`Later.then`).  Work the
thread has run for longer than the store's `answer_within` makes it *stalled*: reads are
refused at once then (StoreStalled, a 503 with one sentence), and the writes given
meanwhile wait their turn, in order, for when the database answers again.  Nothing given
is dropped unless the queue is full (QUEUE_LIMIT: the writes of a long outage).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from mgpu.master.runtime.loop import running_loop
from mgpu.master.store.errors import StoreStalled

__all__ = ["QUEUE_LIMIT", "DbThread", "Later"]

log = logging.getLogger("mgpu.master")

T = TypeVar("T")

_Item = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]

QUEUE_LIMIT = 10_000
"""Pieces of work waiting for the thread at most; more are refused (StoreStalled)."""


class DbThread:
    """One thread that runs the work it is given, in order (module docstring)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._busy_since: float | None = None
        """When the work running now began (monotonic); None while idle."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def here(self) -> bool:
        """Whether the caller is this thread (its work calls the store again: run at once)."""
        return threading.current_thread() is self._thread

    def alive(self) -> bool:
        return self._thread.is_alive()

    def busy_for(self) -> float:
        """Seconds the work running now has taken so far (0 while idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def give(self, work: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue `work`; its future is done once it ran (its result, or what it raised)."""
        if self._queue.qsize() >= QUEUE_LIMIT:
            raise StoreStalled(f"{QUEUE_LIMIT} writes wait for the database: try again")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((work, future))
        return future

    def stop(self, wait: float) -> None:
        """Run what is queued (for `wait` seconds at most), then end the thread."""
        self._queue.put(None)
        if not self.here():
            self._thread.join(timeout=wait)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            work, future = item
            self._busy_since = time.monotonic()
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = work()
                    except BaseException as e:
                        future.set_exception(e)
                    else:
                        future.set_result(result)
            finally:
                self._busy_since = None


class Later(Generic[T]):
    """A write handed to the store's thread.  `after` is the store's memory of it (its
    counters, its cache of ended jobs): run once, on the event loop's thread (or the
    caller's), once the write is done, before anyone who waits on it goes on."""

    def __init__(
        self, future: concurrent.futures.Future[T], after: Callable[[], None] | None = None
    ) -> None:
        self.future = future
        self._after = after

    @staticmethod
    def now(work: Callable[[], T], after: Callable[[], None] | None = None) -> Later[T]:
        """`work` run at once, here (a store without a thread: SQLite)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(work())
        except Exception as e:
            future.set_exception(e)
        return Later(future, after)

    def _finish(self) -> T:
        result = self.future.result()  # raises what the write raised
        if self._after is not None:
            after, self._after = self._after, None
            after()
        return result

    def wait(self, timeout: float | None) -> T:
        """The write's result once it is done, waiting `timeout` seconds at most (None: as
        long as it takes); StoreStalled if it is not done by then (it still will be)."""
        try:
            self.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise StoreStalled() from None
        except Exception:
            pass  # raised by _finish
        return self._finish()

    def then(self, callback: Callable[[BaseException | None], None]) -> None:
        """`callback(None)` once the write is done (`after` run first), or
        `callback(error)`: on the running event loop's thread (at once if it is done
        already), or in whichever thread finishes it where no loop runs here."""
        loop = running_loop()

        def finish() -> None:
            try:
                self._finish()
            except BaseException as e:
                callback(e)
                return
            callback(None)

        if self.future.done() or loop is None:
            if self.future.done():
                finish()
            else:
                self.future.add_done_callback(lambda _: finish())
            return
        self.future.add_done_callback(lambda _: _on_loop(loop, finish))

    async def result(self, timeout: float | None) -> T:
        """The write's result awaited, `timeout` seconds at most (None: as long as it
        takes); StoreStalled if it is not done by then (it still will be)."""
        if not self.future.done():
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.future)), timeout)
            except TimeoutError:
                raise StoreStalled() from None
            except Exception:
                pass  # raised by _finish
        return self._finish()


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """`callback()` on `loop`'s thread: at once where the write was finished there (the
    submit lane's), else on its next turn."""
    if running_loop() is loop:
        callback()
        return
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is closed (shutdown): nobody is left to tell
        log.debug("a write finished after the event loop closed")
