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
    assert store.schema_version() == SCHEMA_VERSION == 4
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


def test_running_jobs_steps_are_stored_as_they_change_and_go_with_their_job(
    store: Store,
) -> None:
    """`live_steps` (schema version 4): what a master that takes over knows of the steps
    running jobs run, written with the ended ones in one transaction."""
    store.save_steps([], live=[("7.s1", "7", {"n": 1}), ("8.s1", "8", {"n": 1})])
    store.save_steps([("7", _step(0))], live=[("7.s1", "7", {"n": 2}), ("7.s2", "7", {})])
    want = [("7.s1", "7", {"n": 2}), ("7.s2", "7", {}), ("8.s1", "8", {"n": 1})]
    assert sorted(store.live_steps()) == want
    store.save_steps([], gone=["7"])
    assert store.live_steps() == [("8.s1", "8", {"n": 1})]
    assert store.steps_of(["7"]) == {"7": [_step(0)]}  # the ended ones stay (sacct)


def test_a_version_3_databases_submit_keys_become_their_users(backend: Backend) -> None:
    store = backend.open()
    store.save_jobs([master_job("7", user="alice")])
    store.save_array(master_job("9", user="carol"), [0, 1], None)
    backend.sql(store, "DROP TABLE submit_keys")
    backend.sql(store, "DROP TABLE live_steps")
    backend.sql(store, "DROP TABLE request_keys")
    backend.sql(store, "CREATE TABLE submit_keys (key TEXT PRIMARY KEY, job_id TEXT, time REAL)")
    for key, job_id in (("k" * 32, "7"), ("a" * 32, "9"), ("g" * 32, "gone")):
        backend.sql(store, "INSERT INTO submit_keys VALUES (?, ?, 1.0)", (key, job_id))
    backend.sql(store, "UPDATE schema_version SET version = 3")
    store.close()

    store = backend.open()
    assert store.schema_version() == 4
    assert store.job_of_submit_key("k" * 32, "alice") == "7"
    assert store.job_of_submit_key("a" * 32, "carol") == "9"  # an array's user, from its row
    assert store.job_of_submit_key("k" * 32, "bob") is None
    assert store.live_steps() == []
    store.save_jobs_later([], answers=[("alice", "r" * 32, '{"a":1}')]).wait(None)
    sent_again = [("alice", "r" * 32, '{"a":2}')]  # the first stays
    store.save_jobs_later([], answers=sent_again).wait(None)
    assert store.request_answer("alice", "r" * 32) == '{"a":1}'
    assert store.request_answer("bob", "r" * 32) is None
    assert store.delete_request_keys_before(float("inf"), 10) == 1
    assert store.request_answer("alice", "r" * 32) is None
