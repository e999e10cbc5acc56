"""The store's SQL is written once (store/schema.py, store/sqlstore.py) and what differs
between SQLite and PostgreSQL sits in store/dialect.py alone: the shared modules hold no
backend's own spelling, and the dialects turn the one spelling into each backend's."""

from __future__ import annotations

import re
from pathlib import Path

from mgpu.master.store import dialect
from mgpu.master.store.dialect import IN_CHUNK, POSTGRES, SQLITE

STORE = Path(dialect.__file__).parent

BACKEND_ONLY = {
    "a PostgreSQL placeholder": r"%s",
    "a driver": r"\b(psycopg|sqlite3)\b",
    "SQLite's GLOB": r"\bGLOB\b",
    "PostgreSQL's ANY": r"\bANY\(",
    "PostgreSQL's GREATEST": r"\bGREATEST\b",
    "a column type of one backend": r"\b(BIGSERIAL|AUTOINCREMENT|DOUBLE PRECISION|COLLATE)\b",
    "a PostgreSQL cast": r"::",
    "a PostgreSQL advisory lock": r"pg_advisory",
}


def test_the_shared_schema_and_queries_spell_nothing_one_backend_only_reads() -> None:
    found = [
        f"{name}: {what}"
        for name in ("schema.py", "sqlstore.py", "steps.py")
        for what, pattern in BACKEND_ONLY.items()
        if re.search(pattern, (STORE / name).read_text(encoding="utf-8"))
    ]
    assert not found, "move these into store/dialect.py: " + "; ".join(found)


def test_each_dialect_spells_the_one_query_its_way() -> None:
    query = "SELECT record FROM jobs WHERE id=? AND state=?"
    assert SQLITE.sql(query) == query
    assert POSTGRES.sql(query) == "SELECT record FROM jobs WHERE id=%s AND state=%s"
    template = "CREATE TABLE t (id {key} PRIMARY KEY, n {bigint}, at {real}, e {serial})"
    assert SQLITE.ddl(template) == (
        "CREATE TABLE t (id TEXT PRIMARY KEY, n INTEGER, at REAL, "
        "e INTEGER PRIMARY KEY AUTOINCREMENT)"
    )
    assert POSTGRES.ddl(template) == (
        'CREATE TABLE t (id TEXT COLLATE "C" PRIMARY KEY, n BIGINT, at DOUBLE PRECISION, '
        "e BIGSERIAL PRIMARY KEY)"
    )


def test_a_long_list_is_one_array_on_postgresql_and_bounded_chunks_on_sqlite() -> None:
    ids = [str(i) for i in range(IN_CHUNK * 2 + 1)]
    assert POSTGRES.in_list("id", ids) == [("id = ANY(?)", [ids])]
    chunks = SQLITE.in_list("id", ids)
    assert [len(params) for _, params in chunks] == [IN_CHUNK, IN_CHUNK, 1]
    assert [v for _, params in chunks for v in params] == ids
    assert chunks[2][0] == "id IN (?)"
    assert SQLITE.in_list("id", []) == POSTGRES.in_list("id", []) == []
