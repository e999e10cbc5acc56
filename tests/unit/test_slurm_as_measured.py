"""What the differential tier (tests/slurmdiff) measured on a real Slurm 22.05, pinned in
pure code: sacct's lines of a multi-node batch job, `scontrol show job`'s fields, and the
rank order of a multi-node job's nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mgpu.scheduler.placement import name_order
from mgpu.slurm import fields, jobopts, sacct, sbatch, scontrol, srun

NOW = 1_700_000_000.0


def job(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "7",
        "name": "launcher",
        "user": "root",
        "state": "completed",
        "end_code": "completed",
        "exit_code": 0,
        "gpus": 4,
        "nodes": 2,
        "allocation": [{"node_id": "node001"}, {"node_id": "node002"}],
        "submit_time": NOW - 10,
        "start_time": NOW - 5,
        "end_time": NOW,
        "cwd": "/work/run",
        "script_name": "job.sh",
        "command": "job.sh a 'b c'",
        "slurm": {"batch": True, "submit_dir": "/work/run"},
    }
    base.update(over)
    return base


def test_sacct_batch_and_step_lines_as_slurms() -> None:
    """ID.batch ran on the first node as one task; a step's line leaves the job's own
    fields (User, WorkDir, Reason...) empty and has its NTasks."""
    cols = fields.parse_fields(
        "sacct", "JobID,NNodes,NodeList,User,WorkDir,Reason,DerivedExitCode,NTasks", sacct.KNOWN
    )
    done = job()
    done["steps"] = [
        {"number": 0, "name": "python3", "start": NOW - 4, "end": NOW - 3, "exit_code": 0,
         "state": "completed", "nodes": ["node001", "node002"], "ntasks": 2},
    ]  # fmt: skip
    rows = [r for r in (done, sacct.batch_step(done), *sacct.step_rows(done)) if r]
    assert fields.render_fields(cols, rows, False, "P") == [
        "7|2|node[001-002]|root|/work/run|None|0:0|",
        "7.batch|1|node001|||||1",
        "7.0|2|node[001-002]|||||2",
    ]


def test_scontrol_show_job_as_slurms() -> None:
    shown = scontrol.job_text(job())
    assert " BatchHost=node001\n" in shown  # not the whole compressed list
    assert "Command=/work/run/job.sh a b c\n" in shown
    wrapped = scontrol.job_text(job(script_name="wrap", command=""))
    assert "Command=(null)\n" in wrapped
    waiting = scontrol.job_text(
        job(state="queued", allocation=[], start_time=None, end_time=None,
            dependency=["afterok:6"], reason_code="dependency", end_code=None, exit_code=None)
    )  # fmt: skip
    assert "Dependency=afterok:6(unfulfilled)" in waiting
    assert "EligibleTime=Unknown" in waiting
    assert "NodeList=\n" in waiting and "BatchHost" not in waiting


def test_a_multi_node_jobs_nodes_rank_in_name_order() -> None:
    """The batch script runs on rank 0: the first node `scontrol show hostnames` lists."""
    names = ["node010", "node002", "gpu-b", "node001", "gpu-a"]
    assert sorted(names, key=name_order) == ["gpu-a", "gpu-b", "node001", "node002", "node010"]
    assert sorted(["n10", "n9"], key=name_order) == ["n9", "n10"]


def test_sacct_derived_exit_code_is_the_highest_steps() -> None:
    """Slurm's DerivedExitCode: its steps' highest code (an exit code over a signal), not
    the script's own; `0:0` with no step."""
    steps = [
        {"number": 0, "exit_code": 1, "state": "failed", "nodes": ["node001"]},
        {"number": 1, "exit_code": 5, "state": "failed", "nodes": ["node001"]},
        {"number": 2, "exit_code": -15, "state": "cancelled", "nodes": ["node001"]},
    ]
    assert sacct.derived_exit_code(job(exit_code=3, steps=steps)) == "5:0"
    assert sacct.derived_exit_code(job(exit_code=3, steps=steps[2:])) == "0:15"
    assert sacct.derived_exit_code(job(exit_code=3)) == "0:0"


def test_sacct_a_cancelled_jobs_line_says_0_0_its_batch_step_the_signal() -> None:
    cols = fields.parse_fields("sacct", "JobID,ExitCode", sacct.KNOWN)
    cancelled = job(state="cancelled", end_code="cancelled", exit_code=143)
    rows = [cancelled, sacct.batch_step(cancelled)]
    assert fields.render_fields(cols, rows, False, "P") == ["7|0:0", "7.batch|0:15"]


def test_sacct_a_job_a_user_cancelled_says_by_whom_as_slurms() -> None:
    """Slurm's `CANCELLED by UID` (the canceller's uid; `CANCELLED+` in a 10-wide column)
    on the job's own line; its batch step, and a job the cluster ended, say CANCELLED."""
    cols = fields.parse_fields("sacct", "JobID,State", sacct.KNOWN)
    cancelled = job(state="cancelled", end_code="cancelled", exit_code=143, cancelled_by="root")
    rows = [cancelled, sacct.batch_step(cancelled)]
    assert fields.render_fields(cols, rows, False, "P") == ["7|CANCELLED by 0", "7.batch|CANCELLED"]
    assert fields.render_fields(cols, rows[:1], False, None)[0].split() == ["7", "CANCELLED+"]
    unknown = job(state="cancelled", end_code="cancelled", cancelled_by="nosuchacct31")
    assert fields.render_fields(cols, [unknown], False, "P") == ["7|CANCELLED by nosuchacct31"]
    by_cluster = job(state="cancelled", end_code="dependency_never", cancelled_by=None)
    assert fields.render_fields(cols, [by_cluster], False, "P") == ["7|CANCELLED"]


def test_a_job_a_dependency_never_met_ended_shows_slurms_fields() -> None:
    """--kill-on-invalid-dep=yes: the job ends unplaced; Slurm keeps its reason, its
    dependency `(failed)`, no eligible time, no task count, and sacct's partition limit."""
    never = job(
        name="third",
        state="cancelled",
        end_code="dependency_never",
        exit_code=None,
        start_time=None,
        allocation=[],
        nodes=1,
        dependency=["afternotok:20"],
        slurm={"batch": True, "submit_dir": "/work/run", "kill_invalid_dep": True},
    )
    shown = dict(item.split("=", 1) for item in scontrol.job_text(never).split() if "=" in item)
    assert shown["Reason"] == "DependencyNeverSatisfied"
    assert shown["Dependency"] == "afternotok:20(failed)"
    assert shown["EligibleTime"] == "Unknown"
    assert shown["NumTasks"] == "N/A"
    assert shown["KillOInInvalidDependent"] == "Yes"
    cols = fields.parse_fields("sacct", "JobID,State,Timelimit,Reason,Start", sacct.KNOWN)
    assert fields.render_fields(cols, [never], False, "P") == [
        "7|CANCELLED|Partition_Limit|Dependency|None"
    ]
    # One that ran keeps its own fields; one still waiting its `Unknown` start.
    ran = dict(item.split("=", 1) for item in scontrol.job_text(job()).split() if "=" in item)
    assert (ran["NumTasks"], ran["Dependency"]) == ("2", "(null)")
    assert "KillOInInvalidDependent" not in ran
    waiting = job(state="queued", end_code=None, start_time=None, end_time=None, allocation=[])
    assert fields.render_fields(cols, [waiting], False, "P") == [
        "7|PENDING|Partition_Limit|None|Unknown"
    ]
    # One that waited on a dependency, then ran: Slurm's previous reason, Dependency.
    after = job(dependency=["afterok:6"])
    assert fields.render_fields(cols, [after, job()], False, "P")[0].split("|")[3] == "Dependency"
    assert fields.render_fields(cols, [job()], False, "P")[0].split("|")[3] == "None"
    limited = job(time_limit=3600.0)
    assert fields.render_fields(cols, [limited], False, "P")[0].split("|")[2] == "01:00:00"


def test_scontrol_output_files_expanded_and_absolute_and_a_failed_jobs_reason() -> None:
    block = {"batch": True, "submit_dir": "/work/run", "output": "out/%x-%j-%u-%N.out"}
    shown = scontrol.job_text(job(slurm={**block, "error": "/abs/%x.%4j.err"}))
    assert "StdOut=/work/run/out/launcher-7-root-%N.out\n" in shown  # %N is the node's
    assert "StdErr=/abs/launcher.0007.err\n" in shown
    plain = scontrol.job_text(job(slurm={"batch": True}))
    assert "StdOut=/work/run/slurm-7.out\n" in plain
    failed = scontrol.job_text(job(state="failed", end_code="failed", exit_code=3))
    assert "Reason=NonZeroExitCode " in failed
    assert "Reason=None " in scontrol.job_text(job())


def test_scontrol_command_is_the_path_sbatch_found(tmp_path: Path) -> None:
    """Slurm's sbatch looks a script's name up on PATH, then in the job's working
    directory; found nowhere (a -D elsewhere), or `./x`, it stays as given."""
    (tmp_path / "job.sh").write_text("#!/bin/sh\n")
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    assert sbatch.command_path("job.sh", str(tmp_path), "/usr/bin") == f"{tmp_path}/job.sh"
    assert sbatch.command_path("job.sh", str(elsewhere), "/usr/bin") == "job.sh"
    assert sbatch.command_path("./job.sh", str(tmp_path), "") == "./job.sh"
    shown = scontrol.job_text(job(slurm={"batch": True, "script_path": "job.sh"}))
    assert "Command=job.sh a b c\n" in shown


def test_srun_in_a_job_takes_its_task_count_as_slurms() -> None:
    """SLURM_NTASKS is srun's -n when none is given; a --ntasks-per-node that does not fit
    the tasks on the nodes is dropped (Slurm's warning)."""
    env = {"SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2"}
    assert srun.step_shape({"ntasks-per-node": "1"}, env) == (None, 4, None)
    assert srun.step_shape({"ntasks-per-node": "2"}, env) == (None, 4, 2)
    assert srun.step_shape({"ntasks": "2", "nodes": "1"}, env) == (1, 2, None)
    assert srun.step_shape({}, {"SLURM_JOB_NUM_NODES": "2"}) == (None, None, None)


def test_sbatch_gpus_asked_per_job_or_per_node_are_kept_for_slurms_variables() -> None:
    """SLURM_GPUS and SLURM_GPUS_PER_NODE (and scontrol's TresPerJob) as asked."""
    _, block, _ = jobopts.submit_fields("sbatch", {"gpus-per-node": "2", "nodes": "2"}, {}, "/")
    assert block["gpus_per_node"] == 2 and "gpus" not in block
    _, block, _ = jobopts.submit_fields("sbatch", {"gpus": "3"}, {}, "/")
    assert block["gpus"] == 3
    assert "TresPerJob=gres:gpu:3\n" in scontrol.job_text(job(slurm={"batch": True, **block}))
