"""EASY backfill: a reservation for the blocked head, and nothing may delay it."""

from __future__ import annotations

import math

from factories import HOUR, job, node, running
from mgpu.scheduler import (
    Decisions,
    FreePool,
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from mgpu.scheduler.backfill import find_reservation, release_events

NOW = 1000.0


def run(
    nodes: list[NodeView],
    pending: list[JobRequest],
    running_jobs: list[RunningJob],
    **config: object,
) -> Decisions:
    config.setdefault("preemption", False)
    return schedule(
        Snapshot(
            now=NOW,
            nodes=nodes,
            pending=pending,
            running=running_jobs,
            config=SchedulerConfig(queue_policy="backfill", **config),  # type: ignore[arg-type]
        )
    )


def started(d: Decisions) -> set[str]:
    return {s.job_id for s in d.starts}


# One 4-GPU node with 2 GPUs free; the other two are busy for another hour.
NODES = [node("node001", (2, 3))]
BUSY = [running("r1", "node001", (0, 1), now=NOW, ends_in=HOUR)]


def test_short_job_backfills_without_delaying_the_head() -> None:
    pending = [
        job("head", submit=1.0, gpus=4),
        job("short", submit=2.0, gpus=2, time_limit=HOUR / 2),
    ]
    d = run(NODES, pending, BUSY)
    assert started(d) == {"short"}
    assert d.expected_start == {"head": NOW + HOUR}
    assert d.reasons == {"head": "waiting for 4 GPUs"}


def test_long_job_that_would_delay_the_head_is_refused() -> None:
    pending = [
        job("head", submit=1.0, gpus=4),
        job("long", submit=2.0, gpus=2, time_limit=2 * HOUR),
    ]
    d = run(NODES, pending, BUSY)
    assert started(d) == set()
    assert d.reasons == {"head": "waiting for 4 GPUs", "long": "priority"}


def test_job_without_limit_uses_the_default_and_unlimited_never_backfills() -> None:
    pending = [job("head", submit=1.0, gpus=4), job("default", submit=2.0, gpus=2)]
    assert started(run(NODES, pending, BUSY, default_time_limit=HOUR / 4)) == {"default"}
    assert started(run(NODES, pending, BUSY, default_time_limit=2 * HOUR)) == set()
    pending = [
        job("head", submit=1.0, gpus=4),
        job("forever", submit=2.0, gpus=2, time_limit=math.inf),
    ]
    assert started(run(NODES, pending, BUSY)) == set()


def test_long_job_may_use_gpus_the_reservation_does_not_need() -> None:
    nodes = [node("node001", (2, 3)), node("node002", (0, 1, 2, 3), gpus=4)]
    busy = [
        running("r1", "node001", (0, 1), now=NOW, ends_in=HOUR),
        running("r2", "node002", (), now=NOW, ends_in=0),
    ]
    # The head wants GPUs 0-3 of node001 exactly; node002 is free for anyone.
    pending = [
        job("head", submit=1.0, gpus=4, node_gpu_ids=(("node001", (0, 1, 2, 3)),)),
        job("long", submit=2.0, gpus=4, time_limit=10 * HOUR),
        job("long2", submit=3.0, gpus=2, time_limit=10 * HOUR),
    ]
    d = run(nodes, pending, busy)
    assert started(d) == {"long"}
    assert {p.node_id for s in d.starts for p in s.placements} == {"node002"}
    assert d.expected_start["head"] == NOW + HOUR
    assert d.reasons["long2"] == "priority"  # node001's free GPUs are reserved


def test_jobs_that_do_not_fit_at_all_say_what_they_wait_for() -> None:
    pending = [job("head", submit=1.0, gpus=4), job("three", submit=2.0, gpus=3, time_limit=60.0)]
    d = run(NODES, pending, BUSY)
    assert d.reasons["three"] == "waiting for 3 GPUs"


def test_gang_head_reservation_uses_the_node_timelines() -> None:
    nodes = [node("node001", ()), node("node002", ()), node("node003", (0, 1, 2, 3))]
    busy = [
        running("soon", "node001", (0, 1, 2, 3), now=NOW, ends_in=HOUR),
        running("late", "node002", (0, 1, 2, 3), now=NOW, ends_in=5 * HOUR),
    ]
    pending = [
        job("gang", submit=1.0, gpus=8, nodes=2, gpus_per_node=4),
        job("too-long", submit=2.0, gpus=4, time_limit=2 * HOUR),
        job("fits-before", submit=3.0, gpus=4, time_limit=HOUR),
    ]
    d = run(nodes, pending, busy)
    # The gang can start when "soon" ends, on node001 + node003: node003 is reserved.
    # "too-long" (the planner's estimate) gets node002 when "late" ends.
    assert d.expected_start == {"gang": NOW + HOUR, "too-long": NOW + 5 * HOUR}
    assert started(d) == {"fits-before"}
    assert d.reasons["too-long"] == "priority"


def test_backfill_depth_caps_the_scan() -> None:
    pending = [job("head", submit=1.0, gpus=4)] + [
        job(f"s{i}", submit=2.0 + i, gpus=1, time_limit=60.0) for i in range(5)
    ]
    d = run(NODES, pending, BUSY, backfill_depth=1)
    assert started(d) == {"s0"}
    assert d.reasons["s1"] == "priority"


def test_head_that_never_fits_holds_no_reservation() -> None:
    # GPUs 0,1 are busy outside mgpu: no running job will ever release them.
    pending = [
        job("head", submit=1.0, gpus=4),
        job("other", submit=2.0, gpus=2, time_limit=10 * HOUR),
    ]
    d = run(NODES, pending, [])
    assert "head" not in d.expected_start
    assert started(d) == {"other"}


def test_find_reservation_releases_in_time_order() -> None:
    pool = FreePool([node("a", ()), node("b", (0,))])
    runs = [
        RunningJob("x", "u", (Placement("a", (0, 1)),), 0.0, 50.0),
        RunningJob("y", "u", (Placement("b", (1, 2, 3)),), 0.0, 20.0),
        RunningJob("z", "u", (Placement("a", (2, 3)),), 0.0, None),
    ]
    events = release_events(runs, [], now=10.0, default_limit=100.0)
    assert [e.time for e in events] == [20.0, 50.0, 100.0]
    res = find_reservation(job("h", submit=0.0, gpus=4), pool, events, "fill_first")
    assert res is not None and res.time == 20.0
    assert res.placements == (Placement("b", (0, 1, 2, 3)),)
    res = find_reservation(
        job("h", submit=0.0, gpus=8, distributed=True), pool, events, "fill_first"
    )
    assert res is not None and res.time == 100.0
    overdue = release_events(runs, [], now=70.0, default_limit=100.0)
    assert [e.time for e in overdue] == [70.0, 70.0, 100.0]


# --------------------------------------------------------------------------- property

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # the property test needs hypothesis (a dev dependency)
    st = None  # type: ignore[assignment]

if st is None:

    def test_backfill_never_delays_the_reservation() -> None:
        import pytest

        pytest.skip("hypothesis is not installed")

else:

    @st.composite
    def busy_clusters(draw: st.DrawFn) -> Snapshot:
        nodes: list[NodeView] = []
        runs: list[RunningJob] = []
        for i in range(draw(st.integers(1, 5))):
            busy = draw(st.sets(st.integers(0, 3), max_size=4))
            nodes.append(node(f"n{i}", tuple(sorted(set(range(4)) - busy))))
            if busy:
                limit = float(draw(st.integers(1, 10)) * 100)
                runs.append(
                    RunningJob(f"r{i}", "bob", (Placement(f"n{i}", tuple(busy)),), NOW, limit)
                )
        pending = []
        for j in range(draw(st.integers(1, 10))):
            shape = draw(st.sampled_from(["plain", "gang", "pinned"]))
            kw: dict[str, object] = {
                "time_limit": float(draw(st.integers(1, 12)) * 100),
                "priority": draw(st.integers(0, 3)),
            }
            if shape == "plain":
                kw["gpus"] = draw(st.integers(1, 4))
            elif shape == "gang":
                n, m = draw(st.integers(1, 3)), draw(st.integers(1, 4))
                kw.update(gpus=n * m, nodes=n, gpus_per_node=m)
            else:
                target = draw(st.sampled_from(nodes)).node_id
                ids = tuple(sorted(draw(st.sets(st.integers(0, 3), min_size=1, max_size=4))))
                kw.update(gpus=len(ids), node_gpu_ids=((target, ids),))
            pending.append(job(f"j{j}", submit=float(j), **kw))
        return Snapshot(
            now=NOW,
            nodes=nodes,
            pending=pending,
            running=runs,
            # plan_jobs=0: only the head's reservation in `expected_start` (planner off).
            config=SchedulerConfig(queue_policy="backfill", preemption=False, plan_jobs=0),
        )

    @settings(max_examples=300, deadline=None)
    @given(busy_clusters())
    def test_backfill_never_delays_the_reservation(snap: Snapshot) -> None:
        d = schedule(snap)
        if not d.expected_start:
            return
        ((head_id, reserved_at),) = d.expected_start.items()
        requests = {j.job_id: j for j in snap.pending}
        # The cluster as it is after the pass: started jobs now hold their GPUs.
        taken: dict[str, set[int]] = {}
        after_runs = list(snap.running)
        for s in d.starts:
            req = requests[s.job_id]
            after_runs.append(RunningJob(s.job_id, req.user, s.placements, NOW, req.time_limit))
            for p in s.placements:
                taken.setdefault(p.node_id, set()).update(p.gpu_ids)
        after_nodes = [
            NodeView(n.node_id, n.gpu_indices, n.free_gpus - taken.get(n.node_id, set()))
            for n in snap.nodes
        ]
        events = release_events(after_runs, [], NOW, snap.config.default_time_limit)
        again = find_reservation(requests[head_id], FreePool(after_nodes), events, "fill_first")
        assert again is not None and again.time <= reserved_at
