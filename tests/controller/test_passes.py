"""Passes over a long queue: quick passes look at its head, full passes reach every job.

The loop's thresholds are lowered (`limits.long_queue`, `limits.quick_depth`) so that a few
dozen jobs make a "long" queue: the rules are the same at 100,000.
"""

from __future__ import annotations

import asyncio

import pytest
from harness import Harness, _run

from mgpu.master.control.loop import BATCH_FACTOR, FULL_INTERVAL, PASS_BATCH
from mgpu.model import JobState

DEPTH = 5


@pytest.fixture
def long(h: Harness) -> Harness:
    h.cl.loop.limits.long_queue = 10
    h.cl.loop.limits.quick_depth = DEPTH
    return h


def full(h: Harness) -> None:
    """A full pass as the loop runs it (inline here), then the quick pass it wakes."""
    _run(h.cl.loop.full_pass(offload=False))
    h.tick()


def queued(h: Harness) -> list[str]:
    return [j.id for j in h.cl.state.jobs.values() if j.state == JobState.QUEUED]


def test_a_short_queue_gets_a_full_pass_every_time(long: Harness) -> None:
    long.cl.loop.limits.long_queue = 100
    long.agent("n1", gpus=1)
    long.start("sleep", gpus=1)
    ids = [long.submit() for _ in range(20)]
    assert not long.cl.loop.long
    long.tick()
    assert all(long.job(i).reason for i in ids)
    assert set(ids) <= long.cl.loop.priorities.keys()


def test_a_quick_pass_looks_at_the_head_of_the_queue_only(long: Harness) -> None:
    long.agent("n1", gpus=1)
    long.start("sleep", gpus=1)
    ids = [long.submit() for _ in range(40)]
    assert long.cl.loop.long
    full(long)
    plan = long.cl.loop.quick_plan()
    assert [r.job_id for r in plan.eligibility.eligible] == ids[:DEPTH]
    assert plan.decisions is not None and set(plan.decisions.reasons) == set(ids[:DEPTH])
    # Jobs queued since the last full pass are looked at too, the first few of them.
    later = [long.submit() for _ in range(2 * DEPTH)]
    plan = long.cl.loop.quick_plan()
    assert [r.job_id for r in plan.eligibility.eligible] == ids[:DEPTH] + later[:DEPTH]


def test_the_full_pass_reaches_every_queued_job(long: Harness) -> None:
    long.agent("n1", gpus=2)
    long.start("sleep", gpus=2)
    ids = [long.submit(gpus=1 + i % 2) for i in range(40)]
    array_id = long.submit(array="0-29%2")
    tasks = [f"{array_id}_{i}" for i in range(30)]
    long.tick()  # a quick pass: the head only
    assert long.job(ids[-1]).reason == "waiting to be scheduled"  # not judged yet
    loop = long.cl.loop
    quick = loop.last_pass_duration
    _run(loop.full_pass(offload=False))
    # The loop paces itself by its quick passes: the full one's time is kept apart.
    assert loop.last_pass_duration == quick and loop.last_full_seconds > 0
    for job_id in ids + tasks:
        assert long.job(job_id).reason != "waiting to be scheduled", job_id
    assert set(ids) <= loop.priorities.keys()
    assert set(ids) <= loop.expected_start.keys()  # every one within the planner's budget
    assert long.job(tasks[-1]).reason == "array limit of 2 running tasks"


def test_the_full_pass_in_a_worker_thread_gives_what_it_gives_inline(
    make_harness: type[Harness],
) -> None:
    hs = [make_harness(), make_harness()]
    for h in hs:
        h.cl.loop.limits.long_queue = 10
        h.agent("n1", gpus=2)
        h.start("sleep", gpus=2)
        for i in range(30):
            h.submit(gpus=1 + i % 2, priority=i % 7)
    _run(hs[0].cl.loop.full_pass(offload=False))
    asyncio.run(hs[1].cl.loop.full_pass(offload=True))
    # Job ids differ from one harness to the other: compared by submit position.
    reasons = [[j.reason for j in h.cl.state.jobs.values()] for h in hs]
    orders = [[list(h.cl.state.jobs).index(i) for i in h.cl.loop.head.order] for h in hs]
    assert reasons[0] == reasons[1] and orders[0] == orders[1] and len(orders[0]) == 30


def test_the_head_starts_first_when_gpus_free_up(long: Harness) -> None:
    a = long.agent("n1", gpus=1)
    blocker = long.start("sleep", gpus=1)
    ids = [long.submit() for _ in range(40)]
    full(long)
    urgent = long.submit(priority=1000)  # queued after the full pass: fresh
    a.exited(blocker)
    long.tick()
    assert long.job(urgent).state == JobState.RUNNING
    assert all(long.job(i).state == JobState.QUEUED for i in ids)


def test_backfill_in_a_quick_pass_never_delays_the_head(long: Harness) -> None:
    long.agent("n1", gpus=4)
    long.start("sleep", gpus=3, time="10")  # 3 of 4 GPUs for 10 minutes
    head = long.submit(gpus=4, priority=1000)
    long_one = long.submit(gpus=1, time="60")  # would hold the 4th GPU past the head's start
    filler = [long.submit(gpus=2) for _ in range(30)]
    full(long)
    short = long.submit(gpus=1, time="5")  # ends before the head can start: may backfill
    long.tick()
    assert long.job(head).state == JobState.QUEUED
    assert long.job(long_one).state == JobState.QUEUED
    assert long.job(short).state == JobState.RUNNING
    assert all(long.job(i).state == JobState.QUEUED for i in filler)


def test_an_array_at_its_cap_starts_its_next_task_in_a_quick_pass(long: Harness) -> None:
    a = long.agent("n1", gpus=4)
    array_id = long.submit(array="0-99%2")
    task = [f"{array_id}_{i}" for i in range(100)]
    long.tick()
    full(long)
    running = [t for t in task if long.job(t).state == JobState.RUNNING]
    assert running == task[:2]
    for t in running:
        a.started(t)
    a.exited(task[0])
    long.tick()  # no full pass in between
    assert [t for t in task if long.job(t).state == JobState.RUNNING] == [task[1], task[2]]
    plan = long.cl.loop.quick_plan()
    assert len(plan.eligibility.eligible) + len(plan.eligibility.waiting) <= 2 + DEPTH


def test_a_pass_with_jobs_queued_batches_the_next_events_and_one_without_does_not(
    h: Harness,
) -> None:
    """After a pass that had queued jobs the loop waits up to PASS_BATCH, at most
    BATCH_FACTOR times the pass's length (a stream of submits is planned a batch a pass); after
    one over an empty queue only the pass's length: the next submit on a quiet cluster is
    planned at once (submit-to-start latency)."""
    loop = h.cl.loop
    h.agent("n1", gpus=1)
    h.submit()
    h.tick()  # starts it: the pass had a queued job
    loop.last_pass_duration = 0.0002
    assert loop.pause() == pytest.approx(BATCH_FACTOR * 0.0002)
    loop.last_pass_duration = 0.005
    assert loop.pause() == PASS_BATCH  # a costly pass: the whole batch window
    h.tick()  # nothing queued now
    loop.last_pass_duration = 0.0002
    assert loop.pause() == 0.0002
    h.submit()  # queued, not yet planned
    assert loop.pause() == pytest.approx(BATCH_FACTOR * 0.0002)


def test_with_many_running_a_short_queue_gets_its_estimates_every_few_seconds(
    h: Harness,
) -> None:
    """Estimates cost what the running jobs do: past `estimate_running` of them, the pass
    at an event leaves them out (the last ones stand) and one comes within FULL_INTERVAL."""
    loop = h.cl.loop
    loop.limits.estimate_running = 0
    h.agent("n1", gpus=1)
    blocker = h.start("sleep", gpus=1, time="10")
    first = h.submit(time="5")
    h.tick()  # at an event: no estimates (they are owed)
    assert first not in loop.expected_start
    h.tick()  # the last were made less than FULL_INTERVAL ago (at the blocker's start)
    assert first not in loop.expected_start
    h.advance(FULL_INTERVAL)
    h.cl.loop.tick(woken=False)  # nothing happened: the estimates owed come now
    assert loop.expected_start.get(first) == h.job(blocker).start_time + 600
    second = h.submit(time="5")
    h.tick()  # at an event: none for the new job yet, the last ones stand
    assert second not in loop.expected_start and first in loop.expected_start
    h.advance(FULL_INTERVAL)
    h.cl.loop.tick(woken=False)  # nothing happened: the estimates owed come now
    assert loop.expected_start[second] == loop.expected_start[first] + 300
    loop.limits.estimate_running = 10  # few running: every pass makes them
    third = h.submit(time="5")
    h.tick()
    assert loop.expected_start[third] == loop.expected_start[second] + 300


def test_with_many_queued_a_short_queue_gets_its_estimates_every_few_seconds(
    h: Harness,
) -> None:
    """Estimates cost what the waiting jobs do too: past `estimate_queued` of them (a short
    queue all the same), the pass at an event leaves them out and one comes within
    FULL_INTERVAL; the blocked head's start is still planned (backfill needs it)."""
    loop = h.cl.loop
    loop.limits.estimate_queued = 1
    h.agent("n1", gpus=1)
    blocker = h.start("sleep", gpus=1, time="10")
    first = h.submit(time="5")
    h.tick()
    second = h.submit(time="5")
    h.tick()  # two queued now: the pass at this event makes no estimates
    assert second not in loop.expected_start
    h.advance(FULL_INTERVAL)
    h.cl.loop.tick(woken=False)  # the estimates owed come now
    assert loop.expected_start[first] == h.job(blocker).start_time + 600
    assert loop.expected_start[second] == loop.expected_start[first] + 300
    loop.limits.estimate_queued = 10  # few queued: every pass makes them
    third = h.submit(time="5")
    h.tick()
    assert loop.expected_start[third] == loop.expected_start[second] + 300


def test_a_job_whose_dependency_ends_is_looked_at_by_the_next_quick_pass(long: Harness) -> None:
    """Deep in a long queue, a job waiting for another gets its look when that one ends,
    not at the next full pass (seconds away with 100,000 queued)."""
    n1 = long.agent("n1", gpus=1)
    long.agent("n2", gpus=2)
    first = long.start("sleep", gpus=1)  # on n1
    long.start("sleep", gpus=2)  # n2 taken: the fillers wait for it
    fillers = [long.submit(gpus=2) for _ in range(20)]  # the head, and more
    dependent = long.submit(gpus=1, dependency=f"afterany:{first}")
    full(long)
    assert long.job(dependent).state is JobState.QUEUED
    assert dependent not in {r.job_id for r in long.cl.loop.quick_plan().eligibility.eligible}
    n1.exited(first)
    long.tick()  # a quick pass, no full one
    assert long.job(dependent).state is JobState.RUNNING
    assert all(long.job(f).state is JobState.QUEUED for f in fillers)


def test_a_job_deep_in_the_queue_that_can_backfill_starts_after_a_full_pass(
    long: Harness,
) -> None:
    # Slurm's backfill reaches further than its main scheduler's queue depth: a job behind
    # the head that fits must not wait for the head to drain.
    long.agent("n1", gpus=4)
    long.start("sleep", gpus=3, time="10")  # 3 of 4 GPUs for 10 minutes
    blocked = [long.submit(gpus=4, priority=1000) for _ in range(3 * DEPTH)]
    short = long.submit(gpus=1, time="5")  # ends before the head can start
    long.tick()
    full(long)
    assert long.job(short).state == JobState.RUNNING
    assert all(long.job(i).state == JobState.QUEUED for i in blocked)
