"""The store's tables and its one list of migrations, for both backends (dialect.py
renders them: column types, the migration's lock).

`migrate` brings a database to SCHEMA_VERSION in one transaction, each migration in
order: MIGRATIONS[i] takes version i to i + 1.  Version 1 is the tables as mgpu made
them before versions (IF NOT EXISTS: an older database keeps its rows; a SQLite state
dir of then gets the token grant columns added), 2 added `submit_keys`, 3 `job_steps`
(steps.py moves the steps out of the job records), 4 `live_steps` (the steps running jobs
run, for a master that takes over: steps.py), `request_keys` (job-control requests'
idempotency keys: control/requestkeys.py) and a submit's key made one user's (`submit_keys`
keyed by user and key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mgpu.master.store import steps
from mgpu.master.store.base import SCHEMA_VERSION, StoreError
from mgpu.master.store.dialect import Dialect, many

__all__ = ["MIGRATIONS", "STORE_TABLES", "migrate"]

TABLES = (
    """CREATE TABLE IF NOT EXISTS jobs (
    id {key} PRIMARY KEY,
    seq {bigint} NOT NULL,
    state TEXT NOT NULL,
    "user" TEXT NOT NULL,
    submit_time {real} NOT NULL,
    end_time {real},
    record TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)",
    "CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time)",
    """CREATE TABLE IF NOT EXISTS arrays (
    id {key} PRIMARY KEY,
    seq {bigint} NOT NULL,
    active {int} NOT NULL,
    indices TEXT NOT NULL,
    max_running {int},
    record TEXT NOT NULL
)""",
    "CREATE TABLE IF NOT EXISTS nodes (node_id {key} PRIMARY KEY, record TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key {key} PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reservations (name {key} PRIMARY KEY, record TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS events (
    id {serial},
    time {real} NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT,
    address TEXT,
    target TEXT,
    detail TEXT
)""",
    """CREATE TABLE IF NOT EXISTS tokens (
    id {key} PRIMARY KEY,
    "user" TEXT NOT NULL,
    admin {int} NOT NULL,
    kind TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created {real} NOT NULL,
    revoked {real},
    owner {int} NOT NULL DEFAULT 0,
    allow_root {int} NOT NULL DEFAULT 0
)""",
    """CREATE TABLE IF NOT EXISTS node_secrets (
    node_id {key} PRIMARY KEY,
    hash TEXT NOT NULL,
    created {real} NOT NULL
)""",
)

GRANT_COLUMNS = ("owner", "allow_root")
"""Token columns added after the first release: a state dir made before lacks them."""

SUBMIT_KEYS = (
    "CREATE TABLE IF NOT EXISTS submit_keys "
    "(key {key} PRIMARY KEY, job_id TEXT NOT NULL, time {real} NOT NULL)",
    "CREATE INDEX IF NOT EXISTS submit_keys_time ON submit_keys(time)",
)

JOB_STEPS = """CREATE TABLE IF NOT EXISTS job_steps (
    job_id {key} NOT NULL,
    number {bigint} NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (job_id, number)
)"""

LIVE_STEPS = (
    """CREATE TABLE IF NOT EXISTS live_steps (
    id {key} PRIMARY KEY,
    job_id {key} NOT NULL,
    record TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS live_steps_job ON live_steps(job_id)",
)

KEYED_BY_USER = (
    """CREATE TABLE IF NOT EXISTS request_keys (
    "user" {key} NOT NULL,
    key {key} NOT NULL,
    answer TEXT NOT NULL,
    time {real} NOT NULL,
    PRIMARY KEY ("user", key)
)""",
    "CREATE INDEX IF NOT EXISTS request_keys_time ON request_keys(time)",
    """CREATE TABLE submit_keys_by_user (
    "user" {key} NOT NULL,
    key {key} NOT NULL,
    job_id TEXT NOT NULL,
    time {real} NOT NULL,
    PRIMARY KEY ("user", key)
)""",
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


def _to_1(conn: Any, d: Dialect) -> None:
    for statement in TABLES:
        conn.execute(d.ddl(statement))
    for statement in d.extra_tables:
        conn.execute(statement)
    have = {str(r[0]) for r in conn.execute(d.sql(d.columns_of), ("tokens",)).fetchall()}
    for column in GRANT_COLUMNS:
        if column not in have:
            conn.execute(f"ALTER TABLE tokens ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")


def _to_2(conn: Any, d: Dialect) -> None:
    for statement in SUBMIT_KEYS:
        conn.execute(d.ddl(statement))


def _to_3(conn: Any, d: Dialect) -> None:
    """The steps table, and every stored job's steps moved into it (all of them or none)."""
    conn.execute(d.ddl(JOB_STEPS))
    found = conn.execute(d.sql(steps.WITH_STEPS), steps.WITH_STEPS_ARGS).fetchall()
    moved, records = steps.moved_out(found)
    many(conn, d.sql(steps.UPSERT), steps.upsert_rows(moved))
    many(conn, d.sql(steps.REWRITE), records)


def _to_4(conn: Any, d: Dialect) -> None:
    """The running steps' table, the requests' keys, and each submit's key made its user's
    (a key another user sent too is theirs apart, not a refusal: the old rows keep their
    job's user)."""
    for statement in (*LIVE_STEPS, *KEYED_BY_USER):
        conn.execute(d.ddl(statement))
    found = conn.execute(
        'SELECT k.key, k.job_id, k.time, j."user", a.record FROM submit_keys k '
        "LEFT JOIN jobs j ON j.id = k.job_id LEFT JOIN arrays a ON a.id = k.job_id"
    ).fetchall()
    rows = [(_user_of(user, array), key, job_id, at) for key, job_id, at, user, array in found]
    insert = 'INSERT INTO submit_keys_by_user("user", key, job_id, time) VALUES (?,?,?,?)'
    many(conn, d.sql(insert), [r for r in rows if r[0] is not None])
    conn.execute("DROP TABLE submit_keys")
    conn.execute("ALTER TABLE submit_keys_by_user RENAME TO submit_keys")
    conn.execute(d.ddl(SUBMIT_KEYS[1]))


def _user_of(user: Any, array_record: Any) -> str | None:
    """A stored key's user: its job's, or its array's (in the array's record)."""
    if user is not None:
        return str(user)
    if array_record is None:
        return None  # its job is gone: the key is too
    found = json.loads(array_record).get("user")
    return None if found is None else str(found)


MIGRATIONS: tuple[Callable[[Any, Dialect], None], ...] = (_to_1, _to_2, _to_3, _to_4)
"""MIGRATIONS[i] takes a database from version i to i + 1."""


def migrate(conn: Any, d: Dialect, where: str) -> None:
    """Bring the database to SCHEMA_VERSION, each migration in order, in one transaction
    (`conn`, either driver's, in autocommit mode; `where`: its name for an error)."""
    for statement in d.begin_migration:
        conn.execute(statement)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        version = int(row[0] or 0) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{where} has schema version {version}, newer than this mgpu's "
                f"({SCHEMA_VERSION}): run a newer mgpu"
            )
        for step in MIGRATIONS[version:]:
            step(conn, d)
        if version < SCHEMA_VERSION:
            conn.execute("DELETE FROM schema_version")
            conn.execute(d.sql("INSERT INTO schema_version VALUES (?)"), (SCHEMA_VERSION,))
    except BaseException:
        if not getattr(conn, "closed", False) and not getattr(conn, "broken", False):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
