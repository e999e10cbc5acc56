"""Submits' writes on the event loop, through psycopg's asynchronous connection.

A submit is answered once its job is committed, so its user waits for the write's whole
journey.  Through the store's threads (dbthread.py) that journey has two hand-overs more
than the round trip: the loop wakes a thread, which must get the interpreter's lock from
a loop that is busy with the cluster's other work, and the thread wakes the loop again.
On a busy master they cost more than the database does.  The submits' rows do not need a
thread: psycopg's `AsyncConnection` sends the statement and lets the loop wait on the
socket, so the loop is free meanwhile (a paused database stalls no one) and the answer
is taken up on the loop's next turn.

`SubmitLane` writes what it is given in order, one write at a time, on a connection of
its own: the rows as one statement (pgwith.py) with the fence's check, or the statements
one by one in a transaction where one statement would not do.  As the store's threads,
it reconnects and writes again while the database is unreachable, for up to `retry_for`
seconds, and never retries a write the fence refused.  A write running for longer than
`answer_within` makes the store stalled (`busy_for`), as a thread's does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import psycopg

from mgpu.master.runtime.loop import running_loop
from mgpu.master.store.base import StoreUnavailable
from mgpu.master.store.fence import LEASE_TABLE, Fence, Fenced
from mgpu.master.store.pgretry import Unreachable, lost
from mgpu.master.store.pgwith import Parts, statement

__all__ = ["SubmitLane"]


class SubmitLane:
    """Writes of rows on the running event loop, in the order given (module docstring)."""

    def __init__(
        self,
        connect: Callable[[], dict[str, Any]],
        fence: Callable[[], Fence],
        retry_for: float,
        where: str,
        keyed: Callable[[Exception], Exception],
    ) -> None:
        self._params = connect
        """The connection's keyword arguments (pglink.params)."""
        self._fence = fence
        """The store's fence as it is now (the master sets it once it leads)."""
        self._retry_for, self._where = retry_for, where
        self._keyed = keyed
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tail: asyncio.Task[None] | None = None
        """The last write given: the next one starts once it ended."""
        self._pending: set[asyncio.Task[None]] = set()
        self._busy_since: float | None = None
        self._closed = False

    def serves(self) -> bool:
        """Whether a write given now can go this way (the caller runs the event loop)."""
        return running_loop() is not None

    def give(self, parts: Parts) -> concurrent.futures.Future[None]:
        """Write `parts` (an INSERT with `%s` placeholders, its rows) in one transaction,
        after the writes given before; the future is done once it committed (or failed:
        Fenced, StoreUnavailable, KeyTaken through `keyed`, the database's error)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # another loop (a test's): its own connection
            self._drop()
            self._loop, self._tail = loop, None
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        if self._closed:
            future.set_exception(StoreUnavailable("the store is closed"))
            return future
        self._tail = loop.create_task(self._after(self._tail, parts, future))
        self._pending.add(self._tail)
        self._tail.add_done_callback(self._pending.discard)
        return future

    def busy_for(self) -> float:
        """Seconds the write running now has taken so far (0 while idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def close(self) -> None:
        """Stop writing: what is still given fails (cancelled); the connection is closed."""
        self._closed = True
        for task in list(self._pending):
            task.cancel()
        self._tail = None
        self._drop()

    async def _after(
        self,
        before: asyncio.Task[None] | None,
        parts: Parts,
        future: concurrent.futures.Future[None],
    ) -> None:
        started = False
        try:
            if before is not None and not before.done():
                await asyncio.wait([before])  # its outcome is its own caller's
            self._busy_since, started = time.monotonic(), True
            await self._write(parts)
        except Exception as e:
            future.set_exception(self._keyed(e))
        except BaseException as e:  # cancelled (the store closed): nothing more is written
            future.set_exception(e)
            raise
        else:
            future.set_result(None)
        finally:
            if started:
                self._busy_since = None

    async def _write(self, parts: Parts) -> None:
        """`parts` in one transaction after the fence's check, again on a new connection
        while the database is unreachable (up to retry_for)."""
        tries = Unreachable(self._where, self._retry_for)
        while True:
            conn = self._conn
            try:
                if conn is None or conn.closed or conn.broken:
                    self._drop()
                    conn = self._conn = await psycopg.AsyncConnection.connect(
                        autocommit=True, **self._params()
                    )
                await self._rows(conn, parts)
                return
            except psycopg.Error as e:
                if self._fence().refused(e):
                    raise await self._deposed(conn) from None
                if not lost(conn, e):
                    raise
                pause = tries.pause(e)
                self._drop()
                await asyncio.sleep(pause)

    async def _rows(self, conn: psycopg.AsyncConnection[Any], parts: Parts) -> None:
        check = self._fence().statement()  # Fenced at once once a check failed
        one = statement(parts, check)
        if one is not None:
            await conn.execute(one[0], one[1])
            return
        async with conn.transaction(), conn.cursor() as cur:
            if check is not None:
                await cur.execute(check)
            for sql, rows in parts:
                for row in rows:
                    await cur.execute(sql, row)

    async def _deposed(self, conn: psycopg.AsyncConnection[Any] | None) -> Fenced:
        """The fence refused the write: this master steps down (which generation leads
        now, where the connection still says)."""
        leading = None
        if conn is not None:
            try:
                cur = await conn.execute(f"SELECT generation FROM {LEASE_TABLE} WHERE id = 1")
                row = await cur.fetchone()
                leading = None if row is None else row[0]
            except psycopg.Error:
                pass
        return self._fence().fenced(leading)

    def _drop(self) -> None:
        """Let the connection go (a new one is opened for the next write)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.pgconn.finish()  # no round trip: close() would need the loop
