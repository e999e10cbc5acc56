"""Slurm's environment and GPU binding in the controller (issue 31, items 1, 4, 10):

* a Slurm job's own MASTER_ADDR/MASTER_PORT/... (the submitter's, or what its script
  exported before `srun`) reach its script and its steps' tasks; mgpu's rendezvous
  variables only for `--distributed`, and only where the job has none;
* `--gpu-bind` decides what each task of a step sees (mgpu.gpubind);
* a Slurm job's dependency that can never be met, and a time limit over its partition's,
  leave it queued with Slurm's typed reasons (DependencyNeverSatisfied,
  PartitionTimeLimit), unless `--kill-on-invalid-dep=yes`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness, seen_env

from mgpu.master.control.srun import SrunRequest, plan_tasks
from mgpu.master.control.submit import SubmitError
from mgpu.model import JobState, WaitCode
from mgpu.slurm import states

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NODE_RANK", "PET_NNODES")


def _started_batch(h: Harness, env: dict[str, str], **fields: Any) -> str:
    job_id = h.submit("sleep 100", env=env, slurm={"batch": True}, **fields)
    h.tick()
    if h.agents["n1"].port_requests():
        h.agents["n1"].port(job_id)
    h.agents["n1"].started(job_id)
    return job_id


def test_a_slurm_jobs_own_rendezvous_variables_reach_its_script_and_its_steps(
    h: Harness,
) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    mine = {"MASTER_PORT": "29500", "PET_NNODES": "2", "MY": "x"}
    job_id = _started_batch(h, mine, nodes=2, gpus_per_node=1)
    (script,) = n1.launches()
    env = seen_env(script)
    # The submitter's values stand; mgpu sets none of its own for a Slurm job.
    assert (env["MASTER_PORT"], env["PET_NNODES"], env["MY"]) == ("29500", "2", "x")
    assert not {"MASTER_ADDR", "WORLD_SIZE", "NNODES", "NODE_RANK"} & env.keys()
    # What the script exported before srun is what every task sees.
    exported = {"MASTER_ADDR": "host-n1", "MASTER_PORT": "12345", "WORLD_SIZE": "7", "MY": "y"}
    h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["true"], env=exported))
    h.settle()
    tasks = [seen_env(m) for m in n1.launches() + n2.launches()]
    assert len(tasks) == 2
    for task in tasks:
        assert {k: task[k] for k in exported} == exported
        assert "NODE_RANK" not in task and "PET_MASTER_ADDR" not in task
    assert [t["SLURM_PROCID"] for t in tasks] == ["0", "1"]  # the task's own still set


def test_distributed_jobs_get_mgpus_rendezvous_only_where_they_have_none(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    native = h.submit("true", nodes=2, gpus_per_node=1, env={"MASTER_PORT": "1"})
    h.tick()
    n1.port(native)
    envs = [seen_env(m) for m in n1.launches() + n2.launches()]
    port = str(h.job(native).port)
    # mgpu's own jobs: as before (a user's MASTER_PORT is not passed, the scheduler's is).
    assert [(e["MASTER_PORT"], e["NODE_RANK"]) for e in envs] == [(port, "0"), (port, "1")]
    for slot in h.job(native).allocation:
        h.agents[slot.node_id].exited(native, 0)
    asked = h.submit(
        "true", nodes=2, gpus_per_node=1, distributed=True, env={"MASTER_PORT": "1"}, slurm={}
    )
    h.tick()
    n1.port(asked)
    envs = [seen_env(m) for m in n1.launches() + n2.launches()]
    assert [(e["MASTER_PORT"], e["NODE_RANK"]) for e in envs] == [("1", "0"), ("1", "1")]


BIND_CASES = [
    (None, 1, [[0], [1], [2], [3]]),  # --gpus-per-task=1 implies per_task:1
    ("none", 1, [[0, 1, 2, 3]] * 4),
    ("closest", None, [[0, 1, 2, 3]] * 4),
    ("single:2", None, [[0], [0], [1], [1]]),
    ("map_gpu:3,2", None, [[3], [2], [3], [2]]),
    ("map_gpu:0*3,1", None, [[0], [0], [0], [1]]),
    ("mask_gpu:0x3,0xc", None, [[0, 1], [2, 3], [0, 1], [2, 3]]),
    ("map_gpu:9", None, [[0]] * 4),  # names no GPU of the step: its first, as Slurm
    ("per_task:2", None, [[0, 1], [2, 3], [0], [0]]),  # ran out: the first
]


@pytest.mark.parametrize(("bind", "per_task", "expected"), BIND_CASES)
def test_gpu_bind_decides_what_each_task_sees(
    bind: str | None, per_task: int | None, expected: list[list[int]]
) -> None:
    request = SrunRequest(argv=["x"], env={}, ntasks=4, gpus_per_task=per_task, gpu_bind=bind)
    plan = plan_tasks("7", [["n1"]], [[0, 1, 2, 3]], None, None, request)
    assert plan.gpu_ids == expected
    assert plan.bind_notes == [None] * 4


def test_the_jobs_gpu_bind_is_the_steps_default_and_verbose_says_it() -> None:
    request = SrunRequest(argv=["x"], env={}, ntasks=2)
    plan = plan_tasks("7", [["n1"]], [[2, 3]], None, 1, request, job_gpu_bind="verbose,none")
    assert plan.gpu_ids == [[2, 3], [2, 3]]
    line = "gpu-bind: usable_gres=0xC; bit_alloc=0xC; local_inx=0; global_list=2,3; local_list=2,3"
    assert plan.bind_notes == [line, line]
    own = SrunRequest(argv=["x"], env={}, ntasks=2, gpu_bind="map_gpu:3")
    assert plan_tasks("7", [["n1"]], [[2, 3]], None, 1, own, "none").gpu_ids == [[3], [3]]
    with pytest.raises(SubmitError, match=r"^Invalid --gpu-bind argument: gpu:sideways$"):
        plan_tasks("7", [["n1"]], [[2, 3]], None, None, request, job_gpu_bind="sideways")


def test_a_never_satisfiable_dependency_leaves_a_slurm_job_queued(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    first = h.start()
    kept = h.submit(dependency=f"afterok:{first}", slurm={})
    killed = h.submit(dependency=f"afterok:{first}", slurm={"kill_invalid_dep": True})
    native = h.submit(dependency=f"afterok:{first}")
    h.tick()
    assert h.job(kept).reason_code == WaitCode.DEPENDENCY
    a.exited(first, 1)
    h.tick()
    h.tick()
    job = h.job(kept)
    assert (job.state, job.reason_code) == (JobState.QUEUED, WaitCode.DEPENDENCY_NEVER_SATISFIED)
    assert states.reason(job.to_record()) == "DependencyNeverSatisfied"
    assert h.job(killed).state == JobState.CANCELLED  # --kill-on-invalid-dep=yes
    assert h.job(native).state == JobState.CANCELLED  # mgpu's own jobs: as before


def test_a_time_limit_over_the_partitions_waits_as_partition_time_limit(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness({"partitions": [{"name": "short", "default": True, "max_time": "1:00:00"}]})
    h.agent("n1", gpus=1)
    over = h.submit("true", time="2:00:00", slurm={})
    h.tick()
    job = h.job(over)
    assert (job.state, job.reason_code) == (JobState.QUEUED, WaitCode.PARTITION_TIME_LIMIT)
    assert states.reason(job.to_record()) == "PartitionTimeLimit"
    short = h.submit("true", time="30:00", slurm={})
    h.tick()  # the shorter one passes it
    assert (h.job(short).state, h.job(over).state) == (JobState.RUNNING, JobState.QUEUED)
