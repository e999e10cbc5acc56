"""The master's durable state in PostgreSQL (`mgpu master --database postgresql://...`).

The same tables and meaning as the SQLite store (store/sqlite.py; tests/stores.py runs the
same tests on both), on psycopg 3: one connection in autocommit mode, each write an explicit
transaction whose first statement is the fence's check (store/fence.py), so a master that
no longer holds the lease writes nothing.  Text keys are `COLLATE "C"`: ids sort by their
bytes, as SQLite's do, whatever the database's locale.

The database may go away (restarted, failed over): a statement that finds the connection
lost reconnects and runs its whole transaction again, for up to `retry_for` seconds, then
raises StoreUnavailable.  A transaction is run again only if it could not have committed,
or if running it twice is harmless (upserts; inserts that ignore a row already there).
A Fenced error is never retried.  The address is shown only as `mgpu.dbaddress.describe`
gives it: without its password.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from mgpu.dbaddress import describe
from mgpu.master.store import arrays, steps
from mgpu.master.store.base import (
    ACTIVE_STATES,
    LAST_JOB_ID,
    SCHEMA_VERSION,
    TOKEN_KEYS,
    Event,
    Store,
    StoreError,
    StoreUnavailable,
    TokenRow,
)
from mgpu.master.store.fence import LEASE_SCHEMA, Fenced
from mgpu.master.store.pglink import Link, params
from mgpu.model import Job

__all__ = ["RETRY_FOR", "PostgresStore"]

log = logging.getLogger("mgpu.master")

T = TypeVar("T")

RETRY_FOR = 60.0
"""Seconds the store waits for a lost database before a write or read fails."""

ONE_QUERY_ROWS = 16
"""Rows a write sends as one query; more go through executemany."""

MIGRATION_LOCK = 0x6D677075  # "mgpu": masters starting together migrate one at a time

TABLES = (
    """CREATE TABLE IF NOT EXISTS jobs (
    id TEXT COLLATE "C" PRIMARY KEY,
    seq BIGINT NOT NULL,
    state TEXT NOT NULL,
    "user" TEXT NOT NULL,
    submit_time DOUBLE PRECISION NOT NULL,
    end_time DOUBLE PRECISION,
    record TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)",
    "CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time)",
    """CREATE TABLE IF NOT EXISTS arrays (
    id TEXT COLLATE "C" PRIMARY KEY,
    seq BIGINT NOT NULL,
    active INTEGER NOT NULL,
    indices TEXT NOT NULL,
    max_running INTEGER,
    record TEXT NOT NULL
)""",
    'CREATE TABLE IF NOT EXISTS nodes (node_id TEXT COLLATE "C" PRIMARY KEY, record TEXT NOT NULL)',
    'CREATE TABLE IF NOT EXISTS meta (key TEXT COLLATE "C" PRIMARY KEY, value TEXT NOT NULL)',
    'CREATE TABLE IF NOT EXISTS reservations (name TEXT COLLATE "C" PRIMARY KEY, '
    "record TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS events (
    id BIGSERIAL PRIMARY KEY,
    time DOUBLE PRECISION NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT,
    address TEXT,
    target TEXT,
    detail TEXT
)""",
    """CREATE TABLE IF NOT EXISTS tokens (
    id TEXT COLLATE "C" PRIMARY KEY,
    "user" TEXT NOT NULL,
    admin INTEGER NOT NULL,
    kind TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created DOUBLE PRECISION NOT NULL,
    revoked DOUBLE PRECISION,
    owner INTEGER NOT NULL DEFAULT 0,
    allow_root INTEGER NOT NULL DEFAULT 0
)""",
    """CREATE TABLE IF NOT EXISTS node_secrets (
    node_id TEXT COLLATE "C" PRIMARY KEY,
    hash TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL
)""",
    LEASE_SCHEMA,
)

STORE_TABLES = (
    "jobs",
    "arrays",
    "nodes",
    "meta",
    "reservations",
    "events",
    "tokens",
    "node_secrets",
)
"""The tables of the master's state (an import needs them empty)."""


def _migrate_to_1(conn: psycopg.Connection[Any]) -> None:
    for statement in TABLES:
        conn.execute(statement)


SUBMIT_KEYS = (
    'CREATE TABLE IF NOT EXISTS submit_keys (key TEXT COLLATE "C" PRIMARY KEY, '
    "job_id TEXT NOT NULL, time DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS submit_keys_time ON submit_keys(time)",
)


def _migrate_to_2(conn: psycopg.Connection[Any]) -> None:
    for statement in SUBMIT_KEYS:
        conn.execute(statement)


MIGRATIONS = (_migrate_to_1, _migrate_to_2, steps.migrate_postgres)
"""MIGRATIONS[i] takes a database from version i to i + 1."""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _deactivate(array_id: str) -> Callable[[psycopg.Connection[Any]], None]:
    def work(c: psycopg.Connection[Any]) -> None:
        c.execute("UPDATE arrays SET active=0 WHERE id=%s", (array_id,))

    return work


def _many(cur: psycopg.Cursor[Any], sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """One statement for these rows: execute for one (one round trip), executemany (its
    pipeline) for more."""
    if len(rows) == 1:
        cur.execute(sql, rows[0])
    elif rows:
        cur.executemany(sql, rows)


def _lost(conn: psycopg.Connection[Any] | None, e: psycopg.Error) -> bool:
    """Whether the error means the connection to the database is gone (then try again)."""
    if conn is None or conn.closed or conn.broken:
        return True
    state = e.sqlstate or ""
    return isinstance(e, psycopg.OperationalError) and state[:2] in ("08", "57")


class PostgresStore(steps.PostgresSteps, Store):
    def __init__(self, url: str, retry_for: float = RETRY_FOR, link: Link | None = None) -> None:
        super().__init__()
        self.url, self.link = url, link or Link()  # link: how to connect (store/pglink.py)
        self.where = describe(url)
        self.retry_for = retry_for
        self._conn: psycopg.Connection[Any] | None = None
        self._reader: psycopg.Connection[Any] | None = None
        """read_finished's connection, used from threads (under _reader_lock)."""
        self._reader_lock = threading.Lock()
        try:
            self._conn = self._connect()
        except psycopg.Error as e:
            raise StoreError(f"cannot reach the database {self.where}: {_first_line(e)}") from None
        try:
            self._migrate()
            self.reload()
        except psycopg.Error as e:
            self.close()
            raise StoreError(f"cannot use the database {self.where}: {_first_line(e)}") from None
        except BaseException:
            self.close()
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(autocommit=True, **params(self.url, self.link))

    def connection(self) -> psycopg.Connection[Any]:
        """The store's connection, opened again if it was lost."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._conn = self._connect()
        return self._conn

    def _migrate(self) -> None:
        """Bring the database to SCHEMA_VERSION, each migration in order, in one transaction
        (an advisory lock: masters starting together do it one at a time)."""
        conn = self.connection()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0] or 0) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the database {self.where} has schema version {version}, newer than "
                    f"this mgpu's ({SCHEMA_VERSION}): run a newer mgpu"
                )
            for migrate in MIGRATIONS[version:]:
                migrate(conn)
            if version < SCHEMA_VERSION:
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        row = self._one("SELECT MAX(version) FROM schema_version")
        return int(row[0] or 0) if row else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    # ---- running statements -----------------------------------------------

    def _run(
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
        deadline: float | None = None
        pause = 0.05
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
                if not _lost(conn, e):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.retry_for
                    log.warning(
                        "the database %s is unreachable (%s): trying again for up to %.0f s",
                        self.where,
                        _first_line(e),
                        self.retry_for,
                    )
                if now >= deadline:
                    raise StoreUnavailable(
                        f"the database {self.where} has been unreachable for "
                        f"{self.retry_for:.0f} s: {_first_line(e)}"
                    ) from None
                if conn is not None and not conn.closed:
                    conn.close()
                time.sleep(min(pause, max(deadline - now, 0.0)))
                pause = min(pause * 2, 1.0)

    def _write(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        return self._run(work, write=True)

    def _write_one(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """A write of one statement (`_run`'s one_query)."""
        return self._run(work, write=True, one_query=True)

    def _write_rows(self, parts: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        """Each statement of `parts` for each of its rows, in one transaction: a few rows as
        one query (the values bound here; one round trip), many through executemany."""
        statements = [(sql, row) for sql, rows in parts for row in rows]
        if not statements:
            return
        if len(statements) > ONE_QUERY_ROWS:

            def many(c: psycopg.Connection[Any]) -> None:
                with c.cursor() as cur:
                    for sql, rows in parts:
                        _many(cur, sql, rows)

            self._write(many)
            return

        def one(c: psycopg.Connection[Any]) -> None:
            with psycopg.ClientCursor(c) as cur:
                text = ";".join(cur.mogrify(sql, row) for sql, row in statements)
                if self.fence.generation is None and not self.fence.lost:
                    cur.execute(text)  # its own transaction: one round trip
                    return
                # Fenced: BEGIN, the fence's check, then the rows and the COMMIT together.
                c.execute("BEGIN")
                try:
                    self.fence.check(c)
                    cur.execute(text + ";COMMIT")
                except BaseException:
                    if not c.closed and not c.broken:
                        with contextlib.suppress(psycopg.Error):
                            c.execute("ROLLBACK")
                    raise

        self._run(one, write=True, one_query=True, own_transaction=True)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._run(lambda c: c.execute(sql, params).fetchone(), write=False)

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(lambda c: c.execute(sql, params).fetchall(), write=False)

    def _load_seqs(self) -> tuple[int, dict[str, int]]:
        row = self._one(
            "SELECT GREATEST(COALESCE((SELECT MAX(seq) FROM jobs), 0), "
            "COALESCE((SELECT MAX(seq) FROM arrays), 0))"
        )
        rows = self._all("SELECT id, seq FROM arrays WHERE active=1")
        return int(row[0]) if row else 0, {str(r[0]): int(r[1]) for r in rows}

    def _digit_ids_above(self, counter: int) -> set[str]:
        low = f"{max(counter + 1, 10_000_000):08d}"
        if len(low) > 8:
            return set()
        rows = self._all(
            "SELECT id FROM jobs WHERE id >= %s AND id <= '99999999' AND id ~ '^[0-9]{8}$' "
            "UNION SELECT id FROM arrays WHERE id >= %s AND id <= '99999999' "
            "AND id ~ '^[0-9]{8}$'",
            (low, low),
        )
        return {str(r[0]) for r in rows}

    # ---- jobs -------------------------------------------------------------

    def save_jobs(
        self,
        jobs: list[Job],
        event: Event | None = None,
        detail: str | None = None,
        meta: tuple[str, str] | None = None,
        events: Sequence[Event] = (),
        keys: Sequence[tuple[str, str]] = (),
    ) -> None:
        rows = self._job_rows(jobs)
        top = self._top_id(jobs)
        now = time.time()
        metas = [m for m in (meta, None if top is None else (LAST_JOB_ID, str(top))) if m]

        all_events: list[tuple[Any, ...]] = [(now, *e, None) for e in events]
        if event is not None:
            all_events.insert(0, (now, *event, detail))
        key_rows = [(key, job_id, now) for key, job_id in keys]

        self._write_rows(
            [
                (_UPSERT_JOB, rows),
                (_EVENT, all_events),
                (_SET_META, metas),
                (_SUBMIT_KEY, key_rows),
            ]
        )
        self._counted(top)
        self._remember_ended(jobs)

    def save_array(
        self,
        template: Job,
        indices: list[int],
        max_running: int | None,
        event: Event | None = None,
        key: str | None = None,
    ) -> None:
        self._seq += 1
        seq = self._seq
        record = json.dumps(template.to_record(), separators=(",", ":"))
        top = self._top_id([template], max(indices, default=0))
        now = time.time()

        def work(c: psycopg.Connection[Any]) -> None:
            # A retry after a commit whose answer was lost finds the row: nothing to add.
            cur = c.execute(
                "INSERT INTO arrays(id, seq, active, indices, max_running, record) "
                "VALUES (%s,%s,1,%s,%s,%s) ON CONFLICT(id) DO NOTHING",
                (template.id, seq, arrays.encode_indices(indices), max_running, record),
            )
            if cur.rowcount == 0:
                return
            if event is not None:
                c.execute(
                    "INSERT INTO events(time, kind, actor, address, target) "
                    "VALUES (%s,%s,%s,%s,%s)",
                    (now, *event),
                )
            if top is not None:
                c.execute(_SET_META, (LAST_JOB_ID, str(top)))
            if key is not None:
                c.execute(_SUBMIT_KEY, (key, template.id, now))

        self._write(work)
        self._counted(top)
        self._array_seq[template.id] = seq

    def get_array(self, array_id: str) -> tuple[Job, tuple[int, ...], int | None] | None:
        row = self._one("SELECT record, indices, max_running FROM arrays WHERE id=%s", (array_id,))
        if row is None:
            return None
        template = Job.from_record(json.loads(row[0]))
        return template, tuple(arrays.decode_indices(row[1])), row[2]

    def _array_record(self, array_id: str, reader: Any) -> str | None:
        sql = "SELECT record FROM arrays WHERE id=%s"
        if reader is not None:
            row = reader.execute(sql, (array_id,)).fetchone()
        else:
            row = self._one(sql, (array_id,))
        return None if row is None else str(row[0])

    def load_active_jobs(self) -> list[Job]:
        found: list[tuple[int, int, Job]] = []
        for seq, record in self._all(
            "SELECT seq, record FROM jobs WHERE state IN (%s, %s)", ACTIVE_STATES
        ):
            job = self._job(record)
            found.append((seq, -1 if job.array_task_id is None else job.array_task_id, job))
        for array_id, seq, indices, cap, record in self._all(
            "SELECT id, seq, indices, max_running, record FROM arrays WHERE active=1"
        ):
            rowed = {r[0] for r in self.job_rows_with_prefix(array_id + "_", limit=-1)}
            template = Job.from_record(json.loads(record))
            left = [i for i in arrays.decode_indices(indices) if f"{array_id}_{i}" not in rowed]
            if not left:  # every task has its row: the array row is history only
                self._write_one(_deactivate(array_id))
                self._array_seq.pop(array_id, None)
                continue
            found += [(seq, t.array_task_id or 0, t) for t in arrays.tasks(template, left, cap)]
        found.sort(key=lambda f: (f[0], f[1]))
        return [f[2] for f in found]

    def has_job(self, job_id: str) -> bool:
        row = self._one(
            "SELECT 1 FROM jobs WHERE id=%s UNION ALL SELECT 1 FROM arrays WHERE id=%s LIMIT 1",
            (job_id, job_id),
        )
        return row is not None

    def array_below(self, number: int) -> str | None:
        row = self._one(
            "SELECT id FROM (SELECT id, CASE WHEN id ~ '^[1-9][0-9]*$' THEN id::numeric END "
            "AS n FROM arrays) a WHERE n < %s ORDER BY n DESC LIMIT 1",
            (number,),
        )
        return None if row is None else str(row[0])

    def _job_record(self, job_id: str) -> str | None:
        row = self._one("SELECT record FROM jobs WHERE id=%s", (job_id,))
        return None if row is None else str(row[0])

    def _job_records(self, job_ids: list[str]) -> list[tuple[str, str]]:
        rows = self._all("SELECT id, record FROM jobs WHERE id = ANY(%s)", (job_ids,))
        return [(str(r[0]), str(r[1])) for r in rows]

    def job_rows_with_prefix(
        self, prefix: str, after: str = "", limit: int = 5000
    ) -> list[tuple[str, str, str]]:
        rows = self._all(
            'SELECT id, state, "user" FROM jobs WHERE id > %s AND id < %s ORDER BY id LIMIT %s',
            (max(prefix, after), prefix + "\U0010ffff", None if limit < 0 else limit),
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def finished_jobs(self, since: float | None = None, limit: int = 1000) -> list[Job]:
        rows = self._all(
            "SELECT record FROM jobs WHERE state NOT IN (%s, %s) AND end_time >= %s "
            "ORDER BY end_time DESC LIMIT %s",
            (*ACTIVE_STATES, since or 0.0, limit),
        )
        return [self._job(r[0]) for r in rows]

    def count_by_state(self) -> dict[str, int]:
        rows = self._all("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {str(state): int(n) for state, n in rows}

    def read_finished(
        self,
        since: float,
        user: str | None = None,
        states: set[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Through a connection of its own (kept for the next such read), one thread at
        a time."""
        where = ["state NOT IN (%s, %s)", "end_time >= %s"]
        params: list[Any] = [*ACTIVE_STATES, since]
        if user:
            where.append('"user" = %s')
            params.append(user)
        if states:
            where.append("state = ANY(%s)")
            params.append(sorted(states))
        sql = f"SELECT record FROM jobs WHERE {' AND '.join(where)} ORDER BY end_time DESC"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        with self._reader_lock:
            for attempt in (1, 2):  # a connection the database dropped: once more, afresh
                try:
                    if self._reader is None or self._reader.closed or self._reader.broken:
                        self._reader = self._connect()
                    conn = self._reader
                    return [self._job(r[0], conn) for r in conn.execute(sql, params).fetchall()]
                except psycopg.OperationalError as e:
                    if self._reader is not None:
                        self._reader.close()
                        self._reader = None
                    if attempt == 2:
                        raise StoreUnavailable(
                            f"cannot read from the database {self.where}: {_first_line(e)}"
                        ) from None
        raise AssertionError("unreachable")

    def jobs_with_prefix(self, prefix: str) -> list[Job]:
        rows = self._all(
            "SELECT record FROM jobs WHERE id >= %s AND id < %s ORDER BY seq",
            (prefix, prefix + "\U0010ffff"),
        )
        return [self._job(r[0]) for r in rows]

    # ---- nodes and meta ---------------------------------------------------

    def save_node(self, node_id: str, record: dict[str, Any]) -> None:
        self._write_rows([(_SAVE_NODE, [(node_id, json.dumps(record))])])

    def delete_node(self, node_id: str) -> None:
        self._write_one(lambda c: c.execute("DELETE FROM nodes WHERE node_id=%s", (node_id,)))

    def load_nodes(self) -> dict[str, dict[str, Any]]:
        return {r[0]: json.loads(r[1]) for r in self._all("SELECT node_id, record FROM nodes")}

    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key=%s", (key,))
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._write_rows([(_SET_META, [(key, value)])])

    # ---- audit events -----------------------------------------------------

    def record_event(
        self,
        kind: str,
        actor: str | None = None,
        address: str | None = None,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        self._write_rows([(_EVENT, [(time.time(), kind, actor, address, target, detail)])])

    def record_events(
        self, rows: list[tuple[str, str | None, str | None, str | None, str | None]]
    ) -> None:
        if not rows:
            return
        now = time.time()
        self._write_rows([(_EVENT, [(now, *row) for row in rows])])

    def events(self, since: float = 0.0, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT time, kind, actor, address, target, detail FROM events "
            "WHERE time >= %s ORDER BY id DESC LIMIT %s",
            (since, limit),
        )
        keys = ("time", "kind", "actor", "address", "target", "detail")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    # ---- retention --------------------------------------------------------

    def users_of(self, job_ids: Sequence[str]) -> dict[str, str]:
        rows = self._all('SELECT id, "user" FROM jobs WHERE id = ANY(%s)', (list(job_ids),))
        return {str(i): str(u) for i, u in rows}

    def ended_between(
        self, after: tuple[float, str], before: float, limit: int
    ) -> list[tuple[str, str, float]]:
        end, job_id = after
        rows = self._all(
            'SELECT id, "user", end_time FROM jobs WHERE end_time >= %s AND end_time < %s '
            "AND (end_time > %s OR id > %s) AND state NOT IN (%s, %s) "
            "ORDER BY end_time, id LIMIT %s",
            (end, before, end, job_id, *ACTIVE_STATES, limit),
        )
        return [(str(i), str(u), float(t)) for i, u, t in rows]

    def delete_ended_jobs(self, before: float, limit: int) -> list[tuple[str, str]]:
        def work(c: psycopg.Connection[Any]) -> list[tuple[str, str]]:
            cur = c.execute(
                "WITH gone AS (DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE "
                "end_time < %s AND state NOT IN (%s, %s) ORDER BY end_time, id LIMIT %s) "
                'RETURNING id, "user", end_time) '
                'SELECT id, "user" FROM gone ORDER BY end_time, id',
                (before, *ACTIVE_STATES, limit),
            )
            return [(str(i), str(u)) for i, u in cur.fetchall()]

        rows = self._write_one(work)
        for job_id, _ in rows:
            self._ended.pop(job_id, None)
        return rows

    def job_of_submit_key(self, key: str) -> str | None:
        row = self._one("SELECT job_id FROM submit_keys WHERE key=%s", (key,))
        return None if row is None else str(row[0])

    def delete_submit_keys_before(self, before: float, limit: int) -> int:
        return self._write_one(
            lambda c: (
                c.execute(
                    "DELETE FROM submit_keys WHERE key IN "
                    "(SELECT key FROM submit_keys WHERE time < %s ORDER BY time LIMIT %s)",
                    (before, limit),
                ).rowcount
            )
        )

    def delete_events_before(self, before: float, limit: int) -> int:
        return self._write_one(
            lambda c: (
                c.execute(
                    "DELETE FROM events WHERE id IN "
                    "(SELECT id FROM events WHERE time < %s ORDER BY id LIMIT %s)",
                    (before, limit),
                ).rowcount
            )
        )

    # ---- reservations -----------------------------------------------------

    def save_reservation(
        self, name: str, record: dict[str, Any], event: tuple[str, str | None, str | None]
    ) -> None:
        text = json.dumps(record)
        row = (time.time(), *event, name, None)

        def work(c: psycopg.Connection[Any]) -> None:
            c.execute("INSERT INTO reservations(name, record) VALUES (%s, %s)", (name, text))
            c.execute(_EVENT, row)

        self._write(work)

    def delete_reservations(
        self, names: list[str], event: tuple[str, str | None, str | None] | None = None
    ) -> None:
        now = time.time()

        def work(c: psycopg.Connection[Any]) -> None:
            c.execute("DELETE FROM reservations WHERE name = ANY(%s)", (names,))
            if event is not None and names:
                with c.cursor() as cur:
                    cur.executemany(_EVENT, [(now, *event, name, None) for name in names])

        self._write(work)

    def load_reservations(self) -> list[dict[str, Any]]:
        return [
            json.loads(r[0]) for r in self._all("SELECT record FROM reservations ORDER BY name")
        ]

    # ---- tokens -----------------------------------------------------------

    def insert_token(
        self,
        token_id: str,
        user: str,
        admin: bool,
        kind: str,
        digest: str,
        created: float,
        owner: bool = False,
        allow_root: bool = False,
    ) -> None:
        row = (token_id, user, int(admin), kind, digest, created, int(owner), int(allow_root))
        self._write_one(
            lambda c: c.execute(
                'INSERT INTO tokens(id, "user", admin, kind, hash, created, owner, allow_root) '
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT(id) DO NOTHING",
                row,
            )
        )

    def token_by_hash(self, digest: str, kind: str) -> TokenRow | None:
        row = self._one(
            'SELECT id, "user", admin, hash, owner, allow_root FROM tokens '
            "WHERE hash=%s AND kind=%s AND revoked IS NULL",
            (digest, kind),
        )
        return None if row is None else (str(row[0]), str(row[1]), *row[2:])

    def token_guard(self, token_id: str) -> tuple[bool, str] | None:
        row = self._one(
            "SELECT owner, kind FROM tokens WHERE id=%s AND revoked IS NULL", (token_id,)
        )
        return None if row is None else (bool(row[0]), str(row[1]))

    def revoke_token(self, token_id: str, when: float) -> bool:
        return self._write_one(
            lambda c: (
                c.execute(
                    "UPDATE tokens SET revoked=%s WHERE id=%s AND revoked IS NULL", (when, token_id)
                ).rowcount
                > 0
            )
        )

    def list_tokens(self) -> list[dict[str, Any]]:
        rows = self._all(
            'SELECT id, "user", admin, kind, created, revoked, owner, allow_root FROM tokens '
            "ORDER BY created"
        )
        return [
            {**dict(zip(TOKEN_KEYS, r, strict=True)), "owner": bool(r[6]), "allow_root": bool(r[7])}
            for r in rows
        ]

    def has_owner_token(self) -> bool:
        return self._one("SELECT 1 FROM tokens WHERE owner=1 LIMIT 1") is not None

    def mark_owner_token(self, digest: str) -> None:
        self._write_one(
            lambda c: c.execute(
                "UPDATE tokens SET owner=1, allow_root=1 WHERE hash=%s AND kind='user' AND admin=1",
                (digest,),
            )
        )

    # ---- node secrets -----------------------------------------------------

    def node_secret_hash(self, node_id: str) -> str | None:
        row = self._one("SELECT hash FROM node_secrets WHERE node_id=%s", (node_id,))
        return None if row is None else str(row[0])

    def set_node_secret(self, node_id: str, digest: str, created: float) -> None:
        self._write_one(
            lambda c: c.execute(
                "INSERT INTO node_secrets(node_id, hash, created) VALUES (%s,%s,%s) "
                "ON CONFLICT(node_id) DO UPDATE SET hash=excluded.hash, created=excluded.created",
                (node_id, digest, created),
            )
        )

    def forget_node_secret(self, node_id: str) -> bool:
        return self._write_one(
            lambda c: (
                c.execute("DELETE FROM node_secrets WHERE node_id=%s", (node_id,)).rowcount > 0
            )
        )

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


_UPSERT_JOB = (
    'INSERT INTO jobs(id, seq, state, "user", submit_time, end_time, record) '
    "VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT(id) DO UPDATE SET "
    "state=excluded.state, end_time=excluded.end_time, record=excluded.record"
)
_SAVE_NODE = (
    "INSERT INTO nodes(node_id, record) VALUES (%s, %s) "
    "ON CONFLICT(node_id) DO UPDATE SET record=excluded.record"
)
_SET_META = (
    "INSERT INTO meta(key, value) VALUES (%s, %s) "
    "ON CONFLICT(key) DO UPDATE SET value=excluded.value"
)
_EVENT = "INSERT INTO events(time, kind, actor, address, target, detail) VALUES (%s,%s,%s,%s,%s,%s)"
_SUBMIT_KEY = "INSERT INTO submit_keys(key, job_id, time) VALUES (%s,%s,%s)"
