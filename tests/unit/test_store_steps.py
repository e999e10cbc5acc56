"""The srun steps a job ran, rows of their own (master/store/steps.py), on both backends:
stored and read back in order, each job pruned to its last STEPS_KEPT, forgotten with
their job; and a database of schema version 2, whose job records held their steps, has
them moved out at open without losing one."""

from __future__ import annotations

import json

from factories import master_job
from mgpu.master.store.base import SCHEMA_VERSION, Store
from mgpu.master.store.steps import STEPS_KEPT
from mgpu.model import JobState
from stores import Backend


def _step(number: int, **over: object) -> dict[str, object]:
    return {"number": number, "name": "python", "start": 1.0, "end": 2.0, "exit_code": 0,
            "state": "completed", "nodes": ["n1"], "ntasks": 1, **over}  # fmt: skip


def test_steps_are_stored_apart_read_in_order_and_pruned(store: Store) -> None:
    store.save_steps([("7", _step(1)), ("8", _step(0, name="b")), ("7", _step(0))])
    assert store.steps_of(["7", "8", "9"]) == {"7": [_step(0), _step(1)], "8": [_step(0, name="b")]}
    assert (store.last_step_number("7"), store.last_step_number("9")) == (1, None)
    store.save_steps([("7", _step(1, exit_code=3))])  # written again (a retried write)
    assert store.steps_of(["7"])["7"][1]["exit_code"] == 3

    store.save_steps([("7", _step(n)) for n in range(2, STEPS_KEPT + 5)])
    numbers = [s["number"] for s in store.steps_of(["7"])["7"]]
    assert numbers == list(range(5, STEPS_KEPT + 5))  # its last STEPS_KEPT
    assert [s["name"] for s in store.steps_of(["8"])["8"]] == ["b"]  # another job's untouched

    store.delete_steps(["7"])
    assert store.steps_of(["7", "8"]) == {"8": [_step(0, name="b")]}


def test_a_version_2_database_has_its_steps_moved_out_of_the_job_records(
    backend: Backend,
) -> None:
    store = backend.open()
    job = master_job("7", state=JobState.COMPLETED, submit_time=1.0, end_time=10.0)
    other = master_job("8", state=JobState.COMPLETED, submit_time=1.0, end_time=10.0)
    store.save_jobs([job, other])
    # As mgpu wrote it before version 3: the steps in the record, no table for them.
    record = {**job.to_record(), "steps": [_step(n) for n in range(3)]}
    backend.sql(store, "UPDATE jobs SET record=? WHERE id='7'", (json.dumps(record),))
    backend.sql(store, "DROP TABLE job_steps")
    backend.sql(store, "UPDATE schema_version SET version = 2")
    store.close()

    store = backend.open()
    assert store.schema_version() == SCHEMA_VERSION == 3
    assert store.steps_of(["7", "8"]) == {"7": [_step(n) for n in range(3)]}
    assert store.last_step_number("7") == 2
    ((text,),) = backend.sql(store, "SELECT record FROM jobs WHERE id='7'")
    assert "steps" not in json.loads(text)  # out of the record
    assert store.get_job("7") == job and store.get_job("8") == other
    store.close()
    store = backend.open()  # opened again: nothing moved twice
    assert store.steps_of(["7"]) == {"7": [_step(n) for n in range(3)]}


def test_a_record_that_still_holds_steps_reads_back() -> None:
    """A job record from before version 3 read without migrating (an import's copy)."""
    job = master_job("7")
    record = {**job.to_record(), "steps": [_step(0)]}
    assert type(job).from_record(record) == job
