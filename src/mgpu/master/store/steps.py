"""The srun steps a job ran (`sacct`'s `ID.0`, `ID.1`, ...), a row each, apart from the job.

A job that runs srun in a loop ends a step every few seconds.  Kept in its job's record,
each end rewrote the whole record (the job and its last 1,000 steps, ~155 KB), and every
queue listing carried them.  Here each step's end is one small row (`save_steps`), the
job's oldest beyond STEPS_KEPT are pruned in the same transaction, and they are read only
where they are asked for (`steps_of`: `sacct`, one job's detail), from the store, so any
master that takes over lists them and numbers on from them (`last_step_number`).

Schema version 3 made the table and moved the steps of every stored job record into it
(schema.py, with `moved_out`).  The store's queries of them are in sqlstore.py.

`live_steps` (schema version 4) holds the steps of running jobs, ended or not, as the
leader knows them (master/control/livesteps.py writes them): one row a step, written in the
flush that sends its launch (and again with each of its processes' ends, before the agent
is told to forget them), so that a master that takes over knows every step an agent
reports and what each srun client follows.  A job's rows go when it ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from mgpu.master.store.base import encode

__all__ = [
    "STEPS_KEPT",
    "LiveRow",
    "StepRow",
    "grouped",
    "live_rows",
    "moved_out",
    "prune_rows",
    "upsert_rows",
]

STEPS_KEPT = 1000
"""Ended steps kept per job: its last ones (a job that runs srun in a loop)."""

StepRow = tuple[str, dict[str, Any]]
"""A step that ended: its job's id, and `{"number", "name", "start", "end", "exit_code",
"state", "end_code", "nodes", "ntasks"}` (`end_code`: `out_of_memory` or None)."""

# Written with `?` placeholders (dialect.py makes PostgreSQL's).
UPSERT = (
    "INSERT INTO job_steps(job_id, number, record) VALUES (?,?,?) "
    "ON CONFLICT(job_id, number) DO UPDATE SET record=excluded.record"
)  # an upsert: a write run again after its answer was lost changes nothing
PRUNE = (
    "DELETE FROM job_steps WHERE job_id=? AND number < (SELECT number FROM job_steps "
    f"WHERE job_id=? ORDER BY number DESC LIMIT 1 OFFSET {STEPS_KEPT - 1})"
)
LAST = "SELECT MAX(number) FROM job_steps WHERE job_id=?"
WITH_STEPS = "SELECT id, record FROM jobs WHERE record LIKE ? OR record LIKE ?"
WITH_STEPS_ARGS = ('%"steps":[{%', '%"steps": [{%')  # only records with steps: no full parse
REWRITE = "UPDATE jobs SET record=? WHERE id=?"
LIVE_UPSERT = (
    "INSERT INTO live_steps(id, job_id, record) VALUES (?,?,?) "
    "ON CONFLICT(id) DO UPDATE SET record=excluded.record"
)
LIVE_GONE = "DELETE FROM live_steps WHERE job_id=?"
LIVE_ALL = "SELECT id, job_id, record FROM live_steps"

LiveRow = tuple[str, str, dict[str, Any]]
"""A running job's step: its id, its job's id, its record (master/control/livesteps.py)."""


def live_rows(rows: Sequence[LiveRow]) -> list[tuple[str, str, str]]:
    return [(step_id, job_id, encode(record)) for step_id, job_id, record in rows]


def upsert_rows(rows: Sequence[StepRow]) -> list[tuple[str, int, str]]:
    return [(job_id, int(step["number"]), encode(step)) for job_id, step in rows]


def prune_rows(rows: Sequence[StepRow]) -> list[tuple[str, str]]:
    return [(job_id, job_id) for job_id in dict.fromkeys(job_id for job_id, _ in rows)]


def grouped(rows: Iterable[tuple[Any, Any]]) -> dict[str, list[dict[str, Any]]]:
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
