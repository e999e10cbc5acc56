"""Submits of one event-loop turn share one commit (master/store/submitbatch.py): each is answered
once its job is on disk and in memory; a failed write fails every submit of its batch and
leaves nothing behind, in memory or on disk."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import pytest
from harness import Harness

from mgpu.master.control.cluster import Cluster
from mgpu.master.control.submit import JobSpec

pytestmark = pytest.mark.skipif(
    os.environ.get("MGPU_TEST_STORE") == "postgres",
    reason="watches SQLite's own commits and triggers (the store's tests cover PostgreSQL)",
)


def _commits(h: Harness) -> list[str]:
    seen: list[str] = []
    h.store.db.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    return seen


async def _submit(cl: Cluster, command: str) -> str:
    result = await cl.submit(JobSpec(command=command), "alice", address="10.0.0.9")
    return result.job_id


def test_concurrent_submits_are_written_in_one_commit(h: Harness) -> None:
    h.agent("n1")
    commits = _commits(h)

    async def main() -> list[str]:
        return list(await asyncio.gather(*(_submit(h.cl, f"echo {i}") for i in range(3))))

    ids = asyncio.run(main())
    assert commits == ["COMMIT"]
    assert len(set(ids)) == 3
    for i, job_id in enumerate(ids):
        assert h.cl.jobs[job_id].command == f"echo {i}"  # known as soon as stored
        assert h.stored(job_id).command == f"echo {i}"
    submits = sorted(e["target"] for e in h.events("submit"))
    assert submits == sorted(ids)
    assert all(e["actor"] == "alice" and e["address"] == "10.0.0.9" for e in h.events("submit"))
    # A later turn's submit is a commit of its own, and queued after them.
    later = asyncio.run(_submit(h.cl, "echo 3"))
    assert commits == ["COMMIT", "COMMIT"]
    assert list(h.cl.jobs) == [*ids, later]


def test_a_failed_write_fails_the_whole_batch_and_stores_nothing(h: Harness) -> None:
    h.agent("n1")
    h.store.db.execute(
        "CREATE TRIGGER no_submits BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'x'); END"
    )

    async def main() -> list[BaseException | str]:
        tasks = (_submit(h.cl, f"echo {i}") for i in range(3))
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    outcomes = asyncio.run(main())
    assert [type(o) for o in outcomes] == [sqlite3.IntegrityError] * 3
    assert h.cl.jobs == {}
    assert h.store.db.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)
    assert h.cl.submits.ids == set()  # the ids are free again
    h.store.db.execute("DROP TRIGGER no_submits")
    job_id = asyncio.run(_submit(h.cl, "true"))
    assert h.stored(job_id).id in h.cl.jobs


def test_a_submit_whose_request_went_away_is_still_known(h: Harness) -> None:
    """The jobs are made known in the flush, not by the request that waits for it."""
    h.agent("n1")

    async def main() -> None:
        task = asyncio.ensure_future(_submit(h.cl, "true"))
        await asyncio.sleep(0)  # it is queued for the write
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (job_id,) = h.cl.jobs
    assert h.stored(job_id).command == "true"
