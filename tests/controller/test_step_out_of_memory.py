"""A srun step whose task its node killed for its memory (Exited `out_of_memory`), as Slurm:
the step ends OUT_OF_MEMORY (sacct's `ID.N` line, exit `0:125`), srun says `HOST: task N:
Out Of Memory` and exits 1 (srun.c: "Exit code 1" after an OOM), and the job itself ends
as its batch script does (Slurm's batch step is OUT_OF_MEMORY only for its own memory)."""

from __future__ import annotations

from harness import Harness

from mgpu.client import steps as client_steps
from mgpu.master.control.srun import SrunRequest
from mgpu.model import EndCode, JobState
from mgpu.slurm import sacct


def _batch(h: Harness) -> str:
    job_id = h.submit("sleep 100", nodes=2, gpus_per_node=1, slurm={"batch": True})
    h.tick()
    if h.agents["n1"].port_requests():
        h.agents["n1"].port(job_id)
    h.agents["n1"].started(job_id)
    return job_id


def test_a_step_killed_for_its_memory_ends_out_of_memory_and_the_job_as_its_script(
    h: Harness,
) -> None:
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = _batch(h)
    group, _ = h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["hog"], env={}))
    h.settle()
    t0, t1 = group.tasks
    n2.exited(t1.id, 137, epoch=t1.epoch, out_of_memory=True)
    n1.exited(t0.id, 0, epoch=t0.epoch)
    assert group.done and group.out_of_memory

    (step,) = h.cl.job_steps([job_id])[job_id]
    assert (step["state"], step["end_code"]) == ("failed", "out_of_memory")
    job = h.job(job_id)
    assert job.state == JobState.RUNNING  # the script goes on: its own exit decides
    (row,) = sacct.step_rows({**h.cl.public_job(job), "steps": [step]})
    assert sacct.GETTERS["State"](row) == "OUT_OF_MEMORY"
    assert sacct.GETTERS["ExitCode"](row) == "0:125"
    assert sacct.GETTERS["State"](h.cl.public_job(job)) == "RUNNING"

    n1.exited(job_id, 1)  # the script ends with srun's 1
    job = h.stored(job_id)
    assert (job.state, job.end_code, job.exit_code) == (JobState.FAILED, EndCode.FAILED, 1)


def test_srun_says_out_of_memory_and_exits_1() -> None:
    tasks = [
        {"task": 0, "host": "n1", "exit_code": 0, "error": None, "out_of_memory": False},
        {"task": 1, "host": "n2", "exit_code": 137, "error": None, "out_of_memory": True},
    ]
    assert client_steps.failures(tasks) == ["n2: task 1: Out Of Memory"]
    assert client_steps._ended("7.s1", {"exit_code": 137, "tasks": tasks}) == 1
    tasks[1]["out_of_memory"] = False  # a plain SIGKILL: its signal, and its code
    assert client_steps.failures(tasks) == ["n2: task 1: Killed"]
    assert client_steps._ended("7.s1", {"exit_code": 137, "tasks": tasks}) == 137
