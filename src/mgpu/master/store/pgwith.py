"""Several inserts as one PostgreSQL statement: each a data-modifying `WITH` query, the
fence's check the main one.

A submit writes a few rows to four tables (its job, its audit event, the job-id counter,
its idempotency key).  Sent as that many statements, each is parsed and planned again on
every submit, and the server spends more on that than on the rows.  As one statement
with parameters it is parsed once per shape and then runs prepared (psycopg prepares a
query it has seen a few times): half the server's time a submit, and one round trip.

PostgreSQL runs every `WITH` insert to completion, in one snapshot, and the statement
fails whole if any part does (the check included): what the statements in one
transaction did.  What one statement cannot do is touch a row twice, so `statement` only
takes parts that each write another table, insert each row with `VALUES`, and never
upsert one key twice; else it answers None and the caller sends the statements one by
one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["statement"]

_INSERT = re.compile(
    r"INSERT INTO\s+(?P<table>\w+)\s*\((?P<columns>[^)]*)\)\s*"
    r"VALUES\s*(?P<values>\((?:\s*%s\s*,)*\s*%s\s*\))(?P<rest>.*)",
    re.DOTALL,
)
_CONFLICT = re.compile(r"ON CONFLICT\s*\((?P<target>[^)]*)\)\s*DO UPDATE")


Parts = Sequence[tuple[str, Sequence[Sequence[Any]]]]
Shape = tuple[tuple[str, int], ...]
"""Each part's INSERT and how many rows it has: what the statement's text depends on."""


def statement(parts: Parts, check: str | None) -> tuple[str, list[Any]] | None:
    """`parts` (an INSERT with `%s` placeholders, its rows) and `check` (None: nothing to
    check) as one query and its parameters; None where one statement would not do what
    the statements one by one do (module docstring)."""
    made = _made(tuple((sql, len(rows)) for sql, rows in parts), check)
    if made is None:
        return None
    text, keys = made
    for (_, rows), at in zip(parts, keys, strict=True):
        if at is not None and len({tuple(row[i] for i in at) for row in rows}) < len(rows):
            return None  # one statement may not update a row twice
    return text, [value for _, rows in parts for row in rows for value in row]


@functools.lru_cache(maxsize=256)
def _made(shape: Shape, check: str | None) -> tuple[str, list[tuple[int, ...] | None]] | None:
    """The statement's text for parts of this shape, and where each part's rows have
    the key of an `ON CONFLICT (...) DO UPDATE` (None: no such key); None if the parts
    cannot be one statement.  Made once per shape: a master sees a few."""
    withs: list[str] = []
    keys: list[tuple[int, ...] | None] = []
    tables: set[str] = set()
    for i, (sql, count) in enumerate(shape):
        found = _INSERT.fullmatch(sql.strip())
        if found is None or (count and found["table"] in tables):
            return None
        keys.append(_conflict_key(found["columns"], found["rest"]))
        if not count:
            continue
        tables.add(found["table"])
        values = ",".join([found["values"]] * count)
        insert = f"INSERT INTO {found['table']}({found['columns']}) VALUES {values}"
        withs.append(f"w{i} AS ({insert}{found['rest']})")
    if not withs or () in keys:
        return None
    return f"WITH {', '.join(withs)} {check or 'SELECT 1'}", keys


def _conflict_key(columns: str, rest: str) -> tuple[int, ...] | None:
    """Where the key of an `ON CONFLICT (...) DO UPDATE` is among the columns (None: no
    such clause; () a target that is not a column, which the caller does not guess at)."""
    conflict = _CONFLICT.search(rest)
    if conflict is None:
        return None
    names = [c.strip() for c in columns.split(",")]
    try:
        return tuple(names.index(c.strip()) for c in conflict["target"].split(","))
    except ValueError:
        return ()
