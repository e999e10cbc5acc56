"""`schedule(snapshot)`: queue policies, limits, preemption and the no-double-booking rule."""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial

import pytest

from factories import job, node, running
from mgpu.scheduler import (
    Decisions,
    JobRequest,
    NodeView,
    Placement,
    PriorityWeights,
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

NOW = 100_000.0


def run(
    nodes: list[NodeView],
    pending: list[JobRequest],
    running: Iterable[RunningJob] = (),
    usage: dict[str, float] | None = None,
    **config: object,
) -> Decisions:
    snap = Snapshot(
        now=NOW,
        nodes=nodes,
        pending=pending,
        running=tuple(running),
        usage=usage or {},
        config=SchedulerConfig(**config),  # type: ignore[arg-type]
    )
    return schedule(snap)


def started(d: Decisions) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    return {s.job_id: [(p.node_id, p.gpu_ids) for p in s.placements] for s in d.starts}


# --------------------------------------------------------------------------- queue policies


def test_fifo_blocks_behind_the_first_job_that_cannot_start() -> None:
    nodes = [node("node001", [0, 1])]
    pending = [job("big", submit=1.0, gpus=4), job("small", submit=2.0, gpus=1)]
    d = run(nodes, pending, queue_policy="fifo")
    assert d.starts == []
    assert d.reasons == {"big": "waiting for 4 GPUs", "small": "priority"}
    assert set(d.priorities) == {"big", "small"}


def test_fifo_ignores_priority_and_priority_policy_uses_it() -> None:
    nodes = [node("node001", [0])]
    pending = [job("first", submit=1.0, gpus=1), job("urgent", submit=2.0, gpus=1, priority=1000)]
    assert list(started(run(nodes, pending, queue_policy="fifo"))) == ["first"]
    d = run(nodes, pending, queue_policy="priority")
    assert list(started(d)) == ["urgent"]
    assert d.reasons == {"first": "waiting for 1 GPU"}
    assert d.priorities["urgent"] > d.priorities["first"]


def test_priority_policy_also_blocks_at_the_first_waiting_job() -> None:
    nodes = [node("node001", [0, 1])]
    pending = [job("big", submit=1.0, gpus=4, priority=500), job("small", submit=2.0, gpus=1)]
    d = run(nodes, pending, queue_policy="priority")
    assert d.starts == [] and d.reasons["small"] == "priority"


def test_starts_fill_the_cluster_in_order() -> None:
    nodes = [node("node001"), node("node002", [0, 1])]
    pending = [job(f"j{i}", submit=float(i), gpus=2) for i in range(4)]
    d = run(nodes, pending, queue_policy="fifo")
    assert started(d) == {
        "j0": [("node002", (0, 1))],
        "j1": [("node001", (0, 1))],
        "j2": [("node001", (2, 3))],
    }
    assert d.reasons == {"j3": "waiting for 2 GPUs"}


def test_a_job_that_cannot_run_on_the_nodes_up_does_not_block_the_queue() -> None:
    nodes = [node("node001"), node("node002", up=False)]
    pending = [
        job("pinned", submit=1.0, gpus=1, node_gpu_ids=(("node002", (0,)),)),
        job("other", submit=2.0, gpus=1),
    ]
    for policy in ("fifo", "priority", "backfill"):
        d = run(nodes, pending, queue_policy=policy)
        assert list(started(d)) == ["other"]
        assert d.reasons == {"pinned": "node002 is down or draining"}


def test_pinned_job_waits_for_its_busy_gpus_and_never_goes_elsewhere() -> None:
    nodes = [node("node001", [1, 2, 3]), node("node002")]
    d = run(nodes, [job("p", gpus=2, node_gpu_ids=(("node001", (0, 1)),))])
    assert d.starts == [] and d.reasons == {"p": "waiting for GPUs 0,1 on node001"}


def test_cpu_job_starts_when_every_gpu_is_busy() -> None:
    d = run([node("node001", [])], [job("cpu", gpus=0)], queue_policy="fifo")
    assert started(d) == {"cpu": [("node001", ())]}


def test_two_competing_gangs_never_hold_partial_nodes() -> None:
    nodes = [node("node001"), node("node002"), node("node003")]
    pending = [
        job("g1", submit=1.0, gpus=8, nodes=2, gpus_per_node=4),
        job("g2", submit=2.0, gpus=8, nodes=2, gpus_per_node=4),
        job("one", submit=3.0, gpus=4),
    ]
    for policy in ("fifo", "priority", "backfill"):
        d = run(nodes, pending, queue_policy=policy)
        s = started(d)
        gangs = [g for g in ("g1", "g2") if g in s]
        assert len(gangs) == 1 and len(s[gangs[0]]) == 2
        loser = "g2" if gangs == ["g1"] else "g1"
        assert loser not in s
        assert d.reasons[loser] == "waiting for 2 nodes with 4 free GPUs each"


def test_every_pending_job_gets_a_priority_and_every_waiting_one_a_reason() -> None:
    nodes = [node(f"node{i}", [0]) for i in range(3)]
    pending = [job(f"j{i}", submit=float(i), gpus=1 + i % 3) for i in range(30)]
    for policy in ("fifo", "priority", "backfill"):
        d = run(nodes, pending, queue_policy=policy)
        assert set(d.priorities) == set(d.factors) == {j.job_id for j in pending}
        assert set(d.reasons) == {j.job_id for j in pending} - set(started(d))


def test_empty_queue() -> None:
    assert run([node("n")], []) == Decisions()


# --------------------------------------------------------------------------- limits


def test_gpu_limit_counts_running_jobs_and_this_pass() -> None:
    nodes = [node("node001"), node("node002")]
    running = [RunningJob("r", "alice", (Placement("node001", (0, 1)),), NOW - 10)]
    nodes[0] = node("node001", [2, 3])
    pending = [
        job("a1", submit=1.0, gpus=1),
        job("a2", submit=2.0, gpus=1),
        job("a3", submit=3.0, gpus=1),
        job("b1", submit=4.0, user="bob", gpus=1),
    ]
    d = run(nodes, pending, running, queue_policy="fifo", max_gpus_per_user=3)
    assert set(started(d)) == {"a1", "b1"}  # the capped job does not block bob
    assert d.reasons["a2"] == "user alice is at the limit of 3 GPUs in use"
    assert d.reasons["a3"] == "user alice is at the limit of 3 GPUs in use"


def test_gpu_limit_reasons_for_partial_and_oversized_requests() -> None:
    nodes = [node("node001"), node("node002")]
    pending = [
        job("a1", submit=1.0, gpus=2),
        job("a2", submit=2.0, gpus=2),
        job("a3", submit=3.0, gpus=4),
    ]
    d = run(nodes, pending, max_gpus_per_user=3, queue_policy="fifo")
    assert list(started(d)) == ["a1"]
    assert d.reasons["a2"] == "user alice has 2 of at most 3 GPUs in use and the job needs 2"
    assert d.reasons["a3"] == "the job needs 4 GPUs but user alice may use at most 3"


def test_running_job_limit() -> None:
    nodes = [node("node001")]
    running = [RunningJob("r", "alice", (Placement("node001", (0,)),), NOW - 10)]
    nodes = [node("node001", [1, 2, 3])]
    pending = [job("a1", submit=1.0), job("a2", submit=2.0), job("b1", submit=3.0, user="bob")]
    d = run(nodes, pending, running, max_running_jobs_per_user=2)
    assert set(started(d)) == {"a1", "b1"}
    assert d.reasons == {"a2": "user alice is at the limit of 2 running jobs"}


# --------------------------------------------------------------------------- preemption


# Running for 100 s with no limit of its own; `priority` is its user priority (the pass
# computes the job's priority from it).
running_job = partial(running, now=NOW, started=100.0, preemptible=True)


def test_preemption_stops_lower_priority_preemptible_jobs_only() -> None:
    nodes = [node("node001", []), node("node002", [])]
    running = [
        # Older, bigger and as urgent as the waiting job: a higher priority.
        running_job("keep-hi", "node001", (0, 1, 2, 3), priority=1000, submit_time=0.0),
        running_job("keep-np", "node002", (0, 1), priority=0, preemptible=False),
        running_job("victim", "node002", (2, 3), priority=0),
    ]
    urgent = job("urgent", submit=1.0, gpus=2, priority=1000)
    d = run(nodes, [urgent], running)
    assert d.preempt == ["victim"]
    assert d.starts == []  # it starts next pass, once the GPUs are released
    assert "preempting 1 lower-priority job" in d.reasons["urgent"]


def test_preemption_picks_the_fewest_and_lowest_priority_victims() -> None:
    nodes = [node("node001", []), node("node002", []), node("node003", [])]
    # User priorities 100 apart are worth 50 points, more than the job-size factor's 17.
    running = [
        running_job("a", "node001", (0, 1), priority=500),
        running_job("b", "node001", (2, 3), priority=500),
        running_job("big-low", "node002", (0, 1, 2, 3), priority=100),
        running_job("big-mid", "node003", (0, 1, 2, 3), priority=300),
    ]
    d = run(nodes, [job("urgent", gpus=4, priority=1000)], running)
    assert d.preempt == ["big-low"]
    d = run(nodes, [job("urgent", gpus=2, priority=1000)], running)
    assert d.preempt == ["big-low"]


def test_no_preemption_for_equal_priority_or_when_disabled() -> None:
    nodes = [node("node001", [])]
    urgent = job("urgent", submit=1.0, gpus=4, priority=1000)
    # The same user, age, size and user priority: the same priority, not a lower one.
    twin = running_job("r", "node001", (0, 1, 2, 3), priority=1000, user="alice", submit_time=1.0)
    assert run(nodes, [urgent], [twin]).preempt == []
    running = [running_job("r", "node001", (0, 1, 2, 3), priority=0)]
    assert run(nodes, [urgent], running, preemption=False).preempt == []
    assert run(nodes, [urgent], running).preempt == ["r"]


def test_preemption_weighs_victims_by_their_priority_now() -> None:
    """Two victims alike but for their users' usage: the heavier user's job goes first.

    Running work counts as usage, so a job's priority keeps falling while it runs; the pass
    computes it as of now, as for a waiting job, not as it was when the job started."""
    nodes = [node("node001", []), node("node002", [])]
    running = [
        running_job("of-heavy", "node001", (0, 1, 2, 3), priority=0, user="heavy"),
        running_job("of-light", "node002", (0, 1, 2, 3), priority=0, user="light"),
    ]
    urgent = job("urgent", submit=1.0, gpus=4, priority=1000)
    usage = {"heavy": 1e6, "light": 1e3}
    assert run(nodes, [urgent], running, usage).preempt == ["of-heavy"]
    usage = {"heavy": 1e3, "light": 1e6}
    assert run(nodes, [urgent], running, usage).preempt == ["of-light"]


def test_preemption_for_pinned_and_gang_jobs() -> None:
    nodes = [node("node001", [0, 1]), node("node002", [])]
    running = [
        running_job("on1", "node001", (2, 3), priority=0),
        running_job("on2", "node002", (0, 1, 2, 3), priority=0),
    ]
    pinned = job("p", gpus=1, priority=1000, node_gpu_ids=(("node001", (3,)),))
    assert run(nodes, [pinned], running).preempt == ["on1"]
    gang = job("g", gpus=8, nodes=2, gpus_per_node=4, priority=1000)
    assert sorted(run(nodes, [gang], running).preempt) == ["on1", "on2"]


def test_preempted_gpus_are_not_backfilled() -> None:
    nodes = [node("node001", [0, 1])]
    running = [running_job("low", "node001", (2, 3), priority=0)]
    pending = [job("urgent", submit=1.0, gpus=4, priority=1000), job("small", submit=2.0, gpus=1)]
    d = run(nodes, pending, running, default_time_limit=60.0)
    assert d.preempt == ["low"] and d.starts == []
    assert d.reasons["small"] == "priority"


# --------------------------------------------------------------------------- property


if st is None:

    def test_no_gpu_is_ever_given_twice_and_every_start_fits() -> None:
        pytest.skip("hypothesis is not installed")

else:

    @st.composite
    def snapshots(draw: st.DrawFn) -> Snapshot:
        n_nodes = draw(st.integers(1, 6))
        racks = ["r1", "r2", None]
        nodes = []
        for i in range(n_nodes):
            gpus = draw(st.integers(0, 4))
            free = draw(st.sets(st.integers(0, max(gpus - 1, 0)), max_size=gpus)) if gpus else set()
            nodes.append(
                NodeView(
                    f"n{i}",
                    tuple(range(gpus)),
                    frozenset(free),
                    draw(st.booleans()) or i == 0,
                    rack=draw(st.sampled_from(racks)),
                )
            )
        pending = []
        for j in range(draw(st.integers(0, 12))):
            kind = draw(st.sampled_from(["plain", "plain", "ids", "pinned", "gang", "dist", "cpu"]))
            common = {
                "job_id": f"j{j}",
                "user": draw(st.sampled_from(["u1", "u2", "u3"])),
                "submit_time": float(draw(st.integers(0, 100))),
                "priority": draw(st.integers(-5, 5)),
                "time_limit": draw(st.sampled_from([None, 10.0, 1000.0, math.inf])),
                "policy": draw(st.sampled_from([None, "fill_first", "spread"])),
                "exclude": frozenset(
                    draw(st.sets(st.sampled_from([n.node_id for n in nodes]), max_size=1))
                ),
            }
            if kind == "plain":
                req = JobRequest(**common, gpus=draw(st.integers(1, 5)))  # type: ignore[arg-type]
            elif kind == "dist":
                req = JobRequest(**common, gpus=draw(st.integers(1, 9)), distributed=True)  # type: ignore[arg-type]
            elif kind == "cpu":
                req = JobRequest(**common, gpus=0)  # type: ignore[arg-type]
            elif kind == "ids":
                ids = tuple(sorted(draw(st.sets(st.integers(0, 3), min_size=1, max_size=3))))
                req = JobRequest(**common, gpus=len(ids), gpu_ids=ids)  # type: ignore[arg-type]
            elif kind == "gang":
                n, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
                req = JobRequest(**common, gpus=n * m, nodes=n, gpus_per_node=m)  # type: ignore[arg-type]
            else:
                target = draw(st.sampled_from(nodes))
                ids = tuple(sorted(draw(st.sets(st.integers(0, 3), min_size=1, max_size=2))))
                req = JobRequest(**common, gpus=len(ids), node_gpu_ids=((target.node_id, ids),))  # type: ignore[arg-type]
            pending.append(req)
        running = []
        for r, nv in enumerate(nodes):
            busy = tuple(sorted(set(nv.gpu_indices) - nv.free_gpus))
            if busy and draw(st.booleans()):
                running.append(
                    RunningJob(
                        f"r{r}",
                        draw(st.sampled_from(["u1", "u2", "u3"])),
                        (Placement(nv.node_id, busy),),
                        float(draw(st.integers(0, 100))),
                        draw(st.sampled_from([None, 5.0, 50.0])),
                        draw(st.integers(-3000, 3000)),
                        draw(st.booleans()),
                    )
                )
        config = SchedulerConfig(
            queue_policy=draw(st.sampled_from(["fifo", "priority", "backfill"])),
            placement_policy=draw(st.sampled_from(["fill_first", "spread"])),
            default_time_limit=100.0,
            max_gpus_per_user=draw(st.sampled_from([None, 2, 4])),
            max_running_jobs_per_user=draw(st.sampled_from([None, 1, 3])),
            backfill_depth=draw(st.integers(0, 5)),
            weights=PriorityWeights(max_age=50.0),
        )
        return Snapshot(now=100.0, nodes=nodes, pending=pending, running=running, config=config)

    @settings(max_examples=400, deadline=None)
    @given(snapshots())
    def test_no_gpu_is_ever_given_twice_and_every_start_fits(snap: Snapshot) -> None:
        d = schedule(snap)
        views = {n.node_id: n for n in snap.nodes}
        requests = {j.job_id: j for j in snap.pending}
        taken: set[tuple[str, int]] = set()
        for s in d.starts:
            req = requests[s.job_id]
            nodes_used = [p.node_id for p in s.placements]
            assert len(nodes_used) == len(set(nodes_used)), "a node twice in one start"
            for p in s.placements:
                view = views[p.node_id]
                assert view.schedulable
                assert p.node_id not in req.exclude
                assert set(p.gpu_ids) <= view.free_gpus, "a busy GPU was offered"
                for g in p.gpu_ids:
                    assert (p.node_id, g) not in taken, "a GPU given to two jobs"
                    taken.add((p.node_id, g))
            total = sum(len(p.gpu_ids) for p in s.placements)
            if req.node_gpu_ids is not None:
                assert [(p.node_id, p.gpu_ids) for p in s.placements] == [
                    (n, tuple(sorted(set(ids)))) for n, ids in req.node_gpu_ids
                ]
            elif req.nodes is not None:
                assert len(s.placements) == req.nodes
                assert all(len(p.gpu_ids) == req.gpus_per_node for p in s.placements)
            elif req.gpu_ids is not None:
                assert len(s.placements) == 1 and s.placements[0].gpu_ids == req.gpu_ids
            else:
                assert total == req.gpus
                if len(s.placements) > 1:
                    assert req.distributed
                    assert all(
                        len(v.gpu_indices) < req.gpus
                        for v in views.values()
                        if v.schedulable and v.node_id not in req.exclude
                    )
        started_ids = {s.job_id for s in d.starts}
        assert len(started_ids) == len(d.starts)
        assert set(d.priorities) == set(requests)
        assert set(d.reasons) == set(requests) - started_ids
        running = {r.job_id: r for r in snap.running}
        for victim in d.preempt:
            assert running[victim].preemptible
        # Per-user limits hold after the pass.
        cfg = snap.config
        if cfg.max_running_jobs_per_user is not None:
            for user in {r.user for r in snap.running} | {j.user for j in snap.pending}:
                before = sum(1 for r in snap.running if r.user == user)
                new = sum(1 for s in d.starts if requests[s.job_id].user == user)
                assert new == 0 or before + new <= cfg.max_running_jobs_per_user
