"""CPUs and memory beside GPUs in the master: what a node offers (its hello, less the
config's reserve), the ledger of what running jobs hold, which CPU ids a job gets and
its launch's grant, the cluster's defaults per GPU, the refusal at submit, and the ledger
rebuilt after a master restart.  A job that asks nothing is unchanged."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import Harness

from mgpu.master.control.submit import SubmitError
from mgpu.model import JobState
from mgpu.protocol import CpuDesc, GpuDesc


def _sent_grant(h: Harness, job_id: str) -> tuple[list[int] | None, int | None]:
    slot = h.job(job_id).allocation[0]
    launch = next(m for m in h.agents[slot.node_id].launches() if m.job_id == job_id)
    return launch.grant.cpus, launch.grant.mem_mb


def test_two_jobs_whose_gpus_fit_but_cpus_do_not_run_one_after_the_other(h: Harness) -> None:
    a = h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    first = h.start(gpus=1, cpus=3)
    second = h.submit(gpus=1, cpus=3)
    h.tick()
    assert h.job(first).state == JobState.RUNNING
    assert h.job(second).state == JobState.QUEUED  # a GPU is free, 1 CPU is not enough
    cpus, mem = _sent_grant(h, first)
    assert cpus is not None and len(cpus) == 3 and mem is None
    slot = h.job(first).allocation[0]
    assert (slot.cpus, slot.cpu_ids, slot.mem_mb) == (3, cpus, None)
    node = h.node("n1").to_public()
    assert (node["cpus"], node["cpus_free"], node["mem_mb"], node["mem_free_mb"]) == (
        4,
        1,
        8192,
        8192,
    )

    a.exited(first)
    h.tick()
    assert h.job(second).state == JobState.RUNNING
    assert h.node("n1").to_public()["cpus_free"] == 1


def test_memory_is_held_as_cpus_are(h: Harness) -> None:
    a = h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    first = h.start(gpus=1, mem="6G")
    second = h.submit(gpus=1, mem="4G")
    h.tick()
    assert h.job(second).state == JobState.QUEUED
    assert _sent_grant(h, first) == (None, 6144)
    assert h.node("n1").to_public()["mem_free_mb"] == 2048
    a.exited(first)
    h.tick()
    assert h.job(second).state == JobState.RUNNING


def test_jobs_that_ask_nothing_share_the_node_as_before(h: Harness) -> None:
    """Rule 6: four one-GPU jobs on a node of four GPUs and two CPUs run side by side."""
    h.agent("n1", gpus=4, cpus=2, mem_mb=4096)
    jobs = [h.submit(gpus=1) for _ in range(4)]
    h.tick()
    assert [h.job(j).state for j in jobs] == [JobState.RUNNING] * 4
    launches = h.agents["n1"].launches()
    assert [(m.grant.cpus, m.grant.mem_mb) for m in launches] == [(None, None)] * 4
    for j in jobs:
        slot = h.job(j).allocation[0]
        assert (slot.cpus, slot.cpu_ids, slot.mem_mb) == (None, None, None)
    assert h.node("n1").to_public()["cpus_free"] == 2


def test_an_older_agent_that_says_nothing_runs_jobs_that_ask_nothing(h: Harness) -> None:
    h.agent("n1", gpus=1)
    job = h.start(gpus=1)
    assert h.job(job).state == JobState.RUNNING
    public = h.node("n1").to_public()
    assert (public["cpus"], public["mem_mb"]) == (None, None)
    with pytest.raises(SubmitError, match="Requested node configuration is not available"):
        h.submit(gpus=1, cpus=1)


def test_a_request_no_node_could_ever_hold_is_refused_with_the_numbers(h: Harness) -> None:
    h.agent("n1", gpus=2, cpus=12, mem_mb=16384)
    with pytest.raises(SubmitError) as e:
        h.submit(gpus=1, cpus=64)
    assert str(e.value) == (
        "Requested node configuration is not available: 64 CPUs asked per node, the most "
        "any node offers is 12"
    )
    with pytest.raises(
        SubmitError,
        match=r"32G of memory asked per node, the most any node offers is 16G",
    ):
        h.submit(gpus=1, mem="32G")
    assert h.cl.jobs == {}  # nothing half-done stored
    h.submit(gpus=1, cpus=12, mem="16G")  # all of it: accepted


def test_the_reserve_is_held_back_from_what_a_node_offers(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(
        {
            "resources": {"reserve": {"cpus": 2, "mem": "1G"}},
            "nodes": [{"node_id": "big", "reserve": {"cpus": 0, "mem": 0}}],
        }
    )
    h.agent("n1", gpus=1, cpus=8, mem_mb=8192)
    h.agent("big", gpus=1, cpus=8, mem_mb=8192)
    assert [c.id for c in h.node("n1").cpus] == [0, 1, 2, 3, 4, 5]  # the highest kept back
    assert h.node("n1").mem_mb == 7168
    assert (len(h.node("big").cpus), h.node("big").mem_mb) == (8, 8192)


def test_the_clusters_defaults_per_gpu_apply_to_jobs_that_ask_nothing(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(
        {
            "resources": {"def_cpus_per_gpu": 2, "def_mem_per_gpu": "1G"},
            "partitions": [{"name": "big", "def_cpus_per_gpu": 3}],
        }
    )
    h.agent("n1", gpus=4, cpus=16, mem_mb=65536)
    plain = h.start(gpus=2)
    slot = h.job(plain).allocation[0]
    assert (slot.cpus, slot.mem_mb) == (4, 2048)
    own = h.start(gpus=1, cpus=1)  # asked for CPUs: only the memory default applies
    slot = h.job(own).allocation[0]
    assert (slot.cpus, slot.mem_mb) == (1, 1024)
    assert h.job(own).ask.cpus_per_gpu is None  # the ask is kept as given
    slurm = h.start(gpus=1, slurm={"partition": "big"})
    slot = h.job(slurm).allocation[0]
    assert (slot.cpus, slot.mem_mb) == (3, 1024)  # the partition's CPUs, the cluster's memory


def test_the_ledger_is_rebuilt_after_a_master_restart(h: Harness) -> None:
    a = h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    first = h.start(gpus=1, cpus=3, mem="5G")
    h.settle()
    held = dict(h.node("n1").cpu_jobs)
    assert len(held) == 3
    h.crash()
    node = h.node("n1")
    assert node.cpu_jobs == held and node.mem_jobs == {first: 5120}
    a.hello([a.running(first)])
    second = h.submit(gpus=1, cpus=2)
    h.tick()
    assert h.job(second).state == JobState.QUEUED  # no CPU given twice
    assert h.node("n1").to_public()["cpus_free"] == 1


def test_cpus_near_the_jobs_gpu_and_whole_cores_are_picked(h: Harness) -> None:
    # Two NUMA nodes of two cores with two threads each (siblings i and i+4); GPU 1 is on
    # NUMA node 1.
    cpus = [CpuDesc(id=i, core=i % 4, numa=(i % 4) // 2) for i in range(8)]
    agent = h.agent("n1", gpus=2, hello=False, cpus=cpus, mem_mb=8192)
    agent.gpus = [
        GpuDesc(index=0, name="Fake GPU", memory_mb=16000, numa_node=0),
        GpuDesc(index=1, name="Fake GPU", memory_mb=16000, numa_node=1),
    ]
    agent.hello()
    job = h.start(gpu_ids="1", cpus=2)
    assert h.job(job).allocation[0].cpu_ids == [2, 6]  # one whole core, on GPU 1's node


def test_more_memory_per_cpu_than_the_cap_gets_more_cpus_as_in_slurm(
    make_harness: Callable[..., Harness],
) -> None:
    """MaxMemPerCPU: Slurm raises the job's CPU count rather than refuse it."""
    h = make_harness({"resources": {"max_mem_per_cpu": "2G"}})
    h.agent("n1", gpus=2, cpus=8, mem_mb=16384)
    job = h.start(gpus=1, cpus=1, mem="6G")
    slot = h.job(job).allocation[0]
    assert (slot.cpus, slot.mem_mb, len(slot.cpu_ids or ())) == (3, 6144, 3)
    assert h.job(job).ask.cpus_per_node == 1  # the ask is kept as given
    # Raised past what any node has: refused as any such request is, with the numbers.
    with pytest.raises(SubmitError, match="10 CPUs asked per node, the most any node offers is 8"):
        h.submit(gpus=1, mem="20G")
