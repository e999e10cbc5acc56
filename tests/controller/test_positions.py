"""Queue positions for the followers of queued jobs (control/positions.py, issue 25 item 7):
one count for every follower, made anew only when it is old and someone asks."""

from __future__ import annotations

import asyncio

from harness import Harness

from mgpu.master.control.positions import MAX_AGE, QueuePositions
from mgpu.model import Job, JobState


def test_positions_count_queued_jobs_in_submit_order(h: Harness) -> None:
    h.agent("node001", gpus=1)
    running = h.start("sleep 100", gpus=1)
    first = h.submit(gpus=1)
    array = h.submit(gpus=1, array="0-2")
    last = h.submit(gpus=1)
    h.tick()
    assert h.job(running).state == JobState.RUNNING
    assert h.cl.queue_position(first) == 1
    assert [h.cl.queue_position(f"{array}_{i}") for i in range(3)] == [2, 3, 4]
    assert h.cl.queue_position(last) == 5
    assert h.cl.queue_position(running) is None  # not queued


def test_a_count_is_shared_until_it_is_old(h: Harness) -> None:
    h.agent("node001", gpus=1)
    h.start("sleep 100", gpus=1)
    ids = [h.submit(gpus=1) for _ in range(3)]
    walks = h.cl.queue_positions.walks
    for _ in range(50):  # many followers asking: one count
        assert h.cl.queue_position(ids[2]) == 3
    assert h.cl.queue_positions.walks == walks + 1
    h.cl.jobs[ids[0]].state = JobState.CANCELLED  # the first leaves the queue
    assert h.cl.queue_position(ids[2]) == 3  # the old count still stands
    h.advance(MAX_AGE + 0.1)
    assert h.cl.queue_position(ids[2]) == 2  # counted anew once old
    assert h.cl.queue_positions.walks == walks + 2


def test_a_walk_in_slices_wakes_the_followers() -> None:
    jobs = {str(i): Job(id=str(i), user="u", command="true", argv=["true"]) for i in range(12_000)}
    jobs["5"].state = JobState.RUNNING

    async def main() -> tuple[int | None, int | None, bool]:
        positions = QueuePositions(jobs)
        moved = positions.moved
        first = positions.of("11999", now=0.0)  # not counted yet: a walk starts
        await asyncio.wait_for(moved.wait(), 10)
        return first, positions.of("11999", now=0.1), positions.of("4", now=0.2) == 5

    first, counted, head = asyncio.run(main())
    assert first is None
    assert counted == 11_999
    assert head


def test_a_job_queued_since_the_last_count_is_counted_when_asked(h: Harness) -> None:
    first = h.submit(gpus=1)
    assert h.cl.queue_position(first) == 1
    later = h.submit(gpus=1)  # the table is fresh, but does not hold it
    assert h.cl.queue_position(later) == 2
