"""The master's durable state (base.py: the interface; sqlite.py and postgres.py: the two
implementations), and `open_store`, which picks one from the `--database` URL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mgpu.master.store.base import Store

__all__ = ["DB_FILE", "open_store"]

DB_FILE = "mgpu.db"
"""The SQLite store's file in the state dir."""

SCHEMES = ("postgresql://", "postgres://")


def open_store(database: str | None, state_dir: Path, retry_for: float | None = None) -> Store:
    """The store: SQLite at `state_dir/mgpu.db` when `database` is None or empty, else the
    PostgreSQL database at that URL (`postgresql://USER@HOST:PORT/DB`).  Raises StoreError
    (one sentence, the password left out) for any other URL or a database it cannot use.
    `retry_for`: seconds PostgreSQL may be unreachable before a call fails (default 60)."""
    from mgpu.master.store.base import StoreError, hide_password

    if not database:
        from mgpu.master.store.sqlite import SqliteStore

        return SqliteStore(state_dir / DB_FILE)
    if not database.startswith(SCHEMES):
        raise StoreError(
            f"--database {hide_password(database)} is not a PostgreSQL URL: give "
            "postgresql://USER@HOST:PORT/DB, or leave it out to keep the state in SQLite"
        )
    from mgpu.master.store.postgres import RETRY_FOR, PostgresStore

    return PostgresStore(database, RETRY_FOR if retry_for is None else retry_for)
