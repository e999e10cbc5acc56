"""Several inserts as one PostgreSQL statement (master/store/pgwith.py): the same rows as
the statements one by one, the fence's check failing the whole, and no statement where
one would not do what they do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from mgpu.master.store.fence import LEASE_SCHEMA, Fence, Fenced
from mgpu.master.store.pgwith import statement

JOB = (
    "INSERT INTO job(id, state) VALUES (%s, %s) ON CONFLICT(id) DO UPDATE SET state=excluded.state"
)
EVENT = "INSERT INTO event(kind, target) VALUES (%s,%s)"
KEY = "INSERT INTO key(k, job) VALUES (%s, %s) ON CONFLICT (k) DO NOTHING"

Parts = Sequence[tuple[str, Sequence[Sequence[Any]]]]


def test_each_part_is_a_with_query_and_the_check_the_main_one() -> None:
    made = statement([(JOB, [("a", "q"), ("b", "q")]), (EVENT, [("submit", "a")])], "SELECT 7")
    assert made is not None
    text, params = made
    assert text == (
        "WITH w0 AS (INSERT INTO job(id, state) VALUES (%s, %s),(%s, %s) "
        "ON CONFLICT(id) DO UPDATE SET state=excluded.state), "
        "w1 AS (INSERT INTO event(kind, target) VALUES (%s,%s)) SELECT 7"
    )
    assert params == ["a", "q", "b", "q", "submit", "a"]
    unchecked = statement([(EVENT, [("x", "y")]), (KEY, [])], None)
    text = "WITH w0 AS (INSERT INTO event(kind, target) VALUES (%s,%s)) SELECT 1"
    assert unchecked == (text, ["x", "y"])


@pytest.mark.parametrize(
    "parts",
    [
        [(JOB, [("a", "q"), ("a", "r")])],  # one key upserted twice: one statement cannot
        [(EVENT, [("x", "a")]), (EVENT, [("y", "b")])],  # one table twice
        [("INSERT INTO event(kind, target) VALUES (%s, now())", [("x",)])],  # not only values
        [("DELETE FROM job WHERE id = %s", [("a",)])],
        [(EVENT, [])],  # nothing to write
    ],
)
def test_parts_one_statement_would_not_write_as_they_do_get_none(parts: Parts) -> None:
    assert statement(parts, None) is None


def test_an_insert_that_skips_a_key_twice_may_be_one_statement() -> None:
    assert statement([(KEY, [("k", "a"), ("k", "b")])], None) is not None


@pytest.fixture
def db(pg_url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(pg_url, autocommit=True)
    conn.execute("CREATE TABLE job (id TEXT PRIMARY KEY, state TEXT NOT NULL)")
    conn.execute("CREATE TABLE event (n SERIAL, kind TEXT, target TEXT)")
    conn.execute("CREATE TABLE key (k TEXT PRIMARY KEY, job TEXT)")
    conn.execute(LEASE_SCHEMA)
    conn.execute("INSERT INTO mgpu_lease VALUES (1, 3, 'me', NULL, now())")
    return conn


def _tables(conn: psycopg.Connection[Any]) -> list[list[tuple[Any, ...]]]:
    return [
        conn.execute("SELECT * FROM job ORDER BY id").fetchall(),
        conn.execute("SELECT kind, target FROM event ORDER BY n").fetchall(),
        conn.execute("SELECT * FROM key ORDER BY k").fetchall(),
    ]


def test_one_statement_writes_what_the_statements_one_by_one_do(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("INSERT INTO job VALUES ('a', 'old'), ('c', 'kept')")
    db.execute("INSERT INTO key VALUES ('k1', 'first')")
    parts: Parts = [
        (JOB, [("a", "new"), ("b", "q")]),
        (EVENT, [("submit", "a"), ("submit", "b")]),
        (KEY, [("k1", "second"), ("k2", "b")]),
    ]
    fence = Fence()
    fence.generation = 3
    made = statement(parts, fence.statement())
    assert made is not None
    db.execute(made[0], made[1])
    one = _tables(db)
    db.execute("TRUNCATE job, event, key")
    db.execute("INSERT INTO job VALUES ('a', 'old'), ('c', 'kept')")
    db.execute("INSERT INTO key VALUES ('k1', 'first')")
    with db.transaction():
        for sql, rows in parts:
            for row in rows:
                db.execute(sql, row)
    assert one == _tables(db)
    assert one[1] == [("submit", "a"), ("submit", "b")]  # in the order given


def test_a_refused_check_writes_nothing(db: psycopg.Connection[Any]) -> None:
    fence = Fence()
    fence.generation = 2  # another master took the lease since (generation 3)
    made = statement([(JOB, [("a", "q")]), (EVENT, [("submit", "a")])], fence.statement())
    assert made is not None
    with pytest.raises(psycopg.errors.InvalidTextRepresentation) as refused:
        db.execute(made[0], made[1])
    assert fence.refused(refused.value)
    assert _tables(db) == [[], [], []]
    assert isinstance(fence.fenced(3), Fenced) and fence.lost
