"""A job's end reaches the database only after its output (state/unitofwork.py with
store/pgoutputs.py), and neither makes the event loop wait for PostgreSQL.

A new leader drops the output an agent re-sends for a run that ended: a master killed
after writing a job's end but before its last output lines would lose them.  The close
used to write those lines on the event loop (up to 0.5 s a job); now the flusher writes
them and the group commit holds the batch with the end until they are stored."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from factories import master_job
from mgpu.master.runtime.clock import LoopTimers
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.master.store import pgoutputs
from mgpu.master.store.fence import Fence
from mgpu.master.store.pgoutputs import PgOutputStore
from mgpu.master.store.sqlite import MEMORY, SqliteStore
from mgpu.model import JobState
from mgpu.scheduler import UsageLedger


def _rows(url: str, job_id: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT line FROM job_output WHERE job_id = %s ORDER BY n", (job_id,)
        ).fetchall()
    return [r[0] for r in rows]


@pytest.fixture
def outputs(pg_url: str) -> Iterator[PgOutputStore]:
    store = PgOutputStore(pg_url, Fence())
    try:
        yield store
    finally:
        store.close_all()


class Watchdog:
    """Lets the database's stand-in go after `after` seconds if the test has not: a
    call that waited on it the whole time made the event loop wait (the old way)."""

    def __init__(self, release: threading.Event, after: float = 20.0) -> None:
        self.fired = False
        self._timer = threading.Timer(after, self._fire, (release,))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, release: threading.Event) -> None:
        self.fired = True
        release.set()

    def cancel(self) -> None:
        self._timer.cancel()


def test_on_the_event_loop_a_first_append_and_a_close_do_not_wait_for_the_database(
    outputs: PgOutputStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database held (the size lookup blocked, the writer's lock taken): both return
    at once; the records are read from memory meanwhile and stored once it is back."""
    monkeypatch.setattr(pgoutputs, "OPEN_WAIT", 120.0)  # the old bound: never reached here
    release = threading.Event()
    size = outputs._size

    def held_size(job_id: str, wait: float = 10.0) -> Any:
        release.wait(60)
        return size(job_id, wait)

    monkeypatch.setattr(outputs, "_size", held_size)
    watchdog = Watchdog(release)
    assert outputs._write_lock.acquire(timeout=30)
    try:

        async def main() -> None:
            outputs.append("j", "o", "last\n", "n1", epoch=1, end=5)
            outputs.close("j")

        asyncio.run(main())
        returned_while_held = not release.is_set()
    finally:
        release.set()
        outputs._write_lock.release()
        watchdog.cancel()
    assert returned_while_held and not watchdog.fired
    assert [r["d"] for r in outputs.read("j")] == ["last\n"]
    stored = threading.Event()
    outputs.when_stored(stored.set)
    assert stored.wait(30)
    assert len(_rows(pg_url, "j")) == 1


def test_a_jobs_end_is_written_only_once_its_output_is_stored(
    outputs: PgOutputStore, pg_url: str
) -> None:
    """Held output (the writer's lock taken): the batch with the job's end waits, the loop
    goes on; once the output is written, the end follows, and at that moment the output
    rows are in the database."""
    store = SqliteStore(MEMORY)
    uow = UnitOfWork(store, LoopTimers(), UsageLedger(3600.0))
    uow.outputs_stored = outputs.when_stored
    job = master_job("j1", state=JobState.RUNNING)
    store.save_jobs([job])
    rows_at_end: list[list[str]] = []
    save = store.save_jobs_later

    def save_jobs_later(jobs: Any, *args: Any, **kw: Any) -> Any:
        if any(j.id == "j1" and j.state == JobState.COMPLETED for j in jobs):
            rows_at_end.append(_rows(pg_url, "j1"))
        return save(jobs, *args, **kw)

    store.save_jobs_later = save_jobs_later  # type: ignore[method-assign]

    async def main() -> None:
        assert outputs._write_lock.acquire(timeout=30)
        try:
            outputs.append("j1", "o", "last line\n", "n1", epoch=1, end=10)
            job.transition(JobState.COMPLETED)
            uow.persist(job)
            outputs.close("j1")
            for _ in range(5):  # the turns in which the flush would have written it
                await asyncio.sleep(0)
            assert store.get_job("j1").state == JobState.RUNNING  # type: ignore[union-attr]
            assert uow.pending("j1") is job  # queries see the end meanwhile
        finally:
            outputs._write_lock.release()
        for _ in range(600):  # written by the flusher, then the batch: 30 s at most
            if store.get_job("j1").state == JobState.COMPLETED:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)

    asyncio.run(main())
    assert store.get_job("j1").state == JobState.COMPLETED  # type: ignore[union-attr]
    assert len(rows_at_end) == 1 and len(rows_at_end[0]) == 1
    store.close()
