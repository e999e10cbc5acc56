"""What the differential tier (tests/slurmdiff) measured on a real Slurm 22.05, pinned in
pure code: sacct's lines of a multi-node batch job, `scontrol show job`'s fields, and the
rank order of a multi-node job's nodes."""

from __future__ import annotations

from typing import Any

from mgpu.scheduler.placement import name_order
from mgpu.slurm import fields, sacct, scontrol

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
