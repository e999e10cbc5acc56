"""The master's durable state in SQLite, WAL mode, under the state dir (the default store).

The master writes a job here after every state change and before acting on it.
`synchronous=NORMAL` in WAL mode survives a crash or kill -9 of the master (the WAL is in
the OS page cache); only a power loss can drop the last transactions, which is the
trade-off Slurm's own state save makes too.  One master owns the file: its fence never
has a generation (store/fence.py).  The queries and the schema are sqlstore.py's and
schema.py's, shared with PostgreSQL; here only the connection and its transactions.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mgpu.master.store.base import LAST_JOB_ID, RECENTLY_ENDED, SCRIPT_OF_ARRAY
from mgpu.master.store.dialect import SQLITE
from mgpu.master.store.schema import migrate as migrate_schema
from mgpu.master.store.sqlstore import SqlStore
from mgpu.master.store.walcheckpoint import Checkpointer

__all__ = [
    "LAST_JOB_ID",
    "MEMORY",
    "RECENTLY_ENDED",
    "SCRIPT_OF_ARRAY",
    "SqliteStore",
    "migrate",
]

T = TypeVar("T")

MEMORY = ":memory:"
"""A store that lives in memory only (the controller tests)."""

SYNCHRONOUS_ENV = "MGPU_TEST_SQLITE_SYNCHRONOUS"
"""A benchmark's diagnostic, never set in use (bench/failover.py): `FULL` makes every
commit wait for the disk, as PostgreSQL's durable commit does; else NORMAL (above)."""


def synchronous() -> str:
    """The `synchronous` setting the store runs with: NORMAL, or FULL for the diagnostic."""
    return "FULL" if os.environ.get(SYNCHRONOUS_ENV) == "FULL" else "NORMAL"


def migrate(db: sqlite3.Connection, where: str) -> None:
    """Bring the database to SCHEMA_VERSION (schema.py), in one transaction (`db` in
    autocommit mode; `where`: its name for an error)."""
    migrate_schema(db, SQLITE, where)


class SqliteStore(SqlStore):
    dialect = SQLITE

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = path
        if path != MEMORY:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous()}")
        self._checkpointer: Checkpointer | None = None
        if path != MEMORY:  # checkpoints off the event loop (walcheckpoint.py)
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = Checkpointer(path)
            self._checkpointer.start()
        try:
            migrate(self.db, str(self.path))
        except BaseException:
            self.close()
            raise
        self.reload()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self.db.close()

    # ---- sqlstore.py's primitives -----------------------------------------

    def _read(self, work: Callable[[Any], T]) -> T:
        return work(self.db)

    def _read_apart(self, work: Callable[[Any], T]) -> T:
        """SQLite in WAL mode lets a read-only connection of its own read while the master
        writes."""
        if self.path == MEMORY:
            return work(self.db)
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=10)
        try:
            return work(conn)
        finally:
            conn.close()

    def _write(self, work: Callable[[Any], T], one_query: bool = False) -> T:
        with self._tx():
            return work(self.db)

    def _write_rows(self, parts: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        if not any(rows for _, rows in parts):
            return
        with self._tx():
            for sql, rows in parts:
                if rows:
                    self.db.executemany(sql, rows)

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
