"""A Slurm job's CPUs and memory in the master: its block's -c, --cpus-per-gpu, --mem*,
--exclusive become the job's ask (mgpu.slurm.resources.slurm_ask), are granted as any
job's, reach SLURM_* with the granted values, and a job no node could ever hold is
refused in Slurm's words with nothing stored.  `srun -c` in a job: the step's CPUs."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness

from mgpu.master.control.slurmblock import parse_slurm_block
from mgpu.master.control.srun import SrunRequest
from mgpu.master.control.submit import SubmitError
from mgpu.model import JobState
from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.spec import SpecError


def _env(h: Harness, job_id: str) -> dict[str, str]:
    slot = h.job(job_id).allocation[0]
    launch = next(m for m in h.agents[slot.node_id].launches() if m.job_id == job_id)
    return dict(launch.env)


def test_cpus_per_task_times_tasks_is_held_and_said(h: Harness) -> None:
    h.agent("n1", gpus=2, cpus=8, mem_mb=8192)
    first = h.submit("true", gpus=1, slurm={"ntasks": 2, "cpus_per_task": 3})
    second = h.submit("true", gpus=1, slurm={"ntasks": 2, "cpus_per_task": 3})
    h.tick()
    assert h.job(first).ask == ResourceAsk(cpus_per_node=6)
    assert h.job(first).state == JobState.RUNNING
    assert h.job(second).state == JobState.QUEUED  # a GPU is free, 2 CPUs are not 6
    env = _env(h, first)
    assert env["SLURM_CPUS_ON_NODE"] == "6"
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "6"
    assert env["SLURM_CPUS_PER_TASK"] == "3"
    assert "SLURM_MEM_PER_NODE" not in env


def test_a_job_that_names_no_cpus_or_memory_asks_nothing(h: Harness) -> None:
    """Rule 6: tasks alone ask for no CPUs; four such jobs share a two-core node."""
    h.agent("n1", gpus=4, cpus=2, mem_mb=4096)
    jobs = [h.submit("true", gpus=1, slurm={"ntasks": 4}) for _ in range(4)]
    h.tick()
    assert [h.job(j).state for j in jobs] == [JobState.RUNNING] * 4
    assert h.job(jobs[0]).ask == NO_ASK
    env = _env(h, jobs[0])
    assert (env["SLURM_CPUS_ON_NODE"], env["SLURM_JOB_CPUS_PER_NODE"]) == ("4", "4")


def test_memory_per_gpu_and_whole_node_memory_are_granted(h: Harness) -> None:
    h.agent("n1", gpus=4, cpus=8, mem_mb=8192)
    per_gpu = h.submit("true", gpus=2, slurm={"mem_per_gpu_mb": 1024})
    h.tick()
    assert h.job(per_gpu).allocation[0].mem_mb == 2048
    env = _env(h, per_gpu)
    assert env["SLURM_MEM_PER_GPU"] == "1024" and "SLURM_MEM_PER_NODE" not in env
    h.agents["n1"].exited(per_gpu)
    whole = h.submit("true", gpus=1, slurm={"mem_per_node_mb": 0})
    h.tick()
    assert h.job(whole).allocation[0].mem_mb == 8192
    assert _env(h, whole)["SLURM_MEM_PER_NODE"] == "8192"  # --mem=0: what it holds


def test_exclusive_holds_every_cpu_of_its_node(h: Harness) -> None:
    h.agent("n1", gpus=2, cpus=8, mem_mb=8192)
    job = h.submit("true", gpus=1, slurm={"exclusive": True})
    h.tick()
    assert h.job(job).ask.exclusive
    slot = h.job(job).allocation[0]
    assert (slot.cpus, slot.mem_mb) == (8, 8192)
    assert _env(h, job)["SLURM_CPUS_ON_NODE"] == "8"


def test_mgpus_own_cpus_stand_over_slurms(h: Harness) -> None:
    h.agent("n1", gpus=2, cpus=8, mem_mb=8192)
    job = h.submit("true", gpus=1, cpus=2, slurm={"cpus_per_task": 6, "mem_per_gpu_mb": 512})
    assert h.job(job).ask == ResourceAsk(cpus_per_node=2, mem_per_gpu_mb=512)


@pytest.mark.parametrize(
    ("slurm", "why"),
    [
        (
            {"ntasks": 4, "cpus_per_task": 4},
            "Requested node configuration is not available: 16 CPUs asked per node, the "
            "most any node offers is 8",
        ),
        (
            {"mem_per_node_mb": 16384},
            "Requested node configuration is not available: 16G of memory asked per node, "
            "the most any node offers is 8G",
        ),
    ],
)
def test_what_no_node_could_hold_is_refused_and_nothing_stored(
    h: Harness, slurm: dict[str, Any], why: str
) -> None:
    h.agent("n1", gpus=2, cpus=8, mem_mb=8192)
    with pytest.raises(SubmitError) as e:
        h.submit("true", gpus=1, slurm={"batch": True, **slurm})
    assert str(e.value) == why
    assert h.cl.jobs == {}


@pytest.mark.parametrize(
    ("slurm", "why"),
    [
        (
            {"mem_per_node_mb": 10, "mem_per_gpu_mb": 10},
            "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
        ),
        (
            {"mem_per_cpu_mb": 10, "mem_per_node_mb": 0},
            "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
        ),
        (
            {"cpus_per_task": 1, "cpus_per_gpu": 1},
            "--cpus-per-gpu is mutually exclusive with --cpus-per-task",
        ),
        ({"exclusive": "yes"}, "the slurm block's exclusive must be true or false"),
        ({"cpus_per_gpu": 0}, "--cpus-per-gpu needs a whole number from 1"),
    ],
)
def test_a_block_slurm_would_refuse_is_refused_in_its_words(
    slurm: dict[str, Any], why: str
) -> None:
    """The API's own check, for a block not sent by mgpu's sbatch (which checks first)."""
    with pytest.raises(SpecError) as e:
        parse_slurm_block(slurm)
    assert str(e.value).startswith(why)


def test_srun_c_is_the_steps_cpus_within_the_jobs(h: Harness) -> None:
    n1 = h.agent("n1", gpus=2, cpus=8, mem_mb=8192)
    job = h.submit("sleep 100", gpus=1, slurm={"batch": True, "ntasks": 2, "cpus_per_task": 2})
    h.tick()
    n1.started(job)
    sruns = h.cl.allocations.sruns
    with pytest.raises(SubmitError, match="More processors requested than permitted"):
        sruns.start(job, SrunRequest(argv=["true"], env={}, ntasks=2, cpus_per_task=3))
    group, _ = sruns.start(job, SrunRequest(argv=["true"], env={}, ntasks=1, cpus_per_task=4))
    h.settle()
    (task,) = [m for m in n1.launches() if m.job_id.startswith(group.id)]
    assert task.env["SLURM_CPUS_PER_TASK"] == "4"
    assert task.env["SLURM_CPUS_ON_NODE"] == "4"  # the job's on that node
