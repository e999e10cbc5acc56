"""A free pool kept from pass to pass (`FreePool.put` / `drop` / `fork`, used by the master's
node index) must answer exactly as a pool built from the same views, and a pass handed
one (`schedule(snapshot, pool)`) must decide exactly as a pass that builds its own."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.scheduler import (
    FreePool,
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from poolcheck import observed

NOW = 10_000.0
NODES = ["n1", "n2", "n3", "n4"]


views = st.builds(
    lambda nid, gpus, free, shared, up, typed, podman, cpus, mem: NodeView(
        nid,
        tuple(range(gpus)),
        frozenset(g for g in free if g < gpus),
        up,
        gpu_type="a100" if typed else None,
        features=frozenset({"podman"}) if podman else frozenset(),
        shared={g: u for g, u in shared.items() if g < gpus and g not in free},
        cpus=cpus[0],
        free_cpus=cpus[1],
        mem_mb=mem[0],
        free_mem_mb=mem[1],
    ),
    st.sampled_from(NODES),
    st.integers(0, 8),
    st.frozensets(st.integers(0, 7)),
    st.dictionaries(st.integers(0, 7), st.integers(1, 1000), max_size=2),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.tuples(st.sampled_from([0, 4, 16]), st.integers(0, 16)),  # CPUs, free
    st.tuples(st.sampled_from([0, 8192]), st.sampled_from([0, 1024, 8192])),  # MiB, free
)
ops = st.lists(st.one_of(views, st.sampled_from(NODES)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_a_kept_pool_answers_as_one_built_from_its_views(steps: list[NodeView | str]) -> None:
    kept = FreePool([])
    current: dict[str, NodeView] = {}
    for step in steps:
        forked = kept.fork()
        before = observed(forked)
        if isinstance(step, str):
            kept.drop(step)
            current.pop(step, None)
        else:
            kept.put(step)
            current[step.node_id] = step
        built = FreePool(current[nid] for nid in sorted(current))
        assert observed(kept) == observed(built)
        assert observed(kept.fork()) == observed(built)
        assert observed(forked) == before  # a fork is not moved by later changes


def test_a_fork_changed_by_a_pass_leaves_the_kept_pool_alone() -> None:
    kept = FreePool([NodeView("n1", (0, 1), frozenset({0, 1})), NodeView("n2", (0,), frozenset())])
    before = observed(kept)
    forked = kept.fork()
    forked.take([Placement("n1", (0,))])
    forked.block([Placement("n1", (1,))])
    forked.release("n2", (0,))
    assert forked.total_free == 1
    assert observed(kept) == before


def test_a_fork_holding_cpus_and_memory_leaves_the_kept_pool_alone() -> None:
    view = NodeView("n1", (0, 1), frozenset({0, 1}), cpus=8, free_cpus=8, mem_mb=64, free_mem_mb=64)
    kept = FreePool([view])
    forked = kept.fork()
    forked.take([Placement("n1", (0,), 0, 6, 60)])
    assert (forked.free_cpus("n1"), forked.free_mem("n1")) == (2, 4)
    copied = forked.copy()
    copied.release("n1", (0,), 0, 6, 60)
    assert (copied.free_cpus("n1"), copied.free_mem("n1")) == (8, 64)
    assert (forked.free_cpus("n1"), forked.free_mem("n1")) == (2, 4)
    assert (kept.free_cpus("n1"), kept.free_mem("n1")) == (8, 64)
    kept.put(replace(view, free_cpus=3))
    assert kept.free_cpus("n1") == 3 and forked.free_cpus("n1") == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(views, min_size=1, max_size=4), st.lists(st.integers(1, 9), max_size=6))
def test_a_pass_on_a_kept_pool_decides_as_one_that_builds_its_own(
    nodes: list[NodeView], sizes: list[int]
) -> None:
    by_id = {v.node_id: v for v in nodes}
    views_ = [by_id[nid] for nid in sorted(by_id)]
    kept = FreePool([])
    for view in nodes:  # the same node more than once: replaced
        kept.put(view)
    pending = [
        JobRequest(
            job_id=f"j{k}",
            user="u" if k % 2 else "v",
            submit_time=float(k),
            gpus=n,
            ask=ResourceAsk(cpus_per_gpu=1) if k % 3 == 1 else NO_ASK,
        )
        for k, n in enumerate(sizes)
    ]
    running = [RunningJob("r", "u", (Placement(views_[0].node_id, (0,)),), NOW - 60, 3600.0)]
    config = SchedulerConfig(plan_seconds=None)
    built = schedule(Snapshot(NOW, views_, pending, running, config=config))
    given_pool = kept.fork()
    handed = schedule(Snapshot(NOW, views_, pending, running, config=config), given_pool)
    assert handed == built
    assert observed(given_pool) == observed(kept.fork())  # the pass worked on a copy
