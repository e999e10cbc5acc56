"""Slurm jobs in the controller: numeric ids that survive a master restart, the SLURM_*
environment and -o/-e files in the launch, partitions restricting placement, and the
warning of an unknown partition."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, _run, seen_env

from mgpu.agent import grants
from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.store.sqlite import SqliteStore
from mgpu.model import JobState

PARTITIONS = {
    "cluster": {"name": "lab"},
    "partitions": [
        {"name": "small", "nodes": ["node1"]},
        {"name": "big", "nodes": ["node2", "node3"], "default": True, "max_time": "1:00:00"},
    ],
}


def test_ids_are_numbers_that_grow_and_survive_a_crash(h: Harness) -> None:
    h.agent("node1")
    first = h.submit("true")
    second = h.submit("true")
    assert (first, second) == ("1", "2")
    array = h.submit("true", array="0-3")
    assert array == "3"
    assert h.submit("true") == "7"  # the array's tasks have numbers 3 .. 6
    h.crash()
    assert h.submit("true") == "8"
    assert h.job("3_2").array_job_id == "3"


def test_old_hex_ids_still_answer(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "old.db")
    h = Harness(tmp_path / "h", store=store)
    try:
        old = h.submit("true")  # then made to look like an older mgpu's
        job = h.job(old)
        job.id = "a1b2c3d4"
        store.save_jobs([job])
        h.crash()
        assert h.cl.get_job("a1b2c3d4") is not None
        assert h.submit("true") == "2"
    finally:
        h.close()


def launch_envs(h: Harness, agent: str) -> dict[str, dict[str, str]]:
    """The environment of each job the agent was told to launch (taken: told once)."""
    return {x.job_id: seen_env(x) for x in h.agents[agent].launches()}


def test_a_slurm_job_gets_slurms_environment_and_output_files(h: Harness) -> None:
    h.agent("node1", gpus=2)
    h.agent("node2", gpus=2)
    slurm = {"batch": True, "job_name_default": "train.sh", "output": "logs/%x-%j.out"}
    job_id = h.submit("true", nodes=2, gpus_per_node=1, slurm=slurm)
    h.tick()
    h.agents["node1"].port(job_id)  # rank 0's MASTER_PORT, then the launches
    launches = {a: [x for x in h.agents[a].launches() if x.job_id == job_id] for a in h.agents}
    first = launches["node1"][0]
    assert launches["node2"] == []  # a batch script runs on the first node; node2 holds
    assert not grants.OWNED.intersection(first.env)  # the agent's, from the grant
    env = seen_env(first)
    assert env["SLURM_JOB_ID"] == job_id and env["SLURM_JOB_NAME"] == "train.sh"
    assert env["SLURM_JOB_NODELIST"] == "host-node[1-2]"
    assert env["SLURM_NNODES"] == "2" and env["SLURM_NODEID"] == "0"
    assert env["SLURM_CLUSTER_NAME"] == "mgpu" and env["SLURM_JOB_PARTITION"] == "main"
    assert env["SLURM_GPUS_ON_NODE"] == "1" and env["MGPU_JOB_ID"] == job_id
    gpu = str(h.job(job_id).allocation[0].gpu_ids[0])
    assert env["SLURM_JOB_GPUS"] == env["CUDA_VISIBLE_DEVICES"] == env["MGPU_GPU_IDS"] == gpu
    assert "SLURM_STEP_GPUS" not in env
    # The batch script's files are written on the node that runs it.
    assert (first.output_file, first.error_file) == (f"logs/train.sh-{job_id}.out",) * 2


def test_plain_jobs_see_no_slurm_variable_and_slurm_jobs_no_gpu(h: Harness) -> None:
    h.agent("node1")
    plain = h.submit("true")
    cpu = h.submit("true", slurm={"batch": True})
    h.tick()
    envs = launch_envs(h, "node1")
    assert not [k for k in envs[plain] if k.startswith("SLURM_")]
    env = envs[cpu]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "SLURM_JOB_GPUS" not in env
    assert h.job(cpu).gpus == 0 and h.job(cpu).state == JobState.RUNNING


def test_partitions_restrict_placement(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(PARTITIONS)
    for node in ("node1", "node2", "node3"):
        h.agent(node, gpus=1)
    small = h.submit("true", gpus=1, slurm={"partition": "small"})
    bigs = [h.submit("true", gpus=1, slurm={}) for _ in range(3)]
    h.tick()
    assert [s.node_id for s in h.job(small).allocation] == ["node1"]
    placed = sorted(s.node_id for b in bigs for s in h.job(b).allocation)
    assert placed == ["node2", "node3"]  # the third waits for the default partition
    assert h.job(bigs[0]).time_limit == 3600.0
    env = launch_envs(h, "node1")[small]
    assert env["SLURM_JOB_PARTITION"] == "small" and env["SLURM_CLUSTER_NAME"] == "lab"


def submit_result(h: Harness, **fields: Any) -> Any:
    spec = JobSpec.model_validate({"command": "true", **fields})
    result = _run(h.cl.submit(spec, "alice"))
    h.settle()
    return result


def test_unknown_partition_warns_or_is_refused(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(PARTITIONS)
    h.agent("node2")
    result = submit_result(h, slurm={"partition": "gpu"})
    assert result.warnings == ["partition 'gpu' does not exist here; the job runs in 'big'"]
    strict = make_harness({**PARTITIONS, "refuse_unknown_partition": True})
    strict.agent("node2")
    with pytest.raises(SubmitError, match="invalid partition specified: gpu"):
        submit_result(strict, slurm={"partition": "gpu"})
    assert strict.submit("true", slurm={}) == "1"  # the refusal took no id
