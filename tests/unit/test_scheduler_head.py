"""The master's quick pass: the same core on the head of the queue decides the same.

The master, with a long queue, runs `schedule()` on a prefix of the last full pass's order
(master/control/loop.py), the jobs in submit order, every queued user in `Snapshot.users`.  When
the prefix holds the blocked head and the backfill window behind it, its starts and
preemptions are those of the full pass over the whole queue, under every queue policy:
backfill inside the prefix cannot delay the head, which is in it.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from mgpu.scheduler import (
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)

NOW = 100_000.0
DEPTH = 20  # backfill_depth: jobs examined behind the blocked head


def situation(seed: int, policy: str) -> Snapshot:
    rnd = random.Random(seed)
    nodes, running = [], []
    for n in range(6):
        busy = set(rnd.sample(range(4), rnd.randint(0, 4)))
        nodes.append(NodeView(f"n{n}", (0, 1, 2, 3), frozenset(set(range(4)) - busy)))
        for g in sorted(busy):
            running.append(
                RunningJob(
                    f"r{n}{g}",
                    rnd.choice("abc"),
                    (Placement(f"n{n}", (g,)),),
                    start_time=NOW - rnd.randint(0, 3000),
                    time_limit=rnd.choice([600.0, 3600.0, None]),
                    preemptible=rnd.random() < 0.3,
                )
            )
    pending = [
        JobRequest(
            f"j{k:03d}",
            rnd.choice("abcde"),
            NOW - 5000 + k * 10,
            gpus=rnd.choice([1, 1, 2, 4, 8]),
            priority=rnd.choice([0, 0, 100, -50]),
            time_limit=rnd.choice([300.0, 1800.0, 7200.0, None]),
            distributed=rnd.random() < 0.2,
        )
        for k in range(300)
    ]
    # Users whose jobs all lie far behind the head: they still weigh in fairshare.
    pending += [
        JobRequest(f"z{k:03d}", f"late{k % 2}", NOW - 10 + k, gpus=8, priority=-1000)
        for k in range(10)
    ]
    config = SchedulerConfig(queue_policy=policy, backfill_depth=DEPTH)  # type: ignore[arg-type]
    usage = {u: rnd.uniform(0, 1e5) for u in "abc"}
    return Snapshot(NOW, nodes, pending, running, usage, config)


@pytest.mark.parametrize("policy", ["fifo", "priority", "backfill"])
@pytest.mark.parametrize("seed", range(12))
def test_the_head_of_the_order_decides_what_the_whole_queue_does(seed: int, policy: str) -> None:
    snap = situation(seed, policy)
    full = schedule(snap)
    started = {s.job_id for s in full.starts}
    # The prefix: every job the scan may reach (the started, the head, DEPTH behind it).
    reached = [i for i, job_id in enumerate(full.order) if job_id in started]
    depth = (max(reached, default=0) + 1) + DEPTH + 1
    head = set(full.order[:depth])
    quick = schedule(
        replace(
            snap,
            pending=[j for j in snap.pending if j.job_id in head],  # submit order kept
            users=frozenset(j.user for j in snap.pending),
            config=replace(snap.config, plan_jobs=0),
        )
    )
    assert quick.starts == full.starts
    assert quick.preempt == full.preempt
    assert quick.order == full.order[:depth]
    assert {k: quick.priorities[k] for k in head} == {k: full.priorities[k] for k in head}
