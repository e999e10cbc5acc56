"""CPUs and memory beside GPUs in the scheduler core: every fit counts all three."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import (
    HOUR,
    MIB_PER_GIB,
    PASS_NOW,
    cpu_node,
    job,
    node,
    running,
    schedule_pass,
    started,
)
from mgpu.model import WaitCode
from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.scheduler import (
    FreePool,
    JobRequest,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    could_ever_fit,
    place,
    schedule,
)
from mgpu.scheduler.types import code_of

NOW = PASS_NOW
G = MIB_PER_GIB


def asks(**kw: object) -> ResourceAsk:
    return ResourceAsk(**kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- one node


def test_free_gpus_without_free_cpus_are_no_room() -> None:
    pool = FreePool([cpu_node(free_cpus=0)])
    assert place(job(gpus=1, ask=asks(cpus_per_node=2)), pool, "fill_first") is None
    # The same job asking nothing still fits: its CPUs are shared as before.
    assert place(job(gpus=1), pool, "fill_first") == (Placement("n1", (0,)),)


def test_a_placement_carries_the_cpus_and_memory_held() -> None:
    pool = FreePool([cpu_node(cpus=16)])
    got = place(job(gpus=2, ask=asks(cpus_per_gpu=3, mem_per_gpu_mb=4 * G)), pool, "fill_first")
    assert got == (Placement("n1", (0, 1), 0, 6, 8 * G),)
    per_cpu = place(job(gpus=1, ask=asks(cpus_per_node=4, mem_per_cpu_mb=G)), pool, "spread")
    assert per_cpu == (Placement("n1", (0,), 0, 4, 4 * G),)


def test_a_node_that_does_not_report_cpus_holds_no_job_asking_for_them() -> None:
    pool = FreePool([node("n1", gpus=4)])  # cpus=0: an agent that does not say
    assert place(job(ask=asks(cpus_per_node=1)), pool, "fill_first") is None
    assert place(job(ask=asks(mem_per_node_mb=512)), pool, "fill_first") is None
    assert place(job(), pool, "fill_first") == (Placement("n1", (0,)),)


def test_the_job_goes_where_its_cpus_are_free() -> None:
    nodes = [cpu_node("n1", free_cpus=1), cpu_node("n2", gpus=4, free=(0, 1), free_cpus=8)]
    # fill_first would pick the busier n2 anyway; the CPUs decide against n1 under spread.
    got = place(job(gpus=1, ask=asks(cpus_per_node=4)), FreePool(nodes), "spread")
    assert got == (Placement("n2", (0,), 0, 4, 0),)


def test_two_jobs_whose_gpus_fit_but_cpus_do_not_run_one_after_the_other() -> None:
    a = job("a", submit=1.0, gpus=1, time_limit=HOUR, ask=asks(cpus_per_node=6))
    b = job("b", submit=2.0, gpus=1, time_limit=HOUR, ask=asks(cpus_per_node=6))
    first = schedule_pass([cpu_node()], [a, b])
    assert set(started(first)) == {"a"}
    assert first.reasons["b"] == "waiting for 6 CPUs: the most free on one node is 2"
    assert code_of(first.reasons["b"]) is WaitCode.RESOURCES
    assert first.expected_start["b"] == NOW + HOUR  # when a's CPUs come back
    # The next pass, a running: b still waits, although 3 GPUs are free.
    (pa,) = started(first)["a"]
    busy = cpu_node(free=(1, 2, 3), free_cpus=2)
    holding = RunningJob("a", "alice", (pa,), NOW, HOUR)
    assert started(schedule_pass([busy], [b], [holding])) == {}
    # Once a ended, b starts.
    assert set(started(schedule_pass([cpu_node()], [b]))) == {"b"}


def test_a_lab_that_asks_nothing_packs_gpus_on_two_cores() -> None:
    # rule 6: --fake-gpus 4 on two cores still runs four one-GPU jobs at once
    laptop = cpu_node("laptop", gpus=4, cpus=2)
    d = schedule_pass([laptop], [job(f"j{i}", submit=float(i)) for i in range(4)])
    assert len(d.starts) == 4
    assert all(p.cpus == 0 and p.mem_mb == 0 for s in d.starts for p in s.placements)


def test_memory_counts_like_cpus_and_names_itself_in_the_reason() -> None:
    nodes = [cpu_node("n1", free_mem_mb=10 * G), cpu_node("n2", free_mem_mb=12 * G + 512)]
    d = schedule_pass(nodes, [job("big", gpus=1, ask=asks(mem_per_node_mb=16 * G))])
    assert d.reasons["big"] == "waiting for 16G of memory: the most free on one node is 12.5G"


def test_all_of_a_nodes_memory_needs_all_of_it_free() -> None:
    whole = asks(mem_per_node_mb=0)
    pool = FreePool([cpu_node("n1", free_mem_mb=63 * G), cpu_node("n2", free=(1, 2, 3))])
    assert place(job(ask=whole), pool, "fill_first") == (Placement("n2", (1,), 0, 0, 64 * G),)


def test_a_share_job_holds_its_cpus_on_its_gpus_node() -> None:
    shared = cpu_node("n1", free=(1, 2, 3), shared={0: 500}, free_cpus=1)
    roomy = cpu_node("n2", free=(1, 2, 3), shared={0: 500})
    req = job(gpu_share=250, ask=asks(cpus_per_node=2))
    # fill_first packs onto a shared GPU with room: n1's has, but not n1's CPUs.
    assert place(req, FreePool([shared, roomy]), "fill_first") == (
        Placement("n2", (0,), 250, 2, 0),
    )


# --------------------------------------------------------------------------- exclusive


def test_exclusive_takes_an_idle_node_whole() -> None:
    nodes = [cpu_node("n1", free=(1, 2, 3), free_cpus=7), cpu_node("n2")]
    got = place(job(gpus=1, ask=asks(exclusive=True)), FreePool(nodes), "fill_first")
    assert got == (Placement("n2", (0, 1, 2, 3), 0, 8, 64 * G, True),)


def test_exclusive_keeps_a_node_to_one_job() -> None:
    only = cpu_node("n1")
    d = schedule_pass(
        [only], [job("x", submit=1.0, ask=asks(exclusive=True)), job("y", submit=2.0)]
    )
    assert set(started(d)) == {"x"}
    assert d.reasons["y"] == "waiting for 1 GPU"
    # Nor does an exclusive job start beside a running one, even a job asking nothing.
    busy = cpu_node("n1", free=(1, 2, 3))
    d = schedule_pass([busy], [job("x", ask=asks(exclusive=True))])
    assert d.reasons["x"] == "waiting for a whole node"


# --------------------------------------------------------------------------- gang and split


def test_each_node_of_a_gang_holds_its_cpus() -> None:
    nodes = [cpu_node("n1", free_cpus=2), cpu_node("n2"), cpu_node("n3")]
    req = job(gpus=4, nodes=2, gpus_per_node=2, ask=asks(cpus_per_gpu=2, mem_per_node_mb=G))
    got = place(req, FreePool(nodes), "fill_first")
    assert got == (
        Placement("n2", (0, 1), 0, 4, G),
        Placement("n3", (0, 1), 0, 4, G),
    )
    pool = FreePool([nodes[0], nodes[1]])
    assert place(req, pool, "fill_first") is None


def test_a_split_job_takes_only_as_many_gpus_as_each_nodes_cpus_allow() -> None:
    nodes = [cpu_node("n1", free_cpus=2), cpu_node("n2", free_cpus=4)]
    req = job(gpus=6, distributed=True, ask=asks(cpus_per_gpu=1))
    got = place(req, FreePool(nodes), "fill_first")
    assert got == (Placement("n2", (0, 1, 2, 3), 0, 4, 0), Placement("n1", (0, 1), 0, 2, 0))
    assert place(replace(req, gpus=7), FreePool(nodes), "fill_first") is None


# --------------------------------------------------------------------------- backfill, planner


def test_backfill_does_not_take_the_cpus_the_head_waits_for() -> None:
    # 4 GPUs free, 2 of 8 CPUs free: the head needs 8 CPUs, free in an hour.
    nodes = [cpu_node(free_cpus=2)]
    holder = running("r1", "n1", (), now=NOW, ends_in=HOUR, cpus=6)
    head = job("head", submit=1.0, gpus=1, time_limit=HOUR, ask=asks(cpus_per_node=8))
    long = job("long", submit=2.0, gpus=1, time_limit=3 * HOUR, ask=asks(cpus_per_node=2))
    short = job("short", submit=3.0, gpus=1, time_limit=HOUR / 2, ask=asks(cpus_per_node=2))
    d = schedule_pass(nodes, [head, long, short], [holder])
    assert set(started(d)) == {"short"}
    assert d.expected_start["head"] == NOW + HOUR
    assert d.reasons["head"] == "waiting for 8 CPUs: the most free on one node is 2"
    # `long` waits until after the head's hour: the head holds all 8 CPUs until then.
    assert d.expected_start["long"] == NOW + 2 * HOUR
    # A job asking nothing still backfills onto the free GPUs.
    d = schedule_pass(nodes, [head, job("plain", submit=2.0, time_limit=3 * HOUR)], [holder])
    assert set(started(d)) == {"plain"}


def test_the_planner_holds_running_jobs_cpus_until_they_end() -> None:
    nodes = [cpu_node(free=(1, 2, 3), free_cpus=2)]
    holder = running("r1", "n1", (0,), now=NOW, ends_in=2 * HOUR, cpus=6)
    waiting = [
        job("a", submit=1.0, gpus=1, time_limit=HOUR, ask=asks(cpus_per_node=4)),
        job("b", submit=2.0, gpus=1, time_limit=HOUR, ask=asks(cpus_per_node=4)),
    ]
    d = schedule_pass(nodes, waiting, [holder], policy="priority", plan_jobs=100)
    assert d.expected_start == {"a": NOW + 2 * HOUR, "b": NOW + 2 * HOUR}
    assert d.waiting_on["a"] == ("r1",)


# --------------------------------------------------------------------------- preemption


def test_preempting_a_job_frees_its_cpus_for_the_head() -> None:
    nodes = [cpu_node(free=(1, 2, 3), free_cpus=2)]
    victim = running("low", "n1", (0,), now=NOW, ends_in=10 * HOUR, cpus=6, preemptible=True)
    head = job("head", gpus=1, priority=1000, ask=asks(cpus_per_node=8))
    d = schedule_pass(nodes, [head], [victim], preemption=True)
    assert d.preempt == ["low"]
    # Without the CPU ask the head fits now: no one is preempted.
    d = schedule_pass(nodes, [replace(head, ask=NO_ASK)], [victim], preemption=True)
    assert d.preempt == [] and set(started(d)) == {"head"}


# --------------------------------------------------------------------------- reservations


def test_a_reservations_job_needs_the_cpus_of_its_nodes() -> None:
    from mgpu.scheduler import Reservation

    res = Reservation("r", (Placement("n1", (0, 1)),), NOW - 1, NOW + HOUR)
    nodes = [cpu_node(free=(0, 1, 2), free_cpus=1)]
    member = job("m", gpus=1, reservation="r", ask=asks(cpus_per_node=2))
    d = schedule(
        Snapshot(
            now=NOW,
            nodes=nodes,
            pending=[member],
            reservations=[res],
            config=SchedulerConfig(plan_jobs=0),
        )
    )
    assert d.starts == []
    assert d.reasons["m"] == ("waiting for 2 CPUs: the most free on one node is 1 of reservation r")
    roomy = [cpu_node(free=(0, 1, 2))]
    d = schedule(Snapshot(now=NOW, nodes=roomy, pending=[member], reservations=[res]))
    assert started(d) == {"m": (Placement("n1", (0,), 0, 2, 0),)}


# --------------------------------------------------------------------------- never fits


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (job(ask=asks(cpus_per_node=4)), None),
        (
            job(ask=asks(cpus_per_node=64)),
            "Requested node configuration is not available: "
            "64 CPUs asked per node, the most any node offers is 32",
        ),
        (
            job(gpus=4, ask=asks(cpus_per_gpu=9)),
            "Requested node configuration is not available: "
            "36 CPUs asked per node, the most any node offers is 32",
        ),
        (
            job(ask=asks(mem_per_node_mb=200 * G)),
            "Requested node configuration is not available: "
            "200G of memory asked per node, the most any node offers is 128G",
        ),
        (
            job(ask=asks(cpus_per_node=32, mem_per_node_mb=100 * G)),
            "Requested node configuration is not available: "
            "no node offers 1 GPU with 32 CPUs and 100G of memory together",
        ),
        (
            job(gpus=2, nodes=2, gpus_per_node=1, ask=asks(cpus_per_node=20)),
            "Requested node configuration is not available: the job needs 2 nodes with "
            "1 GPU and 20 CPUs each but only 1 has that much",
        ),
        (job(ask=asks(exclusive=True)), None),
        (job(ask=asks(mem_per_node_mb=0)), None),
        (
            job(gpu_share=500, ask=asks(exclusive=True)),
            "--gpu-share asks for part of one GPU; it cannot be combined with --exclusive",
        ),
    ],
)
def test_could_ever_fit_refuses_with_slurms_sentence(req: JobRequest, expected: str) -> None:
    cluster = [
        cpu_node("n1", cpus=32, mem_mb=64 * G),
        cpu_node("n2", cpus=16, mem_mb=128 * G),
    ]
    assert could_ever_fit(req, cluster) == expected


def test_a_job_no_node_that_is_up_could_hold_does_not_block_the_queue() -> None:
    nodes = [cpu_node("n1", cpus=8), cpu_node("n2", cpus=64, up=False)]
    big = job("big", submit=1.0, ask=asks(cpus_per_node=32))
    d = schedule_pass(nodes, [big, job("small", submit=2.0)], policy="fifo")
    assert set(started(d)) == {"small"}
    assert d.reasons["big"] == "n2 is down or draining"


def test_a_gangs_reason_names_what_each_node_must_have_free() -> None:
    nodes = [cpu_node("n1", free_cpus=2), cpu_node("n2")]
    gang = job("g", gpus=4, nodes=2, gpus_per_node=2, ask=asks(cpus_per_node=4, mem_per_gpu_mb=G))
    d = schedule_pass(nodes, [gang])
    assert (
        d.reasons["g"]
        == "waiting for 2 nodes with 2 free GPUs and 4 CPUs and 2G of memory free each"
    )
    whole = job("w", gpus=2, nodes=2, gpus_per_node=1, ask=asks(exclusive=True))
    assert schedule_pass([cpu_node("n1", free=(1, 2, 3)), cpu_node("n2")], [whole]).reasons[
        "w"
    ] == ("waiting for 2 whole nodes")
