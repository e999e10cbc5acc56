"""What differs between the store's two SQL backends, and nothing else (the kine way).

The schema (schema.py) and every query (sqlstore.py) are written once, in SQLite's
spelling with `?` placeholders; a `Dialect` turns them into each backend's: PostgreSQL's
`%s` placeholders, its column types (`TEXT COLLATE "C"` keys sort by their bytes, as
SQLite's do), `GREATEST` for SQLite's two-argument `MAX`, regular expressions for
SQLite's GLOBs, `= ANY(array)` for long `IN` lists, and the migration's lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mgpu.master.store.fence import LEASE_SCHEMA

__all__ = ["POSTGRES", "SQLITE", "Dialect", "many"]

IN_CHUNK = 500
"""Values bound in one `IN (...)` list on SQLite: well under its bound-parameter limit."""

MIGRATION_LOCK = 0x6D677075  # "mgpu": PostgreSQL masters starting together migrate in turn


@dataclass(frozen=True)
class Dialect:
    name: str
    types: dict[str, str]
    """Column types of schema.py's templates: key, int, bigint, real, serial."""
    greatest: str
    """The larger of two values."""
    eight_digits: str
    """`id` is eight decimal digits."""
    positive_number: str
    """`id` is a decimal number without leading zeros."""
    as_number: str
    """`id` as a number (only where `positive_number` holds)."""
    no_limit: int | None
    """A LIMIT that limits nothing."""
    max_int: int | None
    """The largest integer the driver binds (None: any)."""
    any_array: bool
    """`col = ANY(?)` with a list, rather than `IN (?, ?, ...)` in chunks."""
    begin_migration: tuple[str, ...]
    """The statements that start the migration's transaction and take its lock."""
    extra_tables: tuple[str, ...] = field(default=())
    """Tables only this backend has (the lease of a fenced master: store/fence.py)."""
    columns_of: str = ""
    """A query for the column names of table `?`."""

    def sql(self, text: str) -> str:
        """A query written with `?` placeholders, in this dialect."""
        return _postgres(text) if self.name == "postgres" else text

    def ddl(self, template: str) -> str:
        """A CREATE statement of schema.py with this dialect's column types."""
        return template.format(**self.types)

    def in_list(self, column: str, values: Sequence[Any]) -> list[tuple[str, list[Any]]]:
        """`column` is one of `values`: (condition, its parameters), one or more (each
        run apart); none for no values."""
        values = list(values)
        if not values:
            return []
        if self.any_array:
            return [(f"{column} = ANY(?)", [values])]
        return [
            (f"{column} IN ({','.join('?' * len(part))})", part)
            for part in (values[i : i + IN_CHUNK] for i in range(0, len(values), IN_CHUNK))
        ]


@lru_cache(maxsize=512)
def _postgres(text: str) -> str:
    return text.replace("?", "%s")


def many(conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """`sql` for each of `rows` on a sqlite3 or psycopg connection (nothing for none)."""
    if rows:
        cur = conn.cursor()
        try:
            cur.executemany(sql, rows)
        finally:
            cur.close()


SQLITE = Dialect(
    name="sqlite",
    types={
        "key": "TEXT",
        "int": "INTEGER",
        "bigint": "INTEGER",
        "real": "REAL",
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
    },
    greatest="MAX",
    eight_digits="length(id) = 8 AND id NOT GLOB '*[^0-9]*'",
    positive_number="id GLOB '[1-9]*' AND id NOT GLOB '*[^0-9]*'",
    as_number="CAST(id AS INTEGER)",
    no_limit=-1,
    max_int=2**63 - 1,
    any_array=False,
    begin_migration=("BEGIN IMMEDIATE",),
    columns_of="SELECT name FROM pragma_table_info(?)",
)

POSTGRES = Dialect(
    name="postgres",
    types={
        "key": 'TEXT COLLATE "C"',
        "int": "INTEGER",
        "bigint": "BIGINT",
        "real": "DOUBLE PRECISION",
        "serial": "BIGSERIAL PRIMARY KEY",
    },
    greatest="GREATEST",
    eight_digits="id ~ '^[0-9]{8}$'",
    positive_number="id ~ '^[1-9][0-9]*$'",
    as_number="id::numeric",
    no_limit=None,
    max_int=None,
    any_array=True,
    begin_migration=("BEGIN", f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"),
    extra_tables=(LEASE_SCHEMA,),
    columns_of="SELECT column_name FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name = ?",
)
