"""The master's durable state in PostgreSQL (`mgpu master --database postgresql://...`).

The schema, migrations and queries are the SQLite store's too (schema.py, sqlstore.py;
dialect.py spells them for PostgreSQL); here only how they run, on psycopg 3: one
connection in autocommit mode, each write a transaction whose first statement is the
fence's check (store/fence.py), so a master that no longer holds the lease writes
nothing.  A write of a few rows goes as one query, check and rows (one round trip, one
implicit transaction; one statement where it can be, pgwith.py, so that it runs
prepared); more rows go in a pipeline.  Text keys are `COLLATE "C"`: ids sort
by their bytes, as SQLite's do, whatever the database's locale.

The connection is one thread's (store/dbthread.py): every statement runs there, in the
order given, never on the event loop; a caller on the loop waits `answer_within` seconds
at most (StoreStalled), and the group commits do not wait at all (`_later`).  Each
statement is bounded on the server too (`statement_timeout`).  Submits' new jobs have a
connection of their own (`new_jobs`): a submit's commit then does not wait behind the
running jobs' (each waits for its WAL flush, which PostgreSQL makes for both at once when
they meet).  On the event loop they are written there, through psycopg's asynchronous
connection and as one statement (store/pgsubmits.py: a submit's user waits for the
write, and a thread's hand-overs cost more than the database); elsewhere, and for arrays,
through a second thread.  Order holds all the same: the other writes of a job come only
once its submit committed (the controller knows the job from then on).

The database may go away (restarted, failed over): a statement that finds the connection
lost reconnects and runs its whole transaction again, for up to `retry_for` seconds, then
raises StoreUnavailable.  A transaction is run again only if it could not have committed,
or if running it twice is harmless (upserts; inserts that ignore a row already there).
A Fenced error is never retried.  The address is shown only as `mgpu.dbaddress.describe`
gives it: without its password.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from mgpu.dbaddress import describe
from mgpu.master.store.base import StoreError, StoreStalled, StoreUnavailable
from mgpu.master.store.dbthread import DbThread, Later
from mgpu.master.store.dialect import POSTGRES
from mgpu.master.store.fence import Fenced
from mgpu.master.store.pglink import Link, params
from mgpu.master.store.pgretry import Unreachable, first_line, lost
from mgpu.master.store.pgsubmits import SubmitLane
from mgpu.master.store.pgwith import statement
from mgpu.master.store.schema import STORE_TABLES, migrate
from mgpu.master.store.sqlstore import SqlStore, key_taken

__all__ = ["RETRY_FOR", "PostgresStore"]

log = logging.getLogger("mgpu.master")

T = TypeVar("T")

RETRY_FOR = 60.0
"""Seconds the store waits for a lost database before a write or read fails."""

ONE_QUERY_ROWS = 64
"""Rows a write sends as one query; more go through executemany, in a pipeline."""
STATEMENT_TIMEOUT_MS = 60_000
"""A statement of the store's that runs longer is ended by the server."""


def _many(cur: psycopg.Cursor[Any], sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """One statement for these rows: execute for one (one round trip), executemany (its
    pipeline) for more."""
    if len(rows) == 1:
        cur.execute(sql, rows[0])
    elif rows:
        cur.executemany(sql, rows)


def _log_failure(future: Any) -> None:
    """A write nobody waits for any more (StoreStalled) that failed after all."""
    error = future.exception()
    if error is not None:
        log.error("a write given while the database did not answer failed: %s", error)


class PostgresStore(SqlStore):
    dialect = POSTGRES

    def __init__(self, url: str, retry_for: float = RETRY_FOR, link: Link | None = None) -> None:
        super().__init__()
        link = link or Link()  # how to connect (store/pglink.py)
        self.url, self.link = url, link
        self._store_link = Link(
            link.application_name, {"statement_timeout": STATEMENT_TIMEOUT_MS, **link.settings}
        )
        self.where = describe(url)
        self.retry_for = retry_for
        self._threads = (DbThread("mgpu-store"), DbThread("mgpu-store-submits"))
        """Where every statement runs (store/dbthread.py): the first for all but the new
        jobs of submits; each its own connection in `_conns`."""
        self._conns: list[psycopg.Connection[Any] | None] = [None, None]
        self._reader: psycopg.Connection[Any] | None = None
        """read_finished's connection, used from threads (under _reader_lock)."""
        self._reader_lock = threading.Lock()
        self._submits = SubmitLane(
            lambda: params(self.url, self._store_link),
            lambda: self.fence,
            retry_for,
            self.where,
            key_taken,
        )
        """Submits' new jobs written on the event loop (store/pgsubmits.py)."""
        try:
            self._threads[0].give(self.connection).result()
        except psycopg.Error as e:
            self._stop_threads(0)
            raise StoreError(f"cannot reach the database {self.where}: {first_line(e)}") from None
        try:
            self._migrate()
            self.reload()
        except psycopg.Error as e:
            self.close()
            raise StoreError(f"cannot use the database {self.where}: {first_line(e)}") from None
        except BaseException:
            self.close()
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(autocommit=True, **params(self.url, self._store_link))

    def _lane(self) -> int | None:
        """Which of the store's threads the caller is (None: none of them)."""
        return next((i for i, thread in enumerate(self._threads) if thread.here()), None)

    def connection(self) -> psycopg.Connection[Any]:
        """The connection of the store's thread that calls (the first's, from elsewhere),
        opened again if it was lost."""
        lane = self._lane() or 0
        conn = self._conns[lane]
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
                self._conns[lane] = None
            conn = self._conns[lane] = self._connect()
        return conn

    def _migrate(self) -> None:
        """Bring the database to SCHEMA_VERSION (schema.py; an advisory lock: masters
        starting together do it one at a time)."""
        migrate(self.connection(), POSTGRES, f"the database {self.where}")

    def close(self, wait: float = 5.0) -> None:
        """Close the connections, once what was given to the store's thread is done (for
        `wait` seconds at most: a database that does not answer keeps its writes)."""
        self._submits.close()
        self._stop_threads(wait)
        for lane, thread in enumerate(self._threads):
            conn = self._conns[lane]
            if conn is not None and not thread.alive():
                conn.close()
                self._conns[lane] = None
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def _stop_threads(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.stop(max(deadline - time.monotonic(), 0.0))

    # ---- running statements -----------------------------------------------

    def answering(self) -> bool:
        within = self.answer_within
        busy = [t.busy_for() for t in self._threads] + [self._submits.busy_for()]
        return within is None or all(b <= within for b in busy)

    def _later(
        self, work: Callable[[], T], after: Callable[[], None] | None = None, new_jobs: bool = False
    ) -> Later[T]:
        if self._lane() is not None:
            return Later.now(work, after)
        return Later(self._threads[1 if new_jobs else 0].give(work), after)

    def _later_rows(
        self,
        parts: Sequence[tuple[str, Sequence[Sequence[Any]]]],
        after: Callable[[], None],
        new_jobs: bool,
    ) -> Later[None]:
        if not new_jobs or self._lane() is not None or not self._submits.serves():
            return super()._later_rows(parts, after, new_jobs)
        return Later(self._submits.give([(self._q(sql), rows) for sql, rows in parts]), after)

    def _run(
        self,
        work: Callable[[psycopg.Connection[Any]], T],
        write: bool,
        one_query: bool = False,
        own_transaction: bool = False,
    ) -> T:
        """`_run_here` in the store's thread; a caller on the event loop waits
        `answer_within` at most (StoreStalled), and a read is refused at once while the
        database does not answer.  A write not answered in time is still made, in order."""
        if self._lane() is not None:
            return self._run_here(work, write, one_query, own_transaction)
        bound = self._bound()
        answering = bound is None or self.answering()
        if not answering and not write:
            raise StoreStalled()
        later = self._later(lambda: self._run_here(work, write, one_query, own_transaction))
        try:
            return later.wait(bound if answering else 0.0)
        except StoreStalled:
            if write:
                later.future.add_done_callback(_log_failure)
            raise

    def _run_here(
        self,
        work: Callable[[psycopg.Connection[Any]], T],
        write: bool,
        one_query: bool = False,
        own_transaction: bool = False,
    ) -> T:
        """`work` on the connection (a write: in a transaction, after the fence's check),
        again on a new connection while the database is unreachable, up to retry_for.
        `one_query`: the write is one query (one statement, or several in one string),
        which PostgreSQL runs as one transaction of its own: while the fence has no
        generation (one master), it goes without BEGIN and COMMIT, one round trip.
        `own_transaction`: `work` checks the fence and makes its transaction itself."""
        tries = Unreachable(self.where, self.retry_for)
        while True:
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self.connection()
                if not write or own_transaction:
                    return work(conn)
                if one_query and self.fence.generation is None and not self.fence.lost:
                    self.fence.check(conn)  # nothing to check: no lease
                    return work(conn)
                with conn.transaction():
                    self.fence.check(conn)
                    return work(conn)
            except Fenced:
                raise
            except psycopg.Error as e:
                if not lost(conn, e):
                    raise
                pause = tries.pause(e)
                if conn is not None and not conn.closed:
                    conn.close()
                time.sleep(pause)

    def _read(self, work: Callable[[Any], T]) -> T:
        return self._run(work, write=False)

    def _write(self, work: Callable[[Any], T], one_query: bool = False) -> T:
        return self._run(work, write=True, one_query=one_query)

    def _write_rows(self, parts: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        """Each statement of `parts` for each of its rows, in one transaction, the fence's
        check first: a few rows as one query (the values bound here; one round trip, one
        implicit transaction), many through executemany in a pipeline."""
        statements = [(sql, row) for sql, rows in parts for row in rows]
        if not statements:
            return
        fence = self.fence

        def many(c: psycopg.Connection[Any]) -> None:
            check = fence.statement()
            with c.pipeline(), c.transaction(), c.cursor() as cur:
                if check is not None:
                    cur.execute(check)
                for sql, rows in parts:
                    _many(cur, sql, rows)

        def one(c: psycopg.Connection[Any]) -> None:
            check = fence.statement()
            single = statement(parts, check)
            if single is not None:  # prepared once its shape is known: pgwith.py
                c.execute(single[0], single[1])
                return
            with psycopg.ClientCursor(c) as cur:
                text = ";".join(cur.mogrify(sql, row) for sql, row in statements)
                cur.execute(text if check is None else f"{check};{text}")

        def fenced(c: psycopg.Connection[Any]) -> None:
            try:
                (many if len(statements) > ONE_QUERY_ROWS else one)(c)
            except psycopg.errors.InvalidTextRepresentation as e:
                if fence.refused(e):
                    fence.deny(c)
                raise

        self._run(fenced, write=True, own_transaction=True)

    def _read_apart(self, work: Callable[[Any], T]) -> T:
        """Through a connection of its own (kept for the next such read), one thread at
        a time."""
        with self._reader_lock:
            for attempt in (1, 2):  # a connection the database dropped: once more, afresh
                try:
                    if self._reader is None or self._reader.closed or self._reader.broken:
                        self._reader = self._connect()
                    return work(self._reader)
                except psycopg.OperationalError as e:
                    if self._reader is not None:
                        self._reader.close()
                        self._reader = None
                    if attempt == 2:
                        raise StoreUnavailable(
                            f"cannot read from the database {self.where}: {first_line(e)}"
                        ) from None
        raise AssertionError("unreachable")

    # ---- import (`mgpu db import`) ----------------------------------------

    def is_empty(self) -> bool:
        """Whether no table of the master's state has a row (an import may go in)."""
        union = " UNION ALL ".join(f"SELECT 1 FROM {t}" for t in STORE_TABLES)
        return self._one(f"SELECT EXISTS ({union})") == (False,)

    def write_in_one(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """`work` in one write transaction on the store's connection, after the fence's
        check, run again on a new connection while the database is unreachable (so `work`
        must be safe to run twice): an import, or rows kept beside the store's (output)."""
        return self._write(work)

    def read_in_one(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """`work` (reads only) on the store's connection, run again on a new connection
        while the database is unreachable."""
        return self._run(work, write=False)
