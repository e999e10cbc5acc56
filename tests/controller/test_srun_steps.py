"""Slurm's batch jobs and steps in the controller: a batch script runs on its first node
only, the others held; `srun` inside a job starts tasks on the job's nodes with Slurm's
per-task variables, within what the job holds; its exit code is its tasks' highest;
--kill-on-bad-exit stops the others; the job's end stops its steps."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness, seen_env

from mgpu.agent import grants
from mgpu.master.control.srun import SrunRequest, plan_tasks
from mgpu.master.control.submit import SubmitError
from mgpu.model import EndReason, JobState, SlotPhase
from mgpu.slurmenv import task_env


def _batch(h: Harness, **slurm: Any) -> str:
    """A batch job on n1 and n2 (2 GPUs each), started."""
    job_id = h.submit("sleep 100", nodes=2, gpus_per_node=2, slurm={"batch": True, **slurm})
    h.tick()
    if h.agents["n1"].port_requests():  # MASTER_PORT first, as for any multi-node job
        h.agents["n1"].port(job_id)
    h.agents["n1"].started(job_id)
    return job_id


def _srun(h: Harness, job_id: str, argv: list[str] | None = None, **fields: Any) -> Any:
    request = SrunRequest(argv=argv or ["hostname"], env=fields.pop("env", {}), **fields)
    group, warnings = h.cl.allocations.sruns.start(job_id, request)
    h.settle()
    return group, warnings


def test_a_batch_script_runs_on_the_first_node_only(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    (launch,) = n1.launches()
    assert launch.job_id == job_id
    assert n2.launches() == []  # its node waits for steps, its GPUs held
    job = h.job(job_id)
    assert [s.phase for s in job.allocation] == [SlotPhase.STARTED, SlotPhase.HELD]
    assert len(h.node("n2").busy) == 2
    n1.exited(job_id, 4)  # the script's end is the job's, with its code
    job = h.stored(job_id)
    assert (job.state, job.exit_code) == (JobState.FAILED, 4)
    assert h.node("n2").busy == {}


def test_srun_runs_one_task_per_node_with_slurms_variables(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    n1.launches()
    group, warnings = _srun(h, job_id, env={"FOO": "bar", "MGPU_JOB_ID": "nope"})
    assert warnings == [] and group.number == 0
    (first,), (second,) = n1.launches(), n2.launches()
    assert (first.job_id, second.job_id) == (f"{group.id}.0", f"{group.id}.1")
    gpus = [s.gpu_ids for s in h.job(job_id).allocation]
    assert (first.grant.gpus, second.grant.gpus) == (gpus[0], gpus[1])
    for task, launch in enumerate([first, second]):
        assert not grants.OWNED.intersection(launch.env)  # the grant says the GPUs
        env = seen_env(launch)
        assert env["FOO"] == "bar" and env["MGPU_JOB_ID"] == job_id
        assert env["SLURM_PROCID"] == env["SLURM_NODEID"] == str(task)
        assert env["SLURM_LOCALID"] == "0" and env["SLURM_NTASKS"] == "2"
        assert env["SLURM_STEP_ID"] == "0" and env["SLURM_STEP_NUM_NODES"] == "2"
        assert env["SLURM_STEP_NODELIST"] == "host-n[1-2]"
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus[task]))
        assert env["SLURM_STEP_GPUS"] == env["SLURM_JOB_GPUS"] == env["CUDA_VISIBLE_DEVICES"]
    again, _ = _srun(h, job_id)
    assert again.number == 1  # Slurm's step ids count from 0


def test_the_jobs_task_count_and_srun_options_lay_tasks_out(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _batch(h, ntasks_per_node=2, gpus_per_task=1)
    n1.launches()
    _srun(h, job_id)
    on1, on2 = n1.launches(), n2.launches()
    assert [m.env["SLURM_PROCID"] for m in on1 + on2] == ["0", "1", "2", "3"]
    assert [m.env["SLURM_LOCALID"] for m in on1 + on2] == ["0", "1", "0", "1"]
    gpus = h.job(job_id).allocation[0].gpu_ids
    assert [m.grant.gpus for m in on1] == [[gpus[0]], [gpus[1]]]  # each task its own GPU
    seen = [seen_env(m) for m in on1]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == [str(g) for g in gpus]
    assert [e["SLURM_STEP_GPUS"] for e in seen] == [str(g) for g in gpus]
    both = ",".join(map(str, gpus))  # the job's on the node, as before
    assert [(e["SLURM_JOB_GPUS"], e["MGPU_GPU_IDS"]) for e in seen] == [(both, both)] * 2
    _srun(h, job_id, nodelist=["host-n2"], ntasks=1)
    assert n1.launches() == [] and len(n2.launches()) == 1
    _, warnings = _srun(h, job_id, nodes=2, ntasks=1)
    assert warnings == ["can't run 1 processes on 2 nodes, setting nnodes to 1"]


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        ({"ntasks": 5}, "More processors requested than permitted"),
        ({"ntasks_per_node": 3}, "More processors requested than permitted"),
        ({"nodes": 3}, "Only allocated 2 nodes asked for 3"),
        ({"nodelist": ["n9"]}, "Requested node configuration is not available"),
        ({"ntasks": 2, "gpus_per_task": 2}, None),
        ({"ntasks": 4, "gpus_per_task": 2}, "Requested node configuration is not available"),
    ],
)
def test_a_step_gets_no_more_than_the_job_holds(
    h: Harness,
    fields: dict[str, Any],
    sentence: str | None,
) -> None:
    h.agent("n1"), h.agent("n2")
    job_id = _batch(h, ntasks=4)
    if sentence is None:
        _srun(h, job_id, **fields)
        return
    with pytest.raises(SubmitError) as e:
        _srun(h, job_id, **fields)
    prefix = "" if sentence.startswith("Only") else f"Unable to create step for job {job_id}: "
    assert str(e.value) == prefix + sentence
    assert h.cl.steps.groups == {}  # nothing half-started


def test_the_steps_code_is_its_highest_and_kill_on_bad_exit_stops_the_rest(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    n1.launches()
    group, _ = _srun(h, job_id)
    t0, t1 = group.tasks
    n2.exited(t1.id, 3, epoch=t1.epoch)
    assert n1.kills() == [] and not group.done  # without -K the others run on
    n1.exited(t0.id, 2, epoch=t0.epoch)
    assert group.done and group.exit_code == 3
    killing, _ = _srun(h, job_id, kill_on_bad_exit=True)
    k0, k1 = killing.tasks
    n2.exited(k1.id, 3, epoch=k1.epoch)
    (kill,) = n1.kills()
    assert kill.job_id == k0.id
    n1.exited(k0.id, 143, epoch=k0.epoch)
    # Slurm: the step is CANCELLED with the signal its tasks were killed by; srun exits 143
    assert killing.done and killing.exit_code == 143


def test_the_jobs_end_stops_its_steps(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    n1.launches()
    group, _ = _srun(h, job_id, ["sleep", "100"])
    h.cl.life.request_stop(h.job(job_id), EndReason.CANCELLED)
    h.settle()
    assert [k.job_id for k in n1.kills()] == [job_id]  # the script first (srun with it)
    n1.exited(job_id, 143)
    assert {k.job_id for k in n1.kills() + n2.kills()} == {t.id for t in group.tasks}
    assert group.done and group.error == "the job ended"
    assert h.cl.steps.groups == {} and h.cl.steps.by_id == {}
    assert h.stored(job_id).state == JobState.CANCELLED


def test_a_batch_jobs_steps_output_is_not_added_to_the_job_twice(h: Harness) -> None:
    h.agent("n1")
    n2 = h.agent("n2")
    job_id = _batch(h)
    group, _ = _srun(h, job_id)
    n2.output(group.tasks[1].id, "hello\n", epoch=group.tasks[1].epoch)
    assert [r["d"] for r in h.cl.outputs.read(group.tasks[1].id)] == ["hello\n"]
    assert h.cl.outputs.read(job_id) == []  # srun prints it into the script's own output


def test_plan_spreads_tasks_in_blocks() -> None:
    names = [["n1"], ["n2"], ["n3"]]
    gpus = [[0, 1], [0, 1], [0, 1]]
    plan = plan_tasks("7", names, gpus, None, None, SrunRequest(argv=["x"], env={}, ntasks=5))
    assert plan.ranks == [0, 0, 1, 1, 2] and plan.localids == [0, 1, 0, 1, 0]
    assert plan.gpu_ids == [[0, 1]] * 5  # no --gpus-per-task: the node's GPUs
    both = SrunRequest(argv=["x"], env={}, nodes=2, nodelist=["n3"])
    assert plan_tasks("7", names, gpus, None, None, both).ranks == [0, 2]  # -w, then up to -N


def test_task_env_formats_as_slurm() -> None:
    env = task_env(
        step_id=3,
        procid=5,
        localid=1,
        nodeid=2,
        ntasks=6,
        step_hosts=["node01", "node02", "node03"],
        node_tasks=[2, 2, 1],
        node_procids=[4, 5],
    )
    assert env["SLURM_STEP_NODELIST"] == "node[01-03]"
    # As srun's: the tasks on this node, and the step's nodes (the job has maybe more).
    assert (env["SLURM_GTIDS"], env["SLURM_NNODES"]) == ("4,5", "3")
    assert env["SLURM_STEP_TASKS_PER_NODE"] == env["SLURM_TASKS_PER_NODE"] == "2(x2),1"
    assert (env["SLURM_STEP_ID"], env["SLURM_PROCID"]) == ("3", "5")
    assert not grants.OWNED.intersection(env)  # its GPUs are its grant's


def test_an_allocations_steps_output_is_the_allocations_too(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = h.submit("bash", allocation=True, gpus=2)
    h.tick()
    group, _ = _srun(h, job_id, ntasks=2)
    assert [m.env["SLURM_PROCID"] for m in n1.launches()] == ["0", "1"]
    n1.output(group.tasks[1].id, "hello\n", epoch=group.tasks[1].epoch)
    assert [r["d"] for r in h.cl.outputs.read(job_id)] == ["hello\n"]  # srun is elsewhere
