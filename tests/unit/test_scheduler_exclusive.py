"""`--exclusive` in the scheduler core: a node to one job, whatever the others hold.

A job that holds none of a node's GPUs, CPUs or memory (`--gpus 0`, no ask) shows in no free
count, so these tests put one beside (or behind) an exclusive job: it must neither start on
a node held whole nor let an exclusive job start beside it.  And the per-user GPU limit
counts every GPU an exclusive job would hold, not the ones it asked for.
"""

from __future__ import annotations

from factories import HOUR, MIB_PER_GIB, PASS_NOW, cpu_node, job, schedule_pass, started
from mgpu.resources import ResourceAsk
from mgpu.scheduler import (
    FreePool,
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    place,
)

NOW = PASS_NOW
G = MIB_PER_GIB
WHOLE = ResourceAsk(exclusive=True)


def held_whole(nid: str = "n1") -> NodeView:
    """A node an exclusive job holds: every GPU, CPU and MiB."""
    return cpu_node(nid, free=(), free_cpus=0, free_mem_mb=0, whole=True)


def bare(job_id: str, nid: str = "n1", ends_in: float = HOUR, **kw: object) -> RunningJob:
    """A running job holding nothing of `nid` (a `--gpus 0` job that asks nothing)."""
    return RunningJob(job_id, "bob", (Placement(nid, ()),), NOW - 60, 60 + ends_in, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the pool


def test_an_exclusive_placement_marks_the_node_whole() -> None:
    got = place(job(gpus=1, ask=WHOLE), FreePool([cpu_node()]), "fill_first")
    assert got == (Placement("n1", (0, 1, 2, 3), 0, 8, 64 * G, True),)


def test_a_job_holding_nothing_keeps_the_node_from_being_idle() -> None:
    pool = FreePool([cpu_node(bare_jobs=1)])
    assert not pool.idle("n1")
    assert place(job(ask=WHOLE), pool, "fill_first") is None
    pool.release("n1", ())  # that job ends
    assert pool.idle("n1")
    assert place(job(ask=WHOLE), pool, "fill_first") is not None


def test_nothing_lands_on_a_node_held_whole_not_even_a_job_holding_nothing() -> None:
    cpu_only = job("c", gpus=0)
    pool = FreePool([held_whole("n1"), cpu_node("n2", free=())])
    assert place(cpu_only, pool, "fill_first") == (Placement("n2", ()),)
    assert place(cpu_only, pool, "spread") == (Placement("n2", ()),)
    alone = FreePool([held_whole()])
    assert place(cpu_only, alone, "fill_first") is None
    # Nor through a node filter (few eligible nodes are scored one by one).
    many = [held_whole("n1"), *(cpu_node(f"n{i}", free=()) for i in range(2, 20))]
    assert place(job(gpus=0, nodelist=frozenset({"n1"})), FreePool(many), "fill_first") is None
    # Once the exclusive job ends, the node takes jobs again.
    alone.release("n1", (0, 1, 2, 3), 0, 8, 64 * G, whole=True)
    assert place(cpu_only, alone, "fill_first") == (Placement("n1", ()),)


# --------------------------------------------------------------------------- a pass


def test_a_cpu_only_job_does_not_start_beside_a_running_exclusive_one() -> None:
    d = schedule_pass([held_whole()], [job("c", gpus=0)])
    assert d.starts == []


def test_an_exclusive_job_waits_for_a_job_that_holds_nothing() -> None:
    d = schedule_pass([cpu_node(bare_jobs=1)], [job("x", ask=WHOLE)], [bare("cpu")])
    assert d.starts == []
    assert d.reasons["x"] == "waiting for a whole node"


def test_in_one_pass_an_exclusive_job_and_a_cpu_only_one_do_not_share() -> None:
    for first, second in (
        (job("x", ask=WHOLE), job("c", gpus=0)),
        (job("c", gpus=0), job("x", ask=WHOLE)),
    ):
        d = schedule_pass([cpu_node()], [first, replace_submit(second, 1.0)], policy="fifo")
        assert set(started(d)) == {first.job_id}


def replace_submit(req: JobRequest, submit: float) -> JobRequest:
    from dataclasses import replace

    return replace(req, submit_time=submit)


def test_backfill_reserves_the_node_for_an_exclusive_head_once_the_cpu_only_job_ends() -> None:
    head = job("x", submit=1.0, time_limit=HOUR, ask=WHOLE)
    # A one-GPU job that would outlast the CPU-only job may not take the head's node...
    long = job("long", submit=2.0, gpus=1, time_limit=3 * HOUR)
    # ...nor may another CPU-only job, though it holds nothing the head needs but the node.
    cpu = job("cpu2", submit=3.0, gpus=0, time_limit=3 * HOUR)
    d = schedule_pass([cpu_node(bare_jobs=1)], [head, long, cpu], [bare("cpu", ends_in=HOUR)])
    assert d.starts == []
    assert d.reasons["x"] == "waiting for a whole node"
    # One that ends before the head's start may go first.
    short = job("short", submit=2.0, gpus=1, time_limit=HOUR / 2)
    d = schedule_pass([cpu_node(bare_jobs=1)], [head, short], [bare("cpu", ends_in=HOUR)])
    assert set(started(d)) == {"short"}


def test_an_exclusive_head_preempts_a_job_that_holds_nothing() -> None:
    victim = bare("cpu", ends_in=10 * HOUR, preemptible=True, priority=0)
    head = job("x", priority=1000, ask=WHOLE)
    d = schedule_pass([cpu_node(bare_jobs=1)], [head], [victim], preemption=True)
    assert d.preempt == ["cpu"]


# --------------------------------------------------------------------------- per-user limits


def test_the_user_gpu_limit_counts_every_gpu_an_exclusive_job_holds() -> None:
    d = schedule_pass([cpu_node()], [job("x", gpus=1, ask=WHOLE)], max_gpus_per_user=2)
    assert d.starts == []
    assert d.reasons["x"] == "the job needs 4 GPUs but user alice may use at most 2"
    d = schedule_pass([cpu_node()], [job("x", gpus=1, ask=WHOLE)], max_gpus_per_user=4)
    assert set(started(d)) == {"x"}


def test_the_limit_of_an_exclusive_job_does_not_hold_up_the_queue() -> None:
    nodes = [cpu_node("n1"), cpu_node("n2")]
    d = schedule_pass(
        nodes, [job("x", ask=WHOLE), job("y", submit=1.0)], policy="fifo", max_gpus_per_user=2
    )
    assert set(started(d)) == {"y"}
    assert "may use at most 2" in d.reasons["x"]
