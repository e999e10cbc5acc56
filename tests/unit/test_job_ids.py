"""Job ids as Slurm's: integers that grow per cluster, counted in the store in the same
transaction as the job, so none is given twice across a restart or a crash; the ids of a
store an older mgpu wrote (8 hex characters) keep working."""

from __future__ import annotations

from mgpu.master.store.base import LAST_JOB_ID, Store
from mgpu.model import Job
from stores import Backend


def job(job_id: str) -> Job:
    return Job(id=job_id, user="alice", argv=["true"], command="true")


def test_ids_grow_from_one(store: Store) -> None:
    ids = [store.new_job_id() for _ in range(3)]
    assert ids == ["1", "2", "3"]


def test_the_counter_is_stored_with_the_job_and_survives_a_restart(backend: Backend) -> None:
    store = backend.open()
    first, second = store.new_job_id(), store.new_job_id()
    store.save_jobs([job(second)])  # stored out of order: the counter keeps the highest
    store.save_jobs([job(first)])
    assert store.get_meta(LAST_JOB_ID) == "2"
    store.close()
    again = backend.open()
    assert again.new_job_id() == "3"
    assert again.get_job("1") is not None and again.get_job("2") is not None


def test_an_id_nobody_saw_may_be_given_again_after_a_crash(backend: Backend) -> None:
    store = backend.open()
    store.save_jobs([job(store.new_job_id())])
    store.new_job_id()  # handed out, the master dies before the job is written
    backend.crash(store)  # no clean close: as a kill -9 leaves it
    assert backend.open().new_job_id() == "2"


def test_a_failed_write_keeps_the_stored_counter(store: Store) -> None:
    store.save_jobs([job(store.new_job_id())])
    bad = job(store.new_job_id())
    bad.submit_time = None  # type: ignore[assignment]  # NOT NULL: the insert fails
    try:
        store.save_jobs([bad])
    except Exception:
        pass
    assert store.get_meta(LAST_JOB_ID) == "1"
    assert store.new_job_id() == "3"  # this process still never gives 2 twice


def test_an_array_takes_a_block(backend: Backend) -> None:
    store = backend.open()
    array_id = store.new_job_id(block=10)  # indices 0-9: task numbers 1 .. 10
    assert array_id == "1"
    assert store.new_job_id() == "11"
    template = job(array_id)
    store.save_array(template, list(range(10)), None)
    assert store.get_meta(LAST_JOB_ID) == "10"
    store.close()
    assert backend.open().new_job_id() == "11"


def test_old_hex_ids_keep_working_and_are_never_given_again(backend: Backend) -> None:
    store = backend.open()
    store.save_jobs([job("a1b2c3d4"), job("10000001")])  # an older mgpu's ids
    assert store.get_meta(LAST_JOB_ID) == "10000001"  # all digits: counted, so skipped
    store.set_meta(LAST_JOB_ID, "10000000")  # as if the digits id had been stored first
    store.close()
    store = backend.open()
    assert store.new_job_id() == "10000002"  # 10000001 is taken by the old job
    assert store.get_job("a1b2c3d4") is not None
