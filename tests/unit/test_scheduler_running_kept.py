"""A `RunningSet` kept through puts, replacements and drops (as the master keeps it) must
answer as the plain list of the same jobs in the same order, and a pass handed one must
decide exactly as a pass handed that list: starts, preemptions, backfill, reasons,
estimates and priorities, on random states."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st

from mgpu.scheduler import (
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from mgpu.scheduler.running import RunningSet, RunningStats, running_usage

NOW = 100_000.0
DEFAULT = 3600.0
USERS = ["u", "v", "w"]
LIMITS = [None, 60.0, 600.0, 3600.0, 7200.0]


@st.composite
def states(draw: st.DrawFn) -> tuple[list[NodeView], list[RunningJob], list[object]]:
    """Nodes, the running jobs on them, and a history of set operations that leaves exactly
    those jobs (some put, replaced or dropped on the way)."""
    nodes: list[NodeView] = []
    running: list[RunningJob] = []
    for n in range(draw(st.integers(1, 4))):
        nid = f"n{n}"
        gpus = draw(st.integers(1, 8))
        left = list(range(gpus))
        while left and draw(st.integers(0, 4)):  # mostly full nodes
            take = draw(st.integers(1, len(left)))
            ids, left = tuple(left[:take]), left[take:]
            running.append(
                RunningJob(
                    job_id=f"r{len(running)}",
                    user=draw(st.sampled_from(USERS)),
                    placements=(Placement(nid, ids),),
                    # Some overdue (past their limit), some ending together.
                    start_time=NOW - draw(st.sampled_from([0.0, 30.0, 600.0, 3600.0, 9000.0])),
                    time_limit=draw(st.sampled_from(LIMITS)),
                    priority=draw(st.sampled_from([-500, 0, 0, 300])),
                    preemptible=draw(st.booleans()),
                    submit_time=NOW - draw(st.sampled_from([0.0, 100.0, 10_000.0])),
                )
            )
        up = draw(st.sampled_from([True, True, True, False]))
        nodes.append(NodeView(nid, tuple(range(gpus)), frozenset(left), up))
    # A history: each job put, some first as another version (replaced: keeps its place),
    # others put and dropped again; then the set's order is the order of first puts.
    order = draw(st.permutations(running))
    ops: list[object] = []
    later: list[object] = []
    for k, job in enumerate(order):
        if draw(st.booleans()):
            ops.append(replace(job, time_limit=7.0, preemptible=not job.preemptible, user="x"))
        gone = draw(st.sampled_from([None, "now", "later"]))
        if gone is not None:
            ops.append(replace(job, job_id=f"gone{k}"))
        ops.append(job)
        if gone is not None:
            (ops if gone == "now" else later).append(f"gone{k}")
    return nodes, running, ops + later


pending_jobs = st.lists(
    st.builds(
        lambda k, user, gpus, limit, prio: JobRequest(
            job_id=f"p{k}",
            user=user,
            submit_time=NOW - 50.0 * k,
            gpus=gpus,
            time_limit=limit,
            priority=prio,
        ),
        st.integers(0, 10**6),
        st.sampled_from(USERS),
        st.integers(1, 6),
        st.sampled_from(LIMITS),
        st.sampled_from([-1000, 0, 500, 1000]),
    ),
    max_size=8,
    unique_by=lambda j: j.job_id,
)


def kept(ops: list[object]) -> tuple[RunningSet, list[RunningJob]]:
    """The set after `ops`, and the list a dict given the same ops holds, in its order."""
    rs = RunningSet(DEFAULT)
    plain: dict[str, RunningJob] = {}
    for op in ops:
        if isinstance(op, str):
            rs.drop(op)
            plain.pop(op, None)
        else:
            assert isinstance(op, RunningJob)
            rs.put(op)
            plain[op.job_id] = op
    return rs, list(plain.values())


@settings(max_examples=300, deadline=None)
@given(states())
def test_a_kept_set_answers_as_the_list_of_its_jobs(
    state: tuple[list[NodeView], list[RunningJob], list[object]],
) -> None:
    _, running, ops = state
    rs, listed = kept(ops)
    assert list(rs) == listed and sorted(listed, key=lambda r: r.job_id) == sorted(
        running, key=lambda r: r.job_id
    )
    assert rs[:] == listed and len(rs) == len(listed)
    plain = RunningStats(listed)
    assert rs.per_user() == plain.per_user()
    assert set(rs.users()) == set(plain.users())
    assert rs.preemptible() == plain.preemptible()
    assert rs.usage(NOW) == running_usage(NOW, listed)
    started = [(NOW + 60.0, (Placement("n0", (0,)),)), (NOW - 5.0, (Placement("n1", (1,)),))]
    assert list(rs.releases(NOW, DEFAULT, started)) == list(plain.releases(NOW, DEFAULT, started))
    assert rs.copy().preemptible() == rs.preemptible()


@settings(max_examples=300, deadline=None)
@given(
    states(),
    pending_jobs,
    st.sampled_from(["backfill", "priority"]),
    st.booleans(),
    st.sampled_from([None, 3]),
)
def test_a_pass_over_a_kept_set_decides_as_one_over_the_list(
    state: tuple[list[NodeView], list[RunningJob], list[object]],
    pending: list[JobRequest],
    policy: str,
    preemption: bool,
    cap: int | None,
) -> None:
    nodes, _, ops = state
    rs, listed = kept(ops)
    config = SchedulerConfig(
        queue_policy=policy,  # type: ignore[arg-type]
        preemption=preemption,
        max_gpus_per_user=cap,
        default_time_limit=DEFAULT,
        plan_seconds=None,
    )
    usage = {"u": 5000.0, "v": 10.0, **running_usage(NOW, listed)}
    snap = Snapshot(NOW, nodes, pending, listed, usage=usage, config=config)
    expected = schedule(snap)
    event(f"preempts: {bool(expected.preempt)}; estimates: {bool(expected.expected_start)}")
    assert schedule(replace(snap, running=rs)) == expected
    assert list(rs) == listed  # a pass changes nothing of the set
