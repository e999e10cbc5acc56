"""The planner: an estimated start for every waiting job, and what it waits for."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

import pytest

from factories import HOUR, job, node, running
from mgpu.scheduler import (
    Decisions,
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # the property test needs hypothesis (a dev dependency)
    st = None  # type: ignore[assignment]

NOW = 20_000.0


def run(
    nodes: list[NodeView],
    pending: list[JobRequest],
    running_jobs: Iterable[RunningJob],
    **config: object,
) -> Decisions:
    config.setdefault("preemption", False)
    return schedule(
        Snapshot(NOW, nodes, pending, tuple(running_jobs), config=SchedulerConfig(**config))  # type: ignore[arg-type]
    )


def offsets(d: Decisions) -> dict[str, float]:
    return {k: v - NOW for k, v in d.expected_start.items()}


# One 4-GPU node, all busy: r1 holds GPUs 0,1 for 1 h, r2 holds 2,3 for 2 h.
NODES = [node("n1", ())]
BUSY = [
    running("r1", "n1", (0, 1), now=NOW, ends_in=HOUR),
    running("r2", "n1", (2, 3), now=NOW, ends_in=2 * HOUR),
]
QUEUE = [
    job("A", gpus=4, time_limit=HOUR, priority=40),  # the head
    job("B", gpus=2, time_limit=HOUR, priority=30),
    job("C", gpus=2, time_limit=2 * HOUR, priority=20),
    job("D", gpus=1, time_limit=HOUR / 2, priority=10),
]


def test_backfill_estimates_every_job_and_fills_the_holes() -> None:
    d = run(NODES, QUEUE, BUSY)
    assert d.starts == []
    # A needs the whole node: after r2.  B fits the hole r1 leaves before A starts.
    # C and D go after A (the hole is B's); D beside C.
    assert offsets(d) == {"A": 2 * HOUR, "B": HOUR, "C": 3 * HOUR, "D": 3 * HOUR}
    assert d.waiting_on == {
        "A": ("r1", "r2"),
        "B": ("r1",),
        "C": ("r1", "B", "A"),
        "D": ("r2", "A"),
    }


@pytest.mark.parametrize("policy", ["fifo", "priority"])
def test_ordered_policies_never_plan_a_job_before_the_one_ahead(policy: str) -> None:
    # Submitted in the priority order, so both policies see A, B, C, D.
    queue = [replace(j, submit_time=float(k)) for k, j in enumerate(QUEUE)]
    d = run(NODES, queue, BUSY, queue_policy=policy)
    # B may not pass A: it waits for A to end, and C beside it; D after B.
    assert offsets(d) == {"A": 2 * HOUR, "B": 3 * HOUR, "C": 3 * HOUR, "D": 4 * HOUR}
    assert d.waiting_on["B"] == ("r1", "A")
    assert d.waiting_on["D"] == ("r1", "A", "B")


def test_an_ordered_job_that_could_start_sooner_waits_for_the_job_ahead() -> None:
    nodes = [node("n1", ()), node("n2", (0,), gpus=1)]
    busy = [running("r", "n1", (0, 1, 2, 3), now=NOW, ends_in=HOUR)]
    pending = [
        job("head", gpus=4, time_limit=HOUR, submit=0.0),
        job("small", gpus=1, time_limit=HOUR / 2, submit=1.0),
    ]
    d = run(nodes, pending, busy, queue_policy="fifo")
    # n2's GPU is free now, but small may not pass the head: it starts beside it.
    assert offsets(d) == {"head": HOUR, "small": HOUR}
    assert d.waiting_on["small"] == ("head",)


def test_the_budget_in_jobs_cuts_the_estimates() -> None:
    d = run(NODES, QUEUE, BUSY, plan_jobs=2)
    assert offsets(d) == {"A": 2 * HOUR, "B": HOUR, "C": 3 * HOUR}
    d = run(NODES, QUEUE, BUSY, plan_jobs=0)  # the planner off: the head only (EASY)
    assert offsets(d) == {"A": 2 * HOUR}
    assert d.waiting_on == {}


def test_the_budget_in_time_cuts_the_estimates() -> None:
    d = run(NODES, QUEUE, BUSY, plan_seconds=0.0)
    assert offsets(d) == {"A": 2 * HOUR}  # the head's comes from the decisions, not the plan
    d = run(NODES, QUEUE, BUSY, plan_seconds=None)
    assert set(d.expected_start) == {"A", "B", "C", "D"}


def test_no_estimate_behind_a_job_that_never_ends_or_for_a_held_job() -> None:
    forever = [
        running("r1", "n1", (0, 1), now=NOW, ends_in=math.inf),
        running("r2", "n1", (2, 3), now=NOW, ends_in=HOUR),
    ]
    pending = [
        job("two", gpus=2, time_limit=HOUR, priority=10),
        job("four", gpus=4, time_limit=HOUR),
    ]
    d = run(NODES, pending, forever)
    assert offsets(d) == {"two": HOUR}
    assert "four" not in d.expected_start
    d = run(NODES, pending, BUSY, max_running_jobs_per_user=0)
    assert d.expected_start == {}


def test_jobs_that_started_get_no_estimate_and_those_that_fit_now_get_now() -> None:
    nodes = [node("n1", (0, 1, 2, 3))]
    pending = [job(f"j{i}", gpus=1, time_limit=HOUR, priority=10 - i) for i in range(6)]
    d = run(nodes, pending, [], backfill_depth=0)
    # j0-j3 start; j4 and j5 wait for them (an hour).
    assert {s.job_id for s in d.starts} == {"j0", "j1", "j2", "j3"}
    assert offsets(d) == {"j4": HOUR, "j5": HOUR}
    assert d.waiting_on["j4"] == ("j0",)


def test_a_job_that_fits_now_but_waits_is_estimated_now() -> None:
    # The scan stops at the blocked head (priority policy): the small job fits now, so the
    # plan under that policy puts it after the head; under backfill it could start now.
    nodes = [node("n1", (3,))]
    busy = [running("r", "n1", (0, 1, 2), now=NOW, ends_in=HOUR)]
    pending = [
        job("head", gpus=4, time_limit=HOUR, priority=10),
        job("small", gpus=1, time_limit=HOUR / 2),
    ]
    d = run(nodes, pending, busy, queue_policy="priority")
    assert offsets(d) == {"head": HOUR, "small": 2 * HOUR}


def test_a_gang_is_planned_on_the_node_timelines() -> None:
    nodes = [node("n1", ()), node("n2", ()), node("n3", (0, 1, 2, 3))]
    busy = [
        running("a", "n1", (0, 1, 2, 3), now=NOW, ends_in=HOUR),
        running("b", "n2", (0, 1, 2, 3), now=NOW, ends_in=3 * HOUR),
    ]
    pending = [
        job("head", gpus=4, time_limit=HOUR, priority=100, node_gpu_ids=(("n3", (0, 1, 2, 3)),)),
        job("gang", gpus=8, time_limit=HOUR, priority=50, nodes=2, gpus_per_node=4),
        job("wide", gpus=12, time_limit=HOUR, priority=-100, distributed=True),
    ]
    d = run(nodes, pending, busy)
    assert "head" in {s.job_id for s in d.starts}
    # n1 and n3 are free at +1h (a ends, head ends): the gang takes them; the split job
    # needs all three nodes: after b ends at +3h.
    assert offsets(d) == {"gang": HOUR, "wide": 3 * HOUR}
    assert d.waiting_on == {"gang": ("a", "head"), "wide": ("a", "head", "gang", "b")}


def test_a_preempting_head_is_expected_now_and_waits_for_its_victims() -> None:
    busy = [
        RunningJob("v", "bob", (Placement("n1", (0, 1, 2, 3)),), NOW - 10, HOUR, preemptible=True)
    ]
    pending = [
        job("urgent", gpus=4, time_limit=HOUR, priority=1000),
        job("next", gpus=4, time_limit=HOUR),
    ]
    d = run(NODES, pending, busy, preemption=True)
    assert d.preempt == ["v"]
    assert offsets(d) == {"urgent": 0.0, "next": HOUR}
    assert d.waiting_on["urgent"] == ("v",)
    assert d.waiting_on["next"] == ("urgent",)


def test_shares_are_planned_by_room() -> None:
    nodes = [NodeView("n1", (0,), frozenset(), shared={0: 750})]
    busy = [RunningJob("s", "bob", (Placement("n1", (0,), 750),), NOW - HOUR, 2 * HOUR)]
    pending = [
        JobRequest("half", "alice", 0.0, gpu_share=500, time_limit=HOUR, priority=100),
        JobRequest("quarter", "alice", 0.0, gpu_share=250, time_limit=HOUR / 2),
        JobRequest("whole", "alice", 0.0, gpus=1, time_limit=HOUR, priority=-100),
    ]
    d = run(nodes, pending, busy)
    assert {s.job_id for s in d.starts} == {"quarter"}  # in the room left, ends in time
    assert offsets(d) == {"half": HOUR, "whole": 2 * HOUR}
    assert d.waiting_on["whole"] == ("quarter", "s", "half")  # in the order they let go


# --------------------------------------------------------------------------- property

if st is None:

    def test_an_estimate_never_beats_the_jobs_start_on_its_own() -> None:
        pytest.skip("hypothesis is not installed")

else:

    @st.composite
    def clusters(draw: st.DrawFn) -> Snapshot:
        nodes: list[NodeView] = []
        runs: list[RunningJob] = []
        for i in range(draw(st.integers(1, 4))):
            busy = draw(st.sets(st.integers(0, 3), max_size=4))
            nodes.append(node(f"n{i}", tuple(sorted(set(range(4)) - busy))))
            for g in busy:
                ends = float(draw(st.integers(1, 10)) * 600)
                runs.append(running(f"r{i}.{g}", f"n{i}", (g,), now=NOW, ends_in=ends))
        pending = []
        for j in range(draw(st.integers(1, 8))):
            shape = draw(st.sampled_from(["plain", "gang", "share"]))
            kw: dict[str, object] = {"priority": draw(st.integers(0, 3))}
            limit = float(draw(st.integers(1, 12)) * 600)
            if shape == "plain":
                pending.append(job(f"j{j}", gpus=draw(st.integers(1, 4)), time_limit=limit, **kw))
            elif shape == "gang":
                n, m = draw(st.integers(1, 3)), draw(st.integers(1, 4))
                pending.append(
                    job(f"j{j}", gpus=n * m, time_limit=limit, nodes=n, gpus_per_node=m, **kw)
                )
            else:
                units = draw(st.sampled_from([250, 500, 750]))
                pending.append(job(f"j{j}", gpus=1, time_limit=limit, gpu_share=units, **kw))
        policy = draw(st.sampled_from(["backfill", "fifo", "priority"]))
        cfg = SchedulerConfig(queue_policy=policy, preemption=False, plan_seconds=None)  # type: ignore[arg-type]
        return Snapshot(NOW, nodes, pending, runs, config=cfg)

    @settings(max_examples=200, deadline=None)
    @given(clusters())
    def test_an_estimate_never_beats_the_jobs_start_on_its_own(snap: Snapshot) -> None:
        """Booking only adds use, so a job planned behind others never starts sooner than it
        would alone on the same cluster; and every estimate is now or later."""
        d = schedule(snap)
        started = {s.job_id for s in d.starts}
        for j in snap.pending:
            if j.job_id in started:
                assert j.job_id not in d.expected_start
                continue
            if j.job_id not in d.expected_start:
                continue
            est = d.expected_start[j.job_id]
            assert est >= NOW
            alone = schedule(
                Snapshot(NOW, snap.nodes, [j], snap.running, config=snap.config)
            )  # fmt: skip
            if alone.starts:
                continue  # it fits now on its own
            assert j.job_id in alone.expected_start
            assert est >= alone.expected_start[j.job_id]
