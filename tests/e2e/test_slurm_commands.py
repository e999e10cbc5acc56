"""Slurm's commands against a real master: sbatch -> squeue -> scancel, sacct -P and
squeue --format parsed as Slurm's, sbatch --wait's exit code, a script on stdin, --wrap,
and the bin dir every job finds first on its PATH, run by another account."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import BIN, LocalCluster, local_cluster, wait_for
from mgpu import Client
from mgpu.agent import loginbin, slurmbin


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    before = {n for n in slurmbin.SLURM_COMMANDS if (loginbin.LOGIN_BIN / n).exists()}
    # These agents write the login-shell wrappers where a login shell looks (the suite's
    # other agents write none: tests/conftest.py).
    with contextlib.ExitStack() as stack:
        os.environ[loginbin.LOGIN_BIN_VAR] = str(loginbin.LOGIN_BIN)
        try:  # the cluster's processes take the environment as they start
            c = stack.enter_context(local_cluster(tmp_path_factory.mktemp("slurm"), 2, 2))
        finally:
            os.environ[loginbin.LOGIN_BIN_VAR] = ""
        yield c
    for name in set(slurmbin.SLURM_COMMANDS) - before:  # the agents' login wrappers: the
        if loginbin.is_ours(loginbin.LOGIN_BIN / name):  # test machine left as it was
            (loginbin.LOGIN_BIN / name).unlink()


def run(
    c: LocalCluster, *argv: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`mgpu COMMAND ...` (the same code as the bin dir's COMMAND)."""
    return subprocess.run(
        [str(BIN / "mgpu"), *argv],
        capture_output=True,
        text=True,
        input=input,
        env={**c.env, **(env or {})},
        timeout=120,
    )


def sbatch(c: LocalCluster, *argv: str, input: str | None = None) -> str:
    res = run(c, "sbatch", "--parsable", *argv, input=input)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def squeue(c: LocalCluster, *argv: str) -> list[list[str]]:
    res = run(c, "squeue", "-h", *argv)
    assert res.returncode == 0, res.stderr
    return [line.split("|") for line in res.stdout.splitlines()]


def sacct(c: LocalCluster, *argv: str) -> list[dict[str, str]]:
    res = run(c, "sacct", "-P", *argv)
    assert res.returncode == 0, res.stderr
    header, *rows = res.stdout.splitlines()
    return [dict(zip(header.split("|"), row.split("|"), strict=True)) for row in rows]


def test_squeue_and_sacct_parsed_as_slurms(slurm_cluster: LocalCluster) -> None:
    c = slurm_cluster
    running = c.client().submit("sleep 60", gpus=1, name="runner")
    queued = c.client().submit("true", gpus=1, name="held", hold=True)
    try:
        rows = squeue(c, "-o", "%i|%j|%u|%t|%T|%D|%b|%R", "-j", f"{running.id},{queued.id}")
        by_id = {r[0]: r for r in rows}
        assert by_id[queued.id][1:] == [
            "held",
            "root",
            "PD",
            "PENDING",
            "1",
            "gres:gpu:1",
            "(JobHeldUser)",
        ]
        assert by_id[running.id][4] in ("PENDING", "RUNNING")
        default = run(c, "squeue", "-u", "root")
        assert default.stdout.splitlines()[0].split() == [
            "JOBID",
            "PARTITION",
            "NAME",
            "USER",
            "ST",
            "TIME",
            "NODES",
            "NODELIST(REASON)",
        ]
        assert run(c, "scancel", running.id, queued.id).returncode == 0
        for job_id in (running.id, queued.id):
            c.client().wait(job_id, timeout=30)
        got = {
            r["JobID"]: r
            for r in sacct(
                c, "-j", f"{running.id},{queued.id}", "--format=JobID,JobName,State,ExitCode"
            )
        }
        assert got[queued.id] == {
            "JobID": queued.id,
            "JobName": "held",
            "State": "CANCELLED by 0",  # Slurm's: the canceller's uid (root's)
            "ExitCode": "0:0",
        }
        assert got[running.id]["State"] == "CANCELLED by 0"
        assert squeue(c, "-j", running.id) == []  # ended: no longer listed
        assert squeue(c, "-t", "CA", "-j", queued.id, "-o", "%i|%T") == [[queued.id, "CANCELLED"]]
    finally:
        for job_id in (running.id, queued.id):
            c.client().cancel(job_id)


def test_bad_input_is_one_sentence(slurm_cluster: LocalCluster) -> None:
    c = slurm_cluster
    res = run(c, "squeue", "-h", "-o", "%i %!")  # Slurm says it and goes on
    assert (res.returncode, res.stderr) == (
        0,
        "squeue: error: Invalid job format specification: !\n",
    )
    res = run(c, "squeue", "-j", "999999")
    assert (res.returncode, res.stderr) == (1, "slurm_load_jobs error: Invalid job id specified\n")
    res = run(c, "sacct", "--format=JobID,Bogus")
    assert res.stderr == 'sacct: error: Invalid field requested: "Bogus"\n'
    res = run(c, "sbatch", "--bogus", "x.sh")
    assert (res.returncode, res.stderr) == (1, "sbatch: unrecognized option '--bogus'\n")
    res = run(c, "scancel", "--signal=USR1", "1")
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    res = run(c, "scontrol", "update", "JobId=999999", "TimeLimit=5")
    assert res.returncode == 1 and "Invalid job id specified" in res.stderr


def test_sinfo_and_scontrol(slurm_cluster: LocalCluster) -> None:
    c = slurm_cluster
    res = run(c, "sinfo", "-h", "-o", "%P|%D|%t|%N")
    assert res.stdout.splitlines() == ["main*|2|idle|node[001-002]"]
    res = run(c, "sinfo", "-N", "-h")
    assert [line.split() for line in res.stdout.splitlines()] == [
        ["node001", "1", "main*", "idle"],
        ["node002", "1", "main*", "idle"],
    ]
    res = run(c, "scontrol", "show", "node", "node002")
    assert res.stdout.startswith("NodeName=node002 ") and "State=IDLE" in res.stdout
    res = run(c, "scontrol", "show", "hostnames", "node[001-002]")
    assert res.stdout == "node001\nnode002\n"


def test_sbatch_squeue_scancel_sacct(slurm_cluster: LocalCluster, tmp_path: Path) -> None:
    c = slurm_cluster
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=napper\n#SBATCH --time=10\nsleep 120\n")
    job_id = sbatch(c, str(script))
    rows = squeue(c, "-j", job_id, "-o", "%i|%j|%l|%D")
    assert rows == [[job_id, "napper", "10:00", "1"]]
    assert run(c, "scancel", job_id).returncode == 0
    c.client().wait(job_id, timeout=30)
    assert [(r["JobID"], r["State"]) for r in sacct(c, "-j", job_id, "-X")] == [
        (job_id, "CANCELLED by 0")
    ]


def test_sbatch_wait_exits_with_the_jobs_code(slurm_cluster: LocalCluster) -> None:
    res = run(slurm_cluster, "sbatch", "--wait", "--wrap", "exit 3")
    assert res.returncode == 3, res.stderr
    assert res.stdout.startswith("Submitted batch job ")


def test_sbatch_from_stdin_and_wrap(slurm_cluster: LocalCluster) -> None:
    c = slurm_cluster
    job_id = sbatch(c, input="#!/bin/sh\n#SBATCH -J from-stdin\necho stdin-ran\n")
    job = c.client().wait(job_id, timeout=60)
    assert (job["state"], job["name"]) == ("completed", "from-stdin")
    job_id = sbatch(c, "--wrap", "echo wrapped-$((1+1))")
    assert c.client().wait(job_id, timeout=60)["state"] == "completed"
    assert "wrapped-2" in c.client().logs(job_id)


@pytest.mark.parametrize("address", ["your-email", "<YourNetID>@princeton.edu"])
def test_a_placeholder_mail_address_still_queues_the_job(
    slurm_cluster: LocalCluster, tmp_path: Path, address: str
) -> None:
    """A shared template's `--mail-user` placeholder: Slurm queues the job, so do we (one
    warning); mail never refuses a job."""
    c = slurm_cluster
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/sh\n#SBATCH --mail-user={address}\n#SBATCH --mail-type=END\necho mailed-ran\n"
    )
    res = run(c, "sbatch", "--parsable", str(script))
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("sbatch: warning: --mail-user/--mail-type ignored: ")
    job_id = res.stdout.strip()
    assert c.client().wait(job_id, timeout=60)["state"] == "completed"
    assert "mailed-ran" in c.client().logs(job_id)


def test_srun_finds_a_program_in_the_working_directory(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    """`srun launch.sh` with launch.sh only in the submit directory, not on PATH: Slurm's
    srun looks in the working directory after PATH."""
    c = slurm_cluster
    launcher = tmp_path / "launch-here.sh"
    launcher.write_text('#!/bin/sh\necho "launched task=$SLURM_PROCID"\n')
    launcher.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun -n1 launch-here.sh\necho rc=$?\n")
    job_id = sbatch(c, f"--chdir={tmp_path}", str(script))
    assert c.client().wait(job_id, timeout=90)["state"] == "completed"
    assert c.client().logs(job_id).splitlines()[-2:] == ["launched task=0", "rc=0"]


# ---- the bin dir, for every account ---------------------------------------------------


def _as_nobody(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_the_bin_dir_works_for_another_account(slurm_cluster: LocalCluster) -> None:
    """Built by root where mgpu's own Python may be private (here: under /root), the
    commands run for `nobody` with a Python it may run."""
    root = Path(tempfile.mkdtemp(prefix="mgpu-slurmbin-"))
    try:
        root.chmod(0o755)
        bin_dir = slurmbin.ensure(root / "bins")
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "MGPU_MASTER": slurm_cluster.address,
            "MGPU_TOKEN": slurm_cluster.admin_token,
        }
        res = _as_nobody(["squeue", "-h", "-o", "%i"], env)
        assert res.returncode == 0, res.stderr
        res = _as_nobody(["scontrol", "show", "hostnames", "gpu[1-2]"], env)
        assert (res.returncode, res.stdout) == (0, "gpu1\ngpu2\n"), res.stderr
        res = _as_nobody(["sinfo", "-h", "-o", "%D"], env)
        assert res.stdout == "2\n", res.stderr
        for path in [bin_dir, *bin_dir.parent.rglob("*")]:
            st = path.stat()
            assert st.st_uid == 0 and not st.st_mode & 0o022, path
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_jobs_find_the_commands_first_on_their_path(slurm_cluster: LocalCluster, user: str) -> None:
    """In a job of any account (nobody cannot read mgpu's venv under /root)."""
    c = slurm_cluster
    if user != "root" and os.geteuid() != 0:
        pytest.skip("jobs of another account need a root agent")
    token = c.admin_token if user == "root" else c.client().create_token(user)["token"]
    client = Client(c.address, token=token)
    job = client.submit(
        'echo "bin=$MGPU_SLURM_BIN"; command -v squeue; id -un; '
        'squeue -h -o "%i %T %u" -j $MGPU_JOB_ID',
        gpus=0,
        cwd="/",
    )
    done = client.wait(job.id, timeout=60)
    out = client.logs(job.id).splitlines()
    assert done["state"] == "completed", out
    bin_dir = out[0].removeprefix("bin=")
    assert bin_dir and out[1:4] == [f"{bin_dir}/squeue", user, f"{job.id} RUNNING {user}"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the wrappers are a root agent's")
@pytest.mark.skipif(loginbin.real_slurm() is None, reason="this machine has no Slurm of its own")
def test_a_machines_own_slurm_is_not_shadowed(slurm_cluster: LocalCluster) -> None:
    """A machine with its own Slurm (scripts/install-system-deps.sh installs one for the
    differential tier): the agents, which would write login wrappers, write none, and a
    login shell in a job finds the machine's commands; the job's own PATH still has
    mgpu's first."""
    c = slurm_cluster
    job = c.client().submit(
        'echo "$MGPU_SLURM_BIN"; command -v srun; bash -lc "command -v srun sbatch"',
        gpus=0,
        cwd="/",
    )
    assert c.client().wait(job.id, timeout=60)["state"] == "completed"
    bin_dir, first, *login = c.client().logs(job.id).splitlines()[-4:]
    assert first == f"{bin_dir}/srun"  # the job's PATH: mgpu's commands first
    real = loginbin.real_slurm()
    assert real is not None and not loginbin.is_ours(Path(real))
    # A login shell resets PATH: the machine's own Slurm, not a wrapper of mgpu's.
    assert len(login) == 2 and not any(loginbin.is_ours(Path(p)) for p in login), login
    for name in slurmbin.SLURM_COMMANDS:
        assert not loginbin.is_ours(loginbin.LOGIN_BIN / name)


def test_srun_outside_a_job_and_salloc(slurm_cluster: LocalCluster) -> None:
    """Outside any job srun is `mgpu srun` (a new job, no GPU unless asked: Slurm's default),
    and salloc `mgpu alloc`."""
    c = slurm_cluster
    env = {"MGPU_JOB_ID": "", "SLURM_JOB_ID": ""}
    for argv, last in (
        (["srun", "-J", "hello", "sh", "-c", "echo gpus=$MGPU_GPU_IDS."], "gpus=."),
        (["srun", "--gres=gpu:2", "sh", "-c", "echo gpus=$MGPU_GPU_IDS."], "gpus=0,1."),
        (["salloc", "-N", "2", "sh", "-c", "echo nodes=$MGPU_NNODES"], "nodes=2"),
    ):
        res = subprocess.run(
            [sys.executable, "-m", "mgpu.slurm", *argv],
            capture_output=True,
            text=True,
            env={**c.env, **env},
            timeout=120,
        )
        assert (res.returncode, res.stdout.splitlines()[-1]) == (0, last), res.stderr


def test_scontrol_hold_release_update(slurm_cluster: LocalCluster) -> None:
    c = slurm_cluster
    job = c.client().submit("true", gpus=0, hold=True, name="before")
    try:
        assert (
            run(
                c, "scontrol", "update", f"JobId={job.id}", "JobName=after", "TimeLimit=1:00:00"
            ).returncode
            == 0
        )
        shown = run(c, "scontrol", "show", "job", job.id).stdout
        assert f"JobId={job.id} JobName=after\n" in shown
        assert "JobState=PENDING Reason=JobHeldUser" in shown and "TimeLimit=01:00:00" in shown
        assert run(c, "scontrol", "release", job.id).returncode == 0
        assert c.client().wait(job.id, timeout=60)["state"] == "completed"
        res = run(c, "scontrol", "update", f"JobId={job.id}", "Nice=5")
        assert (res.returncode, res.stderr) == (
            1,
            "Update of this parameter is not supported: Nice=5\n",
        )
    finally:
        c.client().cancel(job.id)


def _salloc(c: LocalCluster, options: list[str], script: str) -> subprocess.CompletedProcess[str]:
    """`salloc OPTIONS bash -c SCRIPT` from outside any job, the bin dir on PATH."""
    return subprocess.run(
        [sys.executable, "-m", "mgpu.slurm", "salloc", *options, "bash", "-c", script],
        capture_output=True,
        text=True,
        env={**c.env, "MGPU_JOB_ID": "", "PATH": f"{BIN}:{c.env.get('PATH', '/usr/bin:/bin')}"},
        timeout=120,
    )


def test_srun_inside_salloc_runs_a_step_of_tasks(slurm_cluster: LocalCluster) -> None:
    """The bin dir's srun inside an allocation: tasks over its nodes ."""
    c = slurm_cluster
    script = (
        'export PATH="$(mgpu slurm-bin):$PATH"; '
        'srun -N2 -n4 -l sh -c "echo task=\\$SLURM_PROCID"; echo rc=$?; '
        'srun -n1 sh -c "exit 5"; echo rc=$?'
    )
    res = _salloc(c, ["-N", "2"], script)
    lines = res.stdout.splitlines()
    assert sorted(lines[:4]) == [f"{i}: task={i}" for i in range(4)], res.stderr
    assert lines[4:] == ["rc=0", "rc=5"], res.stderr


def test_srun_inside_salloc_takes_the_allocations_task_count(slurm_cluster: LocalCluster) -> None:
    """`salloc -n4 ...`: its steps run 4 tasks unless srun says otherwise, as sbatch's."""
    c = slurm_cluster
    script = (
        'export PATH="$(mgpu slurm-bin):$PATH"; srun -l sh -c "echo n=\\$SLURM_NTASKS"; echo rc=$?'
    )
    res = _salloc(c, ["-N2", "-n4"], script)
    lines = res.stdout.splitlines()
    assert sorted(lines[:4]) == [f"{i}: n=4" for i in range(4)], res.stderr
    assert lines[4:] == ["rc=0"], res.stderr


def _said(c: LocalCluster, job_id: str, text: str) -> bool:
    return text in c.client().logs(job_id)


def test_scancel_signal_reaches_a_trapping_script(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    """`scancel -b -s USR1` signals a batch script's shell (Slurm's -b); without -b or -f a
    batch job's script is spared, as in Slurm; `mgpu cancel --signal` signals mgpu's own
    jobs whole; a pending job is refused in Slurm's words."""
    c = slurm_cluster
    trap = "trap 'echo got-usr1; exit 7' USR1\necho ready\nsleep 100 & wait\necho woke\n"
    job_id = sbatch(c, "-o", str(tmp_path / "%j.out"), input=f"#!/bin/bash\n{trap}")
    held = sbatch(c, "-H", "--wrap", "true")
    try:
        wait_for(lambda: _said(c, job_id, "ready"), timeout=60, what="the trap set")
        assert run(c, "scancel", "-s", "USR1", job_id).returncode == 0  # no step: spared
        assert run(c, "scancel", "--batch", "--signal=SIGUSR1", job_id).returncode == 0
        job = c.client().wait(job_id, timeout=60)
        assert (job["state"], job["exit_code"]) == ("failed", 7)
        assert c.client().logs(job_id).split() == ["ready", "got-usr1"]
        # -f: the script and its children; mgpu's -o/-e copies are spared, the file whole
        full = sbatch(c, "-o", str(tmp_path / "%j.out"), input=f"#!/bin/bash\n{trap}")
        wait_for(lambda: _said(c, full, "ready"), timeout=60, what="the trap set")
        assert run(c, "scancel", "-f", "-s", "USR1", full).returncode == 0
        assert c.client().wait(full, timeout=60)["exit_code"] == 7
        for done in (job_id, full):
            assert (tmp_path / f"{done}.out").read_text().split() == ["ready", "got-usr1"]
        res = run(c, "scancel", "-s", "USR1", held)
        assert (res.returncode, res.stderr) == (
            1,
            f"scancel: error: Kill job error on job id {held}: Job is pending execution\n",
        )
        res = run(c, "scancel", "-s", "NOPE", held)
        assert (res.returncode, res.stderr) == (1, "scancel: error: Invalid job signal: NOPE\n")
        own = c.client().submit(["bash", "-c", trap], gpus=0)
        wait_for(lambda: _said(c, own.id, "ready"), timeout=60, what="the trap set")
        res = run(c, "cancel", "--signal", "USR1", own.id)
        assert res.returncode == 0, res.stderr
        assert c.client().wait(own.id, timeout=60)["exit_code"] == 7
    finally:
        for j in (job_id, held):
            c.client().cancel(j)


def test_an_array_task_answers_to_its_own_number(slurm_cluster: LocalCluster) -> None:
    """Task 1 of array A is also job A+1 (its SLURM_JOB_ID), in every command."""
    c = slurm_cluster
    array_id = sbatch(c, "-a", "0-1", "-o", "/dev/null", "--wrap", "sleep 100")
    number = str(int(array_id) + 1)
    try:
        wait_for(
            lambda: c.client().show(f"{array_id}_1")["state"] == "running", timeout=60, what="run"
        )
        assert c.client().wait(number, timeout=0.1)["id"] == f"{array_id}_1"
        shown = run(c, "scontrol", "show", "job", number).stdout
        assert f"JobId={number} ArrayJobId={array_id} ArrayTaskId=1 " in shown
        assert squeue(c, "-j", number, "-o", "%i|%T") == [[f"{array_id}_1", "RUNNING"]]
        assert run(c, "scancel", number).returncode == 0
        began = time.monotonic()
        assert c.client().wait(number, timeout=60)["state"] == "cancelled"
        assert time.monotonic() - began < 20  # woken by the task's end, not the 30 s poll
        rows = sacct(c, "-j", number, "-X", "--format=JobID,JobIDRaw,State")
        assert [(r["JobID"], r["JobIDRaw"], r["State"]) for r in rows] == [
            (f"{array_id}_1", number, "CANCELLED by 0")
        ]
        assert c.client().show(f"{array_id}_0")["state"] == "running"  # the other task
    finally:
        c.client().cancel(array_id)


def test_a_dependency_chain_submitted_from_inside_a_job(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A batch script that queues its successor with `sbatch -d afterok:$SLURM_JOB_ID`, as
    chained training runs do: the successor is a job of the same user, waits for the
    first to end well, then runs; both write their -o files where they were asked to."""
    c = slurm_cluster
    script = tmp_path / "stage1.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -J stage1 -o %x-%j.out\n"
        "set -e\n"
        'next=$(sbatch --parsable -J stage2 -o "%x-%j.out" -d "afterok:$SLURM_JOB_ID" '
        '--wrap "echo stage2 after $SLURM_JOB_ID")\n'
        'echo "queued $next"\n'
    )
    first = sbatch(c, "-D", str(tmp_path), str(script))
    assert c.client().wait(first, timeout=60)["state"] == "completed"
    out = (tmp_path / f"stage1-{first}.out").read_text()
    second = out.split("queued ", 1)[1].split()[0]
    assert int(second) > int(first)  # numeric ids that grow
    assert c.client().wait(second, timeout=60)["state"] == "completed"
    later = c.client().show(second)
    assert later["user"] == c.client().show(first)["user"]
    assert (tmp_path / f"stage2-{second}.out").read_text() == f"stage2 after {first}\n"


def test_sbatch_begin_waits_as_begintime_and_now_runs(slurm_cluster: LocalCluster) -> None:
    """`--begin` is honoured, not ignored (a job re-submitting itself with
    `--begin=now+24hour` used to run at once, looping)."""
    c = slurm_cluster
    later = sbatch(c, "--begin=now+1hour", "--gres=gpu:0", "--wrap", "true")
    try:
        at_once = sbatch(c, "--begin=now", "--gres=gpu:0", "--wrap", "true")
        assert c.client().wait(at_once, timeout=60)["state"] == "completed"
        # The other job was submitted first and needs nothing: only its begin holds it.
        assert squeue(c, "-j", later, "-o", "%i|%T|%r") == [[later, "PENDING", "BeginTime"]]
        shown = run(c, "scontrol", "show", "job", later).stdout
        begin = c.client().show(later)["begin_time"]
        assert f"EligibleTime={time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(begin))}" in (
            shown
        )
        res = run(c, "sbatch", "--begin=sometime", "--wrap", "true")
        assert res.returncode == 1 and "Invalid time specification" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    finally:
        c.client().cancel(later)


def test_scontrol_update_starttime_moves_a_pending_jobs_begin(slurm_cluster: LocalCluster) -> None:
    """`scontrol update JobId=N StartTime=...` (issue 31, item 3): a job held back by its
    begin time runs once it is moved to now; a job moved later waits as BeginTime; a running
    job's start time cannot change; a time Slurm cannot read is refused."""
    c = slurm_cluster
    later = sbatch(c, "--begin=now+1hour", "--gres=gpu:0", "--wrap", "true")
    waiting = sbatch(c, "--gres=gpu:0", "--hold", "--wrap", "true")
    try:
        res = run(c, "scontrol", "update", f"JobId={waiting}", "StartTime=now+2hours")
        assert res.returncode == 0, res.stderr
        c.client().release(waiting)
        assert squeue(c, "-j", waiting, "-o", "%i|%T|%r") == [[waiting, "PENDING", "BeginTime"]]
        res = run(c, "scontrol", "update", f"JobId={later}", "StartTime=now")
        assert res.returncode == 0, res.stderr
        assert c.client().wait(later, timeout=60)["state"] == "completed"
        res = run(c, "scontrol", "update", f"JobId={waiting}", "StartTime=someday")
        assert res.returncode == 1 and "Invalid time specification" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    finally:
        for job_id in (later, waiting):
            c.client().cancel(job_id)


def test_a_running_jobs_start_time_cannot_change(slurm_cluster: LocalCluster) -> None:
    c = slurm_cluster
    gate = c.root / "starttime-gate"
    job_id = sbatch(c, "--gres=gpu:0", "--wrap", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    try:
        wait_for(lambda: c.client().show(job_id)["state"] == "running", what="the job running")
        res = run(c, "scontrol", "update", f"JobId={job_id}", "StartTime=now+1hour")
        assert res.returncode == 1 and "only while it is queued" in res.stderr, res.stderr
    finally:
        gate.touch()
        c.client().cancel(job_id)


def test_a_job_a_dependency_never_met_ended_reads_as_slurms(slurm_cluster: LocalCluster) -> None:
    """`-d afternotok:OK --kill-on-invalid-dep=yes`: once OK ends well the job can never
    run and is ended; scontrol and sacct say so in Slurm's fields."""
    c = slurm_cluster
    ok = sbatch(c, "--gres=gpu:0", "-o", "/dev/null", "--wrap", "true")
    never = sbatch(
        c, "--gres=gpu:0", "-o", "/dev/null", "-d", f"afternotok:{ok}",
        "--kill-on-invalid-dep=yes", "--wrap", "echo never",
    )  # fmt: skip
    assert c.client().wait(ok, timeout=60)["state"] == "completed"
    assert c.client().wait(never, timeout=60)["state"] == "cancelled"
    res = run(c, "scontrol", "show", "job", never)
    assert res.returncode == 0, res.stderr
    shown = dict(item.split("=", 1) for item in res.stdout.split() if "=" in item)
    assert shown["Reason"] == "DependencyNeverSatisfied"
    assert shown["Dependency"] == f"afternotok:{ok}(failed)"
    assert (shown["EligibleTime"], shown["NumTasks"]) == ("Unknown", "N/A")
    assert shown["KillOInInvalidDependent"] == "Yes"
    rows = sacct(c, "-X", "-j", never, "--format=State,Timelimit,Reason,Start")
    assert rows == [
        {"State": "CANCELLED", "Timelimit": "Partition_Limit", "Reason": "Dependency",
         "Start": "None"}
    ]  # fmt: skip


def test_export_none_runs_the_script_in_the_accounts_login_environment(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    """`--export=NONE`: none of the submitting shell's variables, but the account's login
    environment (USER, LOGNAME...), as Slurm's --get-user-env; `ALL` (the default) sends
    the shell's own."""
    c = slurm_cluster
    line = 'echo "user=$USER logname=$LOGNAME get=${SLURM_GET_USER_ENV-} mark=${MARK31-unset}"'
    seen = {}
    for export in ("NONE", "ALL"):
        out = tmp_path / f"{export}.out"
        res = run(
            c, "sbatch", "--parsable", f"--export={export}", "--gres=gpu:0", "-o", str(out),
            "--wrap", line, env={"MARK31": "from-shell", "USER": "someone", "LOGNAME": "x"},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert c.client().wait(res.stdout.strip(), timeout=60)["state"] == "completed"
        seen[export] = out.read_text()
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert seen["NONE"] == f"user={user} logname={user} get=1 mark=unset\n"
    assert seen["ALL"] == "user=someone logname=x get= mark=from-shell\n"
