"""The store keeps the jobs it last wrote as ended (master/store/sqlite.py, RECENTLY_ENDED): read
back from memory, equal to what is on disk, bounded, and only once the write committed."""

from __future__ import annotations

import json

import pytest

from factories import master_job
from mgpu.master.store import base as store_module
from mgpu.master.store.base import Store
from mgpu.model import Job, JobState
from stores import Backend


def _job(job_id: str, state: JobState = JobState.COMPLETED) -> Job:
    ended = {"end_time": 2.0, "exit_code": 0} if state.terminal else {}
    return master_job(job_id, state=state, submit_time=1.0, **ended)


def _on_disk(backend: Backend, store: Store, job_id: str) -> Job:
    (row,) = backend.sql(store, "SELECT record FROM jobs WHERE id=?", (job_id,))
    return Job.from_record(json.loads(row[0]))


def test_an_ended_job_is_read_back_from_memory_as_it_is_on_disk(backend: Backend) -> None:
    store = backend.open()
    ended, running = _job("e1"), _job("r1", JobState.RUNNING)
    store.save_jobs([ended, running])
    assert store.get_job("e1") is ended  # no query, no Job.from_record
    assert store.get_jobs(["e1", "r1", "nope"])["e1"] is ended
    assert store.get_job("e1") == _on_disk(backend, store, "e1")
    # A job still running is read from disk: the controller has the live one.
    assert store.get_job("r1") is not running
    assert store.get_job("r1") == running
    assert set(store.get_jobs(["e1", "r1", "nope"])) == {"e1", "r1"}


def test_only_the_last_jobs_that_ended_are_kept(
    monkeypatch: pytest.MonkeyPatch, backend: Backend
) -> None:
    monkeypatch.setattr(store_module, "RECENTLY_ENDED", 3)
    store = backend.open()
    jobs = [_job(f"j{i}") for i in range(5)]
    for job in jobs:
        store.save_jobs([job])
    assert [store.get_job(j.id) is j for j in jobs] == [False, False, True, True, True]
    assert store.get_job("j0") == jobs[0]  # from disk, all the same
    store.save_jobs(jobs[:1])  # written again: the most recent now
    assert store.get_job("j0") is jobs[0] and store.get_job("j2") is not jobs[2]


def test_a_write_that_failed_is_not_remembered(store: Store) -> None:
    job = _job("x1")
    with pytest.raises(Exception, match=r"(?i)not.null"):  # an event without its kind
        store.save_jobs([job], event=(None, "alice", None, "x1"))  # type: ignore[arg-type]
    assert store.get_job("x1") is None
