"""`max_mem_per_cpu` (Slurm's MaxMemPerCPU): a job asking more memory per CPU gets more CPUs.

Slurm's `_valid_pn_min_mem` (src/slurmctld/job_mgr.c): a `--mem-per-cpu` of M over the cap C
multiplies the job's CPUs per task by r = ceil(M / C) and gives each CPU ceil(M / r); a
memory per node raises the CPUs per node to ceil(memory / C).  The man page: "that job's
count of CPUs per task will try to automatically increase".  The job is not refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu.config import load_config
from mgpu.master.state.asks import AskRules
from mgpu.model import Job
from mgpu.resources import NO_ASK, ResourceAsk, within_mem_per_cpu
from mgpu.slurmoptions import SlurmOptions

G = 1024


@pytest.mark.parametrize(
    ("ask", "gpus", "raised"),
    [
        # --mem-per-cpu 10G -c 2 under a 4G cap: r = 3, so 6 CPUs of 3414M each.
        (
            ResourceAsk(cpus_per_node=2, mem_per_cpu_mb=10 * G),
            1,
            ResourceAsk(cpus_per_node=6, mem_per_cpu_mb=3414),
        ),
        # --mem-per-cpu alone (one task of one CPU): r CPUs.
        (ResourceAsk(mem_per_cpu_mb=9 * G), 1, ResourceAsk(cpus_per_node=3, mem_per_cpu_mb=3072)),
        # --cpus-per-gpu with --mem-per-cpu: the CPUs per GPU are multiplied.
        (
            ResourceAsk(cpus_per_gpu=2, mem_per_cpu_mb=8 * G),
            2,
            ResourceAsk(cpus_per_gpu=4, mem_per_cpu_mb=4 * G),
        ),
        # --mem 20G -c 2 per node: at least ceil(20G / 4G) = 5 CPUs.
        (
            ResourceAsk(cpus_per_node=2, mem_per_node_mb=20 * G),
            1,
            ResourceAsk(cpus_per_node=5, mem_per_node_mb=20 * G),
        ),
        # --mem-per-gpu 6G on 2 GPUs with 1 CPU per GPU: 12G needs 3 CPUs.
        (
            ResourceAsk(cpus_per_gpu=1, mem_per_gpu_mb=6 * G),
            2,
            ResourceAsk(cpus_per_node=1, cpus_per_gpu=1, mem_per_gpu_mb=6 * G),
        ),
        # Within the cap, or all of a node's memory: unchanged.
        (ResourceAsk(cpus_per_node=4, mem_per_node_mb=16 * G), 1, None),
        (ResourceAsk(mem_per_cpu_mb=4 * G), 1, None),
        (ResourceAsk(mem_per_node_mb=0), 1, None),
        (ResourceAsk(exclusive=True), 1, None),
    ],
)
def test_cpus_are_raised_as_slurm_raises_them(
    ask: ResourceAsk, gpus: int, raised: ResourceAsk | None
) -> None:
    got = within_mem_per_cpu(ask, 4 * G, gpus)
    assert got == (ask if raised is None else raised)
    cpus = got.cpus_on(gpus, 0)
    assert got.whole_memory or got.mem_on(gpus, cpus, 0) <= 4 * G * cpus


def test_no_cap_changes_nothing() -> None:
    ask = ResourceAsk(mem_per_cpu_mb=100 * G)
    assert within_mem_per_cpu(ask, None, 1) is ask


def test_the_scheduler_sees_the_raised_count_and_the_job_keeps_its_ask(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "resources: {max_mem_per_cpu: 4G}\npartitions: [{name: big, max_mem_per_cpu: 16G}]\n"
    )
    rules = AskRules.from_config(load_config(path))
    job = Job(id="1", user="u", argv=["true"], command="true", gpus=2)
    job.ask = ResourceAsk(mem_per_node_mb=20 * G)
    assert rules.effective(job) == ResourceAsk(cpus_per_node=5, mem_per_node_mb=20 * G)
    assert job.ask == ResourceAsk(mem_per_node_mb=20 * G)  # as given
    job.slurm = SlurmOptions(partition="big")  # its partition's cap: 2 CPUs are enough
    assert rules.effective(job) == ResourceAsk(cpus_per_node=2, mem_per_node_mb=20 * G)
    nothing = Job(id="2", user="u", argv=["true"], command="true")
    assert rules.effective(nothing) is NO_ASK
