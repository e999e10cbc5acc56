"""Slurm jobs on a real master and agent, submitted through the API with a `slurm` block (as
`sbatch` sends them): numeric ids, Slurm's variables, -o/-e files written on the node while
the job runs (`tail -f`), --open-mode, an output file that cannot be opened, a working
directory that cannot be entered, and a store written by an older mgpu."""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import LocalCluster, local_cluster, wait_for
from mgpu import Client
from mgpu.master.store.sqlite import SqliteStore
from mgpu.model import Job, JobState


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[LocalCluster]:
    """A master and one agent with 2 fake GPUs and 8 fake CPUs (a job of 4 tasks of 2 CPUs
    holds 8), two partitions configured."""
    config = (
        "cluster: {name: lab}\n"
        "partitions:\n"
        "  - {name: gpu, nodes: [node001], default: true, max_time: '1:00:00'}\n"
        "  - {name: other, nodes: [node009]}\n"
    )
    (tmp_path / "c").mkdir()
    c = LocalCluster(tmp_path / "c", config)
    try:
        c.start_master()
        c.start_agent("node001", gpus=2, extra=["--fake-cpus", "8"])
        yield c
    finally:
        c.stop()


def submit(c: LocalCluster, script: str, cwd: Path, **slurm: Any) -> str:
    options = {k: slurm.pop(k) for k in ("array", "gpus", "name") if k in slurm}
    block = {"batch": True, "job_name_default": "job.sh", "submit_dir": str(cwd), **slurm}
    job = c.client().submit_script(script, name="job.sh", cwd=str(cwd), slurm=block, **options)
    return job.id


def ended(c: LocalCluster, job_id: str) -> dict[str, Any]:
    return c.client().wait(job_id, timeout=60)


def test_a_slurm_job_sees_slurms_variables(one_node: LocalCluster, tmp_path: Path) -> None:
    script = "#!/bin/sh\nenv | grep -E '^(SLURM_|SLURMD_|CUDA_VISIBLE_DEVICES=)' | sort\n"
    job_id = submit(one_node, script, tmp_path, ntasks=4, cpus_per_task=2)
    assert job_id.isdigit()
    job = ended(one_node, job_id)
    assert job["state"] == "completed", job
    assert job["gpus"] == 0 and job["slurm"]["partition"] == "gpu"  # asked for no GPU
    env = dict(line.split("=", 1) for line in one_node.client().logs(job_id).splitlines())
    hostname = socket.gethostname()  # what the agent says
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == job_id
    assert int(env["SLURM_JOB_ID"]) > 0  # as Lightning reads it
    assert env["SLURM_JOB_NAME"] == "job.sh"  # the script's name without --job-name
    assert env["SLURM_JOB_NODELIST"] == env["SLURMD_NODENAME"] == hostname
    assert env["SLURM_NNODES"] == "1" and env["SLURM_NTASKS"] == "4"
    assert env["SLURM_TASKS_PER_NODE"] == "4" and env["SLURM_CPUS_PER_TASK"] == "2"
    assert env["SLURM_CPUS_ON_NODE"] == env["SLURM_JOB_CPUS_PER_NODE"] == "8"  # held
    assert env["SLURM_CLUSTER_NAME"] == "lab" and env["SLURM_JOB_PARTITION"] == "gpu"
    assert env["SLURM_JOB_UID"] == str(os.getuid())
    assert env["SLURM_SUBMIT_DIR"] == str(tmp_path)
    assert env["SLURM_TASK_PID"].isdigit() and env["SLURM_PROCID"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "SLURM_JOB_GPUS" not in env


def test_array_tasks_differ_by_task_id(one_node: LocalCluster, tmp_path: Path) -> None:
    script = "#!/bin/sh\necho $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_JOB_ID\n"
    array_id = submit(one_node, script, tmp_path, array="0-2", output="out/%x-%A_%a.out")
    (tmp_path / "out").mkdir()
    base = int(array_id)
    for index in range(3):
        assert ended(one_node, f"{array_id}_{index}")["state"] == "completed"
        written = (tmp_path / f"out/job.sh-{array_id}_{index}.out").read_text()
        assert written == f"{array_id} {index} {base + index}\n"


def test_output_file_is_written_on_the_node_while_the_job_runs(
    one_node: LocalCluster, tmp_path: Path
) -> None:
    flag = tmp_path / "go-on"
    script = (
        "#!/bin/sh\necho first line; echo to stderr >&2\n"
        f"while [ ! -e {flag} ]; do sleep 0.05; done\necho second line\n"
    )
    job_id = submit(one_node, script, tmp_path, output="logs-%j-%u.txt")
    user = one_node.client().show(job_id)["user"]
    out = tmp_path / f"logs-{job_id}-{user}.txt"
    # As `tail -f` sees it: the first lines are there while the job still runs.
    wait_for(
        lambda: out.exists() and "first line" in out.read_text(),
        timeout=30,
        what="the first line in the output file",
    )
    assert one_node.client().show(job_id)["state"] == "running"
    flag.touch()
    job = ended(one_node, job_id)
    assert job["state"] == "completed", job
    lines = out.read_text().splitlines()
    assert sorted(lines) == ["first line", "second line", "to stderr"]
    assert "second line" in one_node.client().logs(job_id)  # the master keeps it too


def test_a_cancelled_jobs_last_words_reach_its_file(one_node: LocalCluster, tmp_path: Path) -> None:
    """The copies outlive SIGTERM: what the job writes in its grace time is in the file."""
    script = (
        "#!/bin/sh\ntrap 'echo got TERM; exit 3' TERM\necho started\nwhile :; do sleep 0.05; done\n"
    )
    job_id = submit(one_node, script, tmp_path)
    out = tmp_path / f"slurm-{job_id}.out"
    wait_for(lambda: out.exists() and "started" in out.read_text(), timeout=30, what="started")
    one_node.client().cancel(job_id)
    assert ended(one_node, job_id)["state"] == "cancelled"
    wait_for(lambda: "got TERM" in out.read_text(), timeout=30, what="the last words")
    # One file for both streams: one stream, in the order written (dash says "Terminated"
    # of the script's sleep, killed with it, before the trap runs), as `mgpu logs` has it.
    text = out.read_text()
    assert text.startswith("started\n") and text.endswith("got TERM\n")
    assert one_node.client().logs(job_id) == text


def test_separate_error_file_and_open_modes(one_node: LocalCluster, tmp_path: Path) -> None:
    out, err = tmp_path / "o.txt", tmp_path / "e.txt"
    for path in (out, err):
        path.write_text("from before\n")
    script = "#!/bin/sh\necho out; echo err >&2\n"
    job_id = submit(one_node, script, tmp_path, output=str(out), error="e.txt", open_mode="append")
    assert ended(one_node, job_id)["state"] == "completed"
    assert out.read_text() == "from before\nout\n"
    assert err.read_text() == "from before\nerr\n"
    job_id = submit(one_node, script, tmp_path, output="o.txt", error=str(err))  # truncate
    assert ended(one_node, job_id)["state"] == "completed"
    assert (out.read_text(), err.read_text()) == ("out\n", "err\n")


def test_an_output_file_that_cannot_be_opened_fails_the_job(
    one_node: LocalCluster, tmp_path: Path
) -> None:
    job_id = submit(one_node, "#!/bin/sh\ntouch ran\n", tmp_path, output="no/such/dir/%j.out")
    job = ended(one_node, job_id)
    path = f"{tmp_path}/no/such/dir/{job_id}.out"
    assert job["state"] == "failed", job
    assert f"Could not open stdout file {path}: No such file or directory" in job["reason"]
    assert not (tmp_path / "ran").exists()  # the script never ran


def test_a_working_directory_it_cannot_enter_is_an_error_line_then_tmp(
    one_node: LocalCluster, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    out = tmp_path / "out.txt"
    job_id = submit(one_node, "#!/bin/sh\npwd\n", gone, output=str(out))
    job = ended(one_node, job_id)
    assert job["state"] == "completed", job
    assert out.read_text().splitlines() == [
        f"slurmstepd: error: couldn't chdir to `{gone}': No such file or directory: "
        "going to /tmp instead",
        "/tmp",
    ]


def test_partitions_are_listed_and_unknown_ones_warned(one_node: LocalCluster) -> None:
    parts = one_node.client()._request("GET", "/api/partitions")["partitions"]
    assert [(p["name"], p["default"], p["nodes"], p["max_time"]) for p in parts] == [
        ("gpu", True, ["node001"], "01:00:00"),
        ("other", False, ["node009"], "UNLIMITED"),
    ]
    job = one_node.client().submit("true", slurm={"partition": "nope"})
    assert job.warnings == ["partition 'nope' does not exist here; the job runs in 'gpu'"]
    assert ended(one_node, job.id)["slurm"]["partition"] == "gpu"


def test_a_store_of_an_older_mgpu_keeps_working(tmp_path: Path) -> None:
    state = tmp_path / "c" / "master"
    state.mkdir(parents=True)
    store = SqliteStore(state / "mgpu.db")
    old = Job(id="a1b2c3d4", user=getpass.getuser(), argv=["true"], command="true")
    old.state, old.exit_code, old.end_time = JobState.COMPLETED, 0, time.time() - 60
    store.save_jobs([old])
    store.close()
    with local_cluster(tmp_path / "c", agents=1, gpus=1) as c:
        assert c.client().show("a1b2c3d4")["state"] == "completed"
        new = c.client().submit("true", gpus=0, dependency="afterok:a1b2c3d4").id
        assert new == "1"
        assert ended(c, new)["state"] == "completed"
        res = c.cli("show", "a1b2c3d4")
        assert res.returncode == 0 and "a1b2c3d4" in res.stdout


OTHER = "daemon"  # an account every Debian system has: a root agent runs the job as it
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a root agent runs jobs as others")


@needs_root
def test_output_files_are_opened_as_the_jobs_user_never_by_the_agent(
    one_node: LocalCluster,
) -> None:
    """A root agent that opened the -o path itself could be pointed at any file by a
    symbolic link; the job's user opens it (and follows no final link: see
    test_output_planted.py), so a link to root's file fails the job."""
    top = Path(tempfile.mkdtemp(prefix="mgpu-slurm-", dir="/tmp"))
    try:
        top.chmod(0o755)
        work = top / "work"
        work.mkdir()
        pw = pwd.getpwnam(OTHER)
        os.chown(work, pw.pw_uid, pw.pw_gid)
        secret = top / "roots-file"
        secret.write_text("root's\n")
        (work / "evil.out").symlink_to(secret)
        admin = one_node.client()
        other = Client(one_node.address, token=admin.create_token(OTHER)["token"])
        block = {"batch": True, "submit_dir": str(work)}
        script = "#!/bin/sh\necho hello from $(id -un)\n"
        ok = other.submit_script(script, name="a.sh", cwd=str(work), slurm=block).id
        assert ended(one_node, ok)["state"] == "completed"
        written = work / f"slurm-{ok}.out"
        assert written.read_text() == f"hello from {OTHER}\n"
        assert written.stat().st_uid == pw.pw_uid  # created by the job's user
        evil = {**block, "output": "evil.out"}
        bad = other.submit_script(script, name="a.sh", cwd=str(work), slurm=evil).id
        job = ended(one_node, bad)
        assert job["state"] == "failed"
        assert f"Could not open stdout file {work}/evil.out: is a symbolic link" in job["reason"]
        assert secret.read_text() == "root's\n"
    finally:
        shutil.rmtree(top, ignore_errors=True)
