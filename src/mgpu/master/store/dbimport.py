"""`mgpu db import STATE_DIR --database URL`: a SQLite cluster's state into PostgreSQL.

A lab that started with one master (SQLite in its state dir) moves to a shared database
without losing its history or its tokens: every table of the store (jobs, arrays, nodes,
meta with the job id counter, reservations, the audit log, tokens, node secrets, the jobs'
srun steps) is copied, in one transaction, into a database that holds no state yet (one
with state is refused: two clusters' rows must not mix).  The source is read from a copy
taken with SQLite's backup API (a master may still run on it; it is never written) and
migrated in memory to this mgpu's schema first, so a state dir of any older version
imports.

Hooks copy what is not in the store's tables (job output files, the cluster's identity):
each gets the state dir and the PostgreSQL connection inside the import's transaction and
returns what it copied, by name.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from mgpu.master.store.base import StoreError
from mgpu.master.store.postgres import PostgresStore
from mgpu.master.store.sqlite import migrate

__all__ = ["COLUMNS", "HOOKS", "ImportHook", "import_state"]

ImportHook = Callable[[Path, "psycopg.Connection[Any]"], dict[str, int]]
"""Copies more of the state dir inside the import's transaction; its counts by name."""

HOOKS: list[ImportHook] = []
"""Run after the tables, in order (job output: store/outputs.py; the cluster's identity:
the HA module): each registers itself here, or the caller passes its own list."""

COLUMNS: dict[str, tuple[str, ...]] = {
    "jobs": ("id", "seq", "state", "user", "submit_time", "end_time", "record"),
    "arrays": ("id", "seq", "active", "indices", "max_running", "record"),
    "nodes": ("node_id", "record"),
    "meta": ("key", "value"),
    "reservations": ("name", "record"),
    "events": ("id", "time", "kind", "actor", "address", "target", "detail"),
    "tokens": (
        "id",
        "user",
        "admin",
        "kind",
        "hash",
        "created",
        "revoked",
        "owner",
        "allow_root",
    ),
    "node_secrets": ("node_id", "hash", "created"),
    "job_steps": ("job_id", "number", "record"),
}
"""The tables copied, and their columns (the same names in both backends)."""


def _read_source(path: Path) -> sqlite3.Connection:
    """The SQLite store at `path` as an in-memory copy at this mgpu's schema version."""
    if not path.is_file():
        raise StoreError(f"{path} does not exist: give the state dir of a master that used SQLite")
    try:
        source = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
        # Read in the PostgreSQL store's thread (store/dbthread.py), one thread at a time.
        copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            source.backup(copy)
        finally:
            source.close()
        migrate(copy, str(path))
    except sqlite3.Error as e:
        raise StoreError(f"cannot read {path}: {e}") from None
    return copy


def import_state(
    state_dir: Path, url: str, hooks: Sequence[ImportHook] | None = None
) -> dict[str, int]:
    """Copy the SQLite store of `state_dir` into the empty PostgreSQL database at `url`, in
    one transaction; what was copied, by table (and by each hook's names)."""
    source = _read_source(state_dir / "mgpu.db")
    target = PostgresStore(url)
    try:
        if not target.is_empty():
            raise StoreError(
                f"the database {target.where} already holds a cluster's state: "
                "mgpu db import copies into an empty database only"
            )

        def work(conn: psycopg.Connection[Any]) -> dict[str, int]:
            counts: dict[str, int] = {}
            for table, columns in COLUMNS.items():
                names = ", ".join(f'"{c}"' for c in columns)
                rows = source.execute(f"SELECT {names} FROM {table} ORDER BY rowid")
                n = 0
                with conn.cursor() as cur, cur.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                        n += 1
                counts[table] = n
            conn.execute(
                "SELECT setval(pg_get_serial_sequence('events', 'id'), "
                "COALESCE((SELECT MAX(id) FROM events), 0) + 1, false)"
            )
            for hook in HOOKS if hooks is None else hooks:
                counts.update(hook(state_dir, conn))
            return counts

        try:
            return target.write_in_one(work)
        except psycopg.Error as e:
            message = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StoreError(f"the import into {target.where} failed: {message}") from None
    finally:
        target.close()
        source.close()
