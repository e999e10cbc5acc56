"""The master's durable state in SQLite, WAL mode, under the state dir (the default store).

The master writes a job here after every state change and before acting on it.
`synchronous=NORMAL` in WAL mode survives a crash or kill -9 of the master (the WAL is in
the OS page cache); only a power loss can drop the last transactions, which is the
trade-off Slurm's own state save makes too.  One master owns the file: its fence never
has a generation (store/fence.py).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mgpu.master.store import arrays, steps
from mgpu.master.store.base import (
    ACTIVE_STATES,
    LAST_JOB_ID,
    RECENTLY_ENDED,
    SCHEMA_VERSION,
    SCRIPT_OF_ARRAY,
    TOKEN_KEYS,
    Event,
    Store,
    StoreError,
    TokenRow,
)
from mgpu.master.store.walcheckpoint import Checkpointer
from mgpu.model import Job

__all__ = [
    "LAST_JOB_ID",
    "MEMORY",
    "RECENTLY_ENDED",
    "SCRIPT_OF_ARRAY",
    "SqliteStore",
]

TABLES = (
    """CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    user TEXT NOT NULL,
    submit_time REAL NOT NULL,
    end_time REAL,
    record TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)",
    "CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time)",
    """CREATE TABLE IF NOT EXISTS arrays (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    active INTEGER NOT NULL,
    indices TEXT NOT NULL,
    max_running INTEGER,
    record TEXT NOT NULL
)""",
    "CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, record TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reservations (name TEXT PRIMARY KEY, record TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT,
    address TEXT,
    target TEXT,
    detail TEXT
)""",
    """CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    admin INTEGER NOT NULL,
    kind TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    revoked REAL
)""",
    """CREATE TABLE IF NOT EXISTS node_secrets (
    node_id TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    created REAL NOT NULL
)""",
)
"""Version 1: the tables as mgpu made them before versions (IF NOT EXISTS: an older state
dir keeps its rows), with the token grant columns added below."""

GRANT_COLUMNS = ("owner", "allow_root")
"""Token columns added after the first release: ALTER TABLE for state dirs made before."""

SQLITE_MAX_INT = 2**63 - 1
"""The largest integer SQLite binds (a larger one raises OverflowError)."""

MEMORY = ":memory:"
"""A store that lives in memory only (the controller tests)."""


def _migrate_to_1(db: sqlite3.Connection) -> None:
    for statement in TABLES:
        db.execute(statement)
    have = {row[1] for row in db.execute("PRAGMA table_info(tokens)")}
    for column in GRANT_COLUMNS:
        if column not in have:
            db.execute(f"ALTER TABLE tokens ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")


SUBMIT_KEYS = (
    "CREATE TABLE IF NOT EXISTS submit_keys "
    "(key TEXT PRIMARY KEY, job_id TEXT NOT NULL, time REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS submit_keys_time ON submit_keys(time)",
)


def _migrate_to_2(db: sqlite3.Connection) -> None:
    for statement in SUBMIT_KEYS:
        db.execute(statement)


MIGRATIONS = (_migrate_to_1, _migrate_to_2, steps.migrate_sqlite)
"""MIGRATIONS[i] takes a database from version i to i + 1."""


def migrate(db: sqlite3.Connection, where: str) -> None:
    """Bring the database to SCHEMA_VERSION, each migration in order, in one transaction
    (`db` in autocommit mode; `where`: its name for an error)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        version = int(row[0] or 0)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{where} has schema version {version}, newer than this mgpu's "
                f"({SCHEMA_VERSION}): run a newer mgpu"
            )
        for step in MIGRATIONS[version:]:
            step(db)
        if version < SCHEMA_VERSION:
            db.execute("DELETE FROM schema_version")
            db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class SqliteStore(steps.SqliteSteps, Store):
    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = path
        if path != MEMORY:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._checkpointer: Checkpointer | None = None
        if path != MEMORY:  # checkpoints off the event loop (walcheckpoint.py)
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = Checkpointer(path)
            self._checkpointer.start()
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise
        self.reload()

    def _migrate(self) -> None:
        migrate(self.db, str(self.path))

    def schema_version(self) -> int:
        row = self.db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _load_seqs(self) -> tuple[int, dict[str, int]]:
        row = self.db.execute(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM jobs), 0), "
            "COALESCE((SELECT MAX(seq) FROM arrays), 0))"
        ).fetchone()
        cur = self.db.execute("SELECT id, seq FROM arrays WHERE active=1")
        return int(row[0]), {str(r[0]): int(r[1]) for r in cur}

    def _digit_ids_above(self, counter: int) -> set[str]:
        low = f"{max(counter + 1, 10_000_000):08d}"
        if len(low) > 8:
            return set()
        found: set[str] = set()
        for table in ("jobs", "arrays"):  # a range of the primary key, then 8 digits
            cur = self.db.execute(
                f"SELECT id FROM {table} WHERE id >= ? AND id <= '99999999' AND length(id) = 8 "
                "AND id NOT GLOB '*[^0-9]*'",
                (low,),
            )
            found.update(str(r[0]) for r in cur)
        return found

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self.db.close()

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
        with self._tx():
            if keys:
                now = time.time()
                self.db.executemany(
                    "INSERT INTO submit_keys(key, job_id, time) VALUES (?,?,?)",
                    [(key, job_id, now) for key, job_id in keys],
                )
            # seq keeps the first insert's order: it is submit order for the queue.
            self.db.executemany(
                "INSERT INTO jobs(id, seq, state, user, submit_time, end_time, record) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
                "state=excluded.state, end_time=excluded.end_time, record=excluded.record",
                rows,
            )
            if event is not None:
                self._event(*event, detail)
            if events:
                now = time.time()
                self.db.executemany(
                    "INSERT INTO events(time, kind, actor, address, target) VALUES (?,?,?,?,?)",
                    [(now, *e) for e in events],
                )
            if meta is not None:
                self._set_meta(*meta)
            if top is not None:
                self._set_meta(LAST_JOB_ID, str(top))
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
        with self._tx():
            if key is not None:
                self.db.execute(
                    "INSERT INTO submit_keys(key, job_id, time) VALUES (?,?,?)",
                    (key, template.id, time.time()),
                )
            self.db.execute(
                "INSERT INTO arrays(id, seq, active, indices, max_running, record) "
                "VALUES (?,?,1,?,?,?)",
                (template.id, seq, arrays.encode_indices(indices), max_running, record),
            )
            if event is not None:
                self._event(*event, None)
            if top is not None:
                self._set_meta(LAST_JOB_ID, str(top))
        self._counted(top)
        self._array_seq[template.id] = seq

    def get_array(self, array_id: str) -> tuple[Job, tuple[int, ...], int | None] | None:
        row = self.db.execute(
            "SELECT record, indices, max_running FROM arrays WHERE id=?", (array_id,)
        ).fetchone()
        if row is None:
            return None
        template = Job.from_record(json.loads(row[0]))
        return template, tuple(arrays.decode_indices(row[1])), row[2]

    def _array_record(self, array_id: str, reader: Any) -> str | None:
        db: sqlite3.Connection = reader or self.db
        row = db.execute("SELECT record FROM arrays WHERE id=?", (array_id,)).fetchone()
        return None if row is None else str(row[0])

    def load_active_jobs(self) -> list[Job]:
        found: list[tuple[int, int, Job]] = []
        cur = self.db.execute("SELECT seq, record FROM jobs WHERE state IN (?, ?)", ACTIVE_STATES)
        for seq, record in list(cur):
            job = self._job(record)
            found.append((seq, -1 if job.array_task_id is None else job.array_task_id, job))
        cur = self.db.execute(
            "SELECT id, seq, indices, max_running, record FROM arrays WHERE active=1"
        )
        for array_id, seq, indices, cap, record in list(cur):
            rowed = {r[0] for r in self.job_rows_with_prefix(array_id + "_", limit=-1)}
            template = Job.from_record(json.loads(record))
            left = [i for i in arrays.decode_indices(indices) if f"{array_id}_{i}" not in rowed]
            if not left:  # every task has its row: the array row is history only
                with self._tx():
                    self.db.execute("UPDATE arrays SET active=0 WHERE id=?", (array_id,))
                self._array_seq.pop(array_id, None)
                continue
            found += [(seq, t.array_task_id or 0, t) for t in arrays.tasks(template, left, cap)]
        found.sort(key=lambda f: (f[0], f[1]))
        return [f[2] for f in found]

    def has_job(self, job_id: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM jobs WHERE id=? UNION ALL SELECT 1 FROM arrays WHERE id=?",
            (job_id, job_id),
        ).fetchone()
        return row is not None

    def array_below(self, number: int) -> str | None:
        number = min(number, SQLITE_MAX_INT)  # a bigger one is below no stored id either
        row = self.db.execute(
            "SELECT id FROM arrays WHERE id GLOB '[1-9]*' AND id NOT GLOB '*[^0-9]*' "
            "AND CAST(id AS INTEGER) < ? ORDER BY CAST(id AS INTEGER) DESC LIMIT 1",
            (number,),
        ).fetchone()
        return None if row is None else str(row[0])

    def _job_record(self, job_id: str) -> str | None:
        row = self.db.execute("SELECT record FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def _job_records(self, job_ids: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for i in range(0, len(job_ids), 500):  # well under SQLite's bound-parameter limit
            part = job_ids[i : i + 500]
            cur = self.db.execute(
                f"SELECT id, record FROM jobs WHERE id IN ({','.join('?' * len(part))})", part
            )
            out += [(str(r[0]), str(r[1])) for r in cur]
        return out

    def job_rows_with_prefix(
        self, prefix: str, after: str = "", limit: int = 5000
    ) -> list[tuple[str, str, str]]:
        cur = self.db.execute(
            "SELECT id, state, user FROM jobs WHERE id > ? AND id < ? ORDER BY id LIMIT ?",
            (max(prefix, after), prefix + "\U0010ffff", limit),
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in cur]

    def finished_jobs(self, since: float | None = None, limit: int = 1000) -> list[Job]:
        cur = self.db.execute(
            "SELECT record FROM jobs WHERE state NOT IN (?, ?) AND end_time >= ? "
            "ORDER BY end_time DESC LIMIT ?",
            (*ACTIVE_STATES, since or 0.0, limit),
        )
        return [self._job(r[0]) for r in cur.fetchall()]

    def count_by_state(self) -> dict[str, int]:
        cur = self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {str(state): int(n) for state, n in cur}

    def read_finished(
        self,
        since: float,
        user: str | None = None,
        states: set[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """SQLite in WAL mode lets a read-only connection of its own read while the master
        writes."""
        where = ["state NOT IN (?, ?)", "end_time >= ?"]
        params: list[Any] = [*ACTIVE_STATES, since]
        if user:
            where.append("user = ?")
            params.append(user)
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params += sorted(states)
        sql = f"SELECT record FROM jobs WHERE {' AND '.join(where)} ORDER BY end_time DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        if self.path == MEMORY:
            return [self._job(r[0]) for r in self.db.execute(sql, params).fetchall()]
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=10)
        try:
            return [self._job(r[0], conn) for r in conn.execute(sql, params).fetchall()]
        finally:
            conn.close()

    def jobs_with_prefix(self, prefix: str) -> list[Job]:
        cur = self.db.execute(
            "SELECT record FROM jobs WHERE id >= ? AND id < ? ORDER BY seq",
            (prefix, prefix + "\U0010ffff"),
        )
        return [self._job(r[0]) for r in cur.fetchall()]

    # ---- nodes and meta ---------------------------------------------------

    def save_node(self, node_id: str, record: dict[str, Any]) -> None:
        with self._tx():
            self.db.execute(
                "INSERT INTO nodes(node_id, record) VALUES (?, ?) "
                "ON CONFLICT(node_id) DO UPDATE SET record=excluded.record",
                (node_id, json.dumps(record)),
            )

    def delete_node(self, node_id: str) -> None:
        with self._tx():
            self.db.execute("DELETE FROM nodes WHERE node_id=?", (node_id,))

    def load_nodes(self) -> dict[str, dict[str, Any]]:
        cur = self.db.execute("SELECT node_id, record FROM nodes")
        return {r[0]: json.loads(r[1]) for r in cur}

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx():
            self._set_meta(key, value)

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    def record_event(
        self,
        kind: str,
        actor: str | None = None,
        address: str | None = None,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        with self._tx():
            self._event(kind, actor, address, target, detail)

    def record_events(
        self, rows: list[tuple[str, str | None, str | None, str | None, str | None]]
    ) -> None:
        now = time.time()
        with self._tx():
            self.db.executemany(
                "INSERT INTO events(time, kind, actor, address, target, detail) "
                "VALUES (?,?,?,?,?,?)",
                [(now, *row) for row in rows],
            )

    def events(self, since: float = 0.0, limit: int = 1000) -> list[dict[str, Any]]:
        cur = self.db.execute(
            "SELECT time, kind, actor, address, target, detail FROM events "
            "WHERE time >= ? ORDER BY id DESC LIMIT ?",
            (since, limit),
        )
        keys = ("time", "kind", "actor", "address", "target", "detail")
        return [dict(zip(keys, r, strict=True)) for r in cur]

    # ---- retention --------------------------------------------------------

    def users_of(self, job_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ",".join("?" * len(part))
            cur = self.db.execute(f"SELECT id, user FROM jobs WHERE id IN ({marks})", part)
            out.update((str(i), str(u)) for i, u in cur)
        return out

    def ended_between(
        self, after: tuple[float, str], before: float, limit: int
    ) -> list[tuple[str, str, float]]:
        end, job_id = after
        cur = self.db.execute(
            "SELECT id, user, end_time FROM jobs WHERE end_time >= ? AND end_time < ? "
            "AND (end_time > ? OR id > ?) AND state NOT IN (?, ?) "
            "ORDER BY end_time, id LIMIT ?",
            (end, before, end, job_id, *ACTIVE_STATES, limit),
        )
        return [(str(i), str(u), float(t)) for i, u, t in cur]

    def delete_ended_jobs(self, before: float, limit: int) -> list[tuple[str, str]]:
        with self._tx():
            rows = [
                (str(i), str(u))
                for i, u in self.db.execute(
                    "SELECT id, user FROM jobs WHERE end_time < ? AND state NOT IN (?, ?) "
                    "ORDER BY end_time LIMIT ?",
                    (before, *ACTIVE_STATES, limit),
                )
            ]
            self.db.executemany("DELETE FROM jobs WHERE id=?", [(i,) for i, _ in rows])
        for job_id, _ in rows:
            self._ended.pop(job_id, None)
        return rows

    def job_of_submit_key(self, key: str) -> str | None:
        row = self.db.execute("SELECT job_id FROM submit_keys WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def delete_submit_keys_before(self, before: float, limit: int) -> int:
        with self._tx():
            cur = self.db.execute(
                "DELETE FROM submit_keys WHERE key IN "
                "(SELECT key FROM submit_keys WHERE time < ? ORDER BY time LIMIT ?)",
                (before, limit),
            )
        return int(cur.rowcount)

    def delete_events_before(self, before: float, limit: int) -> int:
        with self._tx():
            cur = self.db.execute(
                "DELETE FROM events WHERE id IN "
                "(SELECT id FROM events WHERE time < ? ORDER BY id LIMIT ?)",
                (before, limit),
            )
        return int(cur.rowcount)

    # ---- reservations -----------------------------------------------------

    def save_reservation(
        self, name: str, record: dict[str, Any], event: tuple[str, str | None, str | None]
    ) -> None:
        with self._tx():
            self.db.execute(
                "INSERT INTO reservations(name, record) VALUES (?, ?)", (name, json.dumps(record))
            )
            self._event(*event, name, None)

    def delete_reservations(
        self, names: list[str], event: tuple[str, str | None, str | None] | None = None
    ) -> None:
        with self._tx():
            for name in names:
                self.db.execute("DELETE FROM reservations WHERE name=?", (name,))
                if event is not None:
                    self._event(*event, name, None)

    def load_reservations(self) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT record FROM reservations ORDER BY name")
        return [json.loads(r[0]) for r in cur]

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
        with self._tx():
            self.db.execute(
                "INSERT INTO tokens(id, user, admin, kind, hash, created, owner, allow_root) "
                "VALUES (?,?,?,?,?,?,?,?)",
                (token_id, user, int(admin), kind, digest, created, int(owner), int(allow_root)),
            )

    def token_by_hash(self, digest: str, kind: str) -> TokenRow | None:
        row = self.db.execute(
            "SELECT id, user, admin, hash, owner, allow_root FROM tokens "
            "WHERE hash=? AND kind=? AND revoked IS NULL",
            (digest, kind),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), *row[2:])

    def token_guard(self, token_id: str) -> tuple[bool, str] | None:
        row = self.db.execute(
            "SELECT owner, kind FROM tokens WHERE id=? AND revoked IS NULL", (token_id,)
        ).fetchone()
        return None if row is None else (bool(row[0]), str(row[1]))

    def revoke_token(self, token_id: str, when: float) -> bool:
        with self._tx():
            cur = self.db.execute(
                "UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (when, token_id)
            )
        return cur.rowcount > 0

    def list_tokens(self) -> list[dict[str, Any]]:
        cur = self.db.execute(
            "SELECT id, user, admin, kind, created, revoked, owner, allow_root FROM tokens "
            "ORDER BY created"
        )
        return [
            {**dict(zip(TOKEN_KEYS, r, strict=True)), "owner": bool(r[6]), "allow_root": bool(r[7])}
            for r in cur
        ]

    def has_owner_token(self) -> bool:
        return self.db.execute("SELECT 1 FROM tokens WHERE owner=1").fetchone() is not None

    def mark_owner_token(self, digest: str) -> None:
        with self._tx():
            self.db.execute(
                "UPDATE tokens SET owner=1, allow_root=1 WHERE hash=? AND kind='user' AND admin=1",
                (digest,),
            )

    # ---- node secrets -----------------------------------------------------

    def node_secret_hash(self, node_id: str) -> str | None:
        query = "SELECT hash FROM node_secrets WHERE node_id=?"
        row = self.db.execute(query, (node_id,)).fetchone()
        return None if row is None else str(row[0])

    def set_node_secret(self, node_id: str, digest: str, created: float) -> None:
        with self._tx():
            self.db.execute(
                "INSERT INTO node_secrets(node_id, hash, created) VALUES (?,?,?) "
                "ON CONFLICT(node_id) DO UPDATE SET hash=excluded.hash, created=excluded.created",
                (node_id, digest, created),
            )

    def forget_node_secret(self, node_id: str) -> bool:
        with self._tx():
            cur = self.db.execute("DELETE FROM node_secrets WHERE node_id=?", (node_id,))
        return cur.rowcount > 0

    # ---- helpers ----------------------------------------------------------

    def _event(
        self,
        kind: str,
        actor: str | None,
        address: str | None,
        target: str | None,
        detail: str | None,
    ) -> None:
        self.db.execute(
            "INSERT INTO events(time, kind, actor, address, target, detail) VALUES (?,?,?,?,?,?)",
            (time.time(), kind, actor, address, target, detail),
        )

    class _Tx:
        def __init__(self, store: SqliteStore) -> None:
            self.store = store

        def __enter__(self) -> None:
            self.store.db.execute("BEGIN")
            self.store.fence.check(self.store.db)  # no generation: nothing to check

        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            self.store.db.execute("COMMIT" if exc_type is None else "ROLLBACK")

    def _tx(self) -> SqliteStore._Tx:
        return SqliteStore._Tx(self)
