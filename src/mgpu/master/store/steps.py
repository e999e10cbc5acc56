"""The srun steps a job ran (`sacct`'s `ID.0`, `ID.1`, ...), a row each, apart from the job.

A job that runs srun in a loop ends a step every few seconds.  Kept in its job's record,
each end rewrote the whole record (the job and its last 1,000 steps, ~155 KB), and every
queue listing carried them.  Here each step's end is one small row (`save_steps`), the
job's oldest beyond STEPS_KEPT are pruned in the same transaction, and they are read only
where they are asked for (`steps_of`: `sacct`, one job's detail), from the store, so any
master that takes over lists them and numbers on from them (`last_step_number`).

Schema version 3 made the table and moved the steps of every stored job record into it
(`migrate_sqlite`, `migrate_postgres`).  The SQL of both backends is here; each store
mixes in its class (`SqliteSteps`, `PostgresSteps`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from mgpu.master.store.base import encode

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "STEPS_KEPT",
    "PostgresSteps",
    "SqliteSteps",
    "StepRow",
    "migrate_postgres",
    "migrate_sqlite",
]

STEPS_KEPT = 1000
"""Ended steps kept per job: its last ones (a job that runs srun in a loop)."""

StepRow = tuple[str, dict[str, Any]]
"""A step that ended: its job's id, and `{"number", "name", "start", "end", "exit_code",
"state", "nodes", "ntasks"}`."""

SQLITE_TABLE = """CREATE TABLE IF NOT EXISTS job_steps (
    job_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (job_id, number)
)"""
POSTGRES_TABLE = """CREATE TABLE IF NOT EXISTS job_steps (
    job_id TEXT COLLATE "C" NOT NULL,
    number BIGINT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (job_id, number)
)"""

# Written in the SQLite dialect (`?`); PostgreSQL's (`%s`) is made from it.
_UPSERT = (
    "INSERT INTO job_steps(job_id, number, record) VALUES (?,?,?) "
    "ON CONFLICT(job_id, number) DO UPDATE SET record=excluded.record"
)  # an upsert: a write run again after its answer was lost changes nothing
_PRUNE = (
    "DELETE FROM job_steps WHERE job_id=? AND number < (SELECT number FROM job_steps "
    f"WHERE job_id=? ORDER BY number DESC LIMIT 1 OFFSET {STEPS_KEPT - 1})"
)
_LAST = "SELECT MAX(number) FROM job_steps WHERE job_id=?"
_WITH_STEPS = "SELECT id, record FROM jobs WHERE record LIKE ? OR record LIKE ?"
_WITH_STEPS_ARGS = ('%"steps":[{%', '%"steps": [{%')  # only records with steps: no full parse
_REWRITE = "UPDATE jobs SET record=? WHERE id=?"


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


def _upsert_rows(rows: Sequence[StepRow]) -> list[tuple[str, int, str]]:
    return [(job_id, int(step["number"]), encode(step)) for job_id, step in rows]


def _prune_rows(rows: Sequence[StepRow]) -> list[tuple[str, str]]:
    return [(job_id, job_id) for job_id in dict.fromkeys(job_id for job_id, _ in rows)]


def _grouped(rows: Iterable[tuple[Any, Any]]) -> dict[str, list[dict[str, Any]]]:
    """(job id, record) rows in step order as each job's steps."""
    out: dict[str, list[dict[str, Any]]] = {}
    for job_id, record in rows:
        out.setdefault(str(job_id), []).append(json.loads(record))
    return out


def moved_out(found: Iterable[tuple[Any, Any]]) -> tuple[list[StepRow], list[tuple[str, str]]]:
    """Stored job records (id, record) that hold steps: the steps as rows (the last
    STEPS_KEPT of each, as a job kept them), and (record without them, id) to write back."""
    steps: list[StepRow] = []
    records: list[tuple[str, str]] = []
    for job_id, text in found:
        record = json.loads(text)
        kept = record.pop("steps", None)
        if not isinstance(kept, list) or not kept:
            continue
        for i, step in enumerate(kept[-STEPS_KEPT:]):
            steps.append((str(job_id), {**step, "number": step.get("number", i)}))
        records.append((encode(record), str(job_id)))
    return steps, records


# ---- migrations: schema version 3 -----------------------------------------------------


def migrate_sqlite(db: sqlite3.Connection) -> None:
    """Make the table and move every stored job's steps into it (in the migration's
    transaction: all of them or none)."""
    db.execute(SQLITE_TABLE)
    steps, records = moved_out(db.execute(_WITH_STEPS, _WITH_STEPS_ARGS).fetchall())
    db.executemany(_UPSERT, _upsert_rows(steps))
    db.executemany(_REWRITE, records)


def migrate_postgres(conn: psycopg.Connection[Any]) -> None:
    """`migrate_sqlite` on PostgreSQL."""
    conn.execute(POSTGRES_TABLE)
    steps, records = moved_out(conn.execute(_pg(_WITH_STEPS), _WITH_STEPS_ARGS).fetchall())
    with conn.cursor() as cur:
        if steps:
            cur.executemany(_pg(_UPSERT), _upsert_rows(steps))
        if records:
            cur.executemany(_pg(_REWRITE), records)


# ---- the stores' side: mixed into SqliteStore and PostgresStore ------------------------


class SqliteSteps:
    db: sqlite3.Connection
    _tx: Callable[[], Any]

    def save_steps(self, rows: Sequence[StepRow]) -> None:
        """Store steps that ended, and prune their jobs to their last STEPS_KEPT."""
        if not rows:
            return
        with self._tx():
            self.db.executemany(_UPSERT, _upsert_rows(rows))
            self.db.executemany(_PRUNE, _prune_rows(rows))

    def steps_of(self, job_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The stored steps of these jobs, oldest first (jobs without any are left out)."""
        out: dict[str, list[dict[str, Any]]] = {}
        ids = list(dict.fromkeys(job_ids))
        for i in range(0, len(ids), 500):  # well under SQLite's bound-parameter limit
            part = ids[i : i + 500]
            marks = ",".join("?" * len(part))
            cur = self.db.execute(
                f"SELECT job_id, record FROM job_steps WHERE job_id IN ({marks}) "
                "ORDER BY job_id, number",
                part,
            )
            out.update(_grouped(cur))
        return out

    def last_step_number(self, job_id: str) -> int | None:
        """The highest step number stored for the job (None: none)."""
        row = self.db.execute(_LAST, (job_id,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def delete_steps(self, job_ids: Sequence[str]) -> None:
        """Forget the steps of these jobs (their rows were deleted)."""
        if job_ids:
            with self._tx():
                self.db.executemany("DELETE FROM job_steps WHERE job_id=?", [(i,) for i in job_ids])


class PostgresSteps:
    write_in_one: Callable[[Callable[[psycopg.Connection[Any]], Any]], Any]
    read_in_one: Callable[[Callable[[psycopg.Connection[Any]], Any]], Any]

    def save_steps(self, rows: Sequence[StepRow]) -> None:
        """Store steps that ended, and prune their jobs to their last STEPS_KEPT."""
        if not rows:
            return
        upserts, prunes = _upsert_rows(rows), _prune_rows(rows)

        def work(c: psycopg.Connection[Any]) -> None:
            with c.cursor() as cur:
                cur.executemany(_pg(_UPSERT), upserts)
                cur.executemany(_pg(_PRUNE), prunes)

        self.write_in_one(work)

    def steps_of(self, job_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The stored steps of these jobs, oldest first (jobs without any are left out)."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        sql = "SELECT job_id, record FROM job_steps WHERE job_id = ANY(%s) ORDER BY job_id, number"
        return _grouped(self.read_in_one(lambda c: c.execute(sql, (ids,)).fetchall()))

    def last_step_number(self, job_id: str) -> int | None:
        """The highest step number stored for the job (None: none)."""
        row = self.read_in_one(lambda c: c.execute(_pg(_LAST), (job_id,)).fetchone())
        return None if row is None or row[0] is None else int(row[0])

    def delete_steps(self, job_ids: Sequence[str]) -> None:
        """Forget the steps of these jobs (their rows were deleted)."""
        ids = list(job_ids)
        if ids:
            sql = "DELETE FROM job_steps WHERE job_id = ANY(%s)"
            self.write_in_one(lambda c: c.execute(sql, (ids,)))
