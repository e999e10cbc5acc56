"""The master's durable state (base.py: the interface; schema.py, sqlstore.py and dialect.py:
its SQL, written once; sqlite.py and postgres.py: the two backends that run it), and
`open_store`, which picks one from the `--database` address."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mgpu.master.store.base import Store
    from mgpu.master.store.pglink import Link

__all__ = ["DB_FILE", "open_store"]

DB_FILE = "mgpu.db"
"""The SQLite store's file in the state dir."""


def open_store(
    database: str | None,
    state_dir: Path,
    retry_for: float | None = None,
    link: Link | None = None,
) -> Store:
    """The store: SQLite at `state_dir/mgpu.db` when `database` is None or empty, else the
    PostgreSQL database at that address (`postgresql://USER@HOST:PORT/DB`, or libpq's
    keyword form).  Raises StoreError (one sentence, never the password) for an address
    libpq cannot read or a database it cannot use.
    `retry_for`: seconds PostgreSQL may be unreachable before a call fails (default 60);
    `link`: how PostgreSQL connections are opened (store/pglink.py; a leader's, tagged)."""
    if not database:
        from mgpu.master.store.sqlite import SqliteStore

        return SqliteStore(state_dir / DB_FILE)
    from mgpu.dbaddress import AddressError, parse
    from mgpu.master.store.base import StoreError

    try:
        parse(database)
    except AddressError as e:
        raise StoreError(str(e)) from None
    from mgpu.master.store.postgres import RETRY_FOR, PostgresStore

    return PostgresStore(database, RETRY_FOR if retry_for is None else retry_for, link)
