"""`mgpu submit FILE`: a job script sent with its job (so it runs where the submit directory
is not shared), its `#!` interpreter and arguments, its `#MGPU` / `#SBATCH` directives and
where `mgpu show` says each option came from, and the cases that stay commands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, wait_for
from mgpu import Client


def mgpu(c: LocalCluster, cwd: Path, *args: str, token: str | None = None) -> Any:
    env = dict(c.env)
    if token is not None:
        env["MGPU_TOKEN"] = token
    return subprocess.run(
        [str(BIN / "mgpu"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def ended(c: LocalCluster, job_id: str) -> dict[str, Any]:
    return c.client().wait(job_id, timeout=30)


def test_the_script_travels_with_the_job(cluster: LocalCluster, tmp_path: Path) -> None:
    work = tmp_path / "submit-dir"
    work.mkdir()
    (work / "job.sh").write_text(
        '#!/bin/sh\necho "args: $# [$1] [$2]"; echo "name: $(basename "$0")"; pwd\n'
    )
    res = mgpu(cluster, work, "submit", "--hold", "--gpus", "0", "job.sh", "a", "b c")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    shutil.rmtree(work)  # as on a node that does not share the submit directory
    cluster.cli("release", job_id, check=True)
    job = ended(cluster, job_id)
    assert (job["state"], job["command"], job["script_name"]) == (
        "completed",
        "job.sh a 'b c'",
        "job.sh",
    )
    out = cluster.client().logs(job_id).splitlines()
    assert out[:2] == ["args: 2 [a] [b c]", "name: job.sh"]
    assert out[2] != str(work)  # the directory is gone: it ran in its user's home


def test_the_interpreter_is_the_scripts_own(cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("#!/usr/bin/env python3\nimport sys\nprint(sys.argv[1:])\n")
    (tmp_path / "plain").write_text("echo $0 runs under $(readlink /proc/$$/exe)\n")
    py = mgpu(cluster, tmp_path, "submit", "--gpus", "0", "train.py", "--lr", "0.1")
    sh = mgpu(cluster, tmp_path, "submit", "--gpus", "0", "plain")
    for res in (py, sh):
        assert res.returncode == 0, res.stderr
        assert ended(cluster, res.stdout.strip())["state"] == "completed"
    assert cluster.client().logs(py.stdout.strip()) == "['--lr', '0.1']\n"
    line = cluster.client().logs(sh.stdout.strip())
    assert line.endswith("/plain runs under " + str(Path("/bin/sh").resolve()) + "\n"), line


def test_commands_stay_commands(cluster: LocalCluster, tmp_path: Path) -> None:
    """A command string, a first word that names no file, and a program (not text) in the
    submit directory all run with /bin/sh -c, as before."""
    shutil.copy("/bin/echo", tmp_path / "myecho")
    for args, output in (
        (["echo from a string"], "from a string\n"),
        (["echo", "two", "words"], "two words\n"),
        (["./myecho", "binary"], "binary\n"),
    ):
        res = mgpu(cluster, tmp_path, "submit", "--gpus", "0", *args)
        assert res.returncode == 0, res.stderr
        job_id = res.stdout.strip()
        job = ended(cluster, job_id)
        assert job["state"] == "completed" and job["script_name"] is None
        assert cluster.client().logs(job_id) == output


def test_directives_and_where_each_option_came_from(cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n"
        "#MGPU --gpus 2 --priority 4\n"
        'echo "gpus $CUDA_VISIBLE_DEVICES"\n'
        "#MGPU --priority 9\n"  # after the first command: not a directive
    )
    res = mgpu(cluster, tmp_path, "submit", "--name", "from-cli", "--time", "30", "job.sh")
    assert (res.returncode, res.stderr) == (0, "")
    job_id = res.stdout.strip()
    job = ended(cluster, job_id)
    assert (job["name"], job["gpus"], job["priority"], job["time_limit"]) == (
        "from-cli",
        2,
        4,
        1800,
    )
    assert job["slurm"] is None  # only #MGPU lines: mgpu's own job
    assert job["option_sources"] == {
        "name": "command line",
        "gpus": "#MGPU",
        "time": "command line",
        "priority": "#MGPU",
    }
    assert cluster.client().logs(job_id).count(",") == 1  # two GPUs
    shown = cluster.cli("show", job_id, check=True).stdout
    assert "  options:    #MGPU: --gpus, --priority; command line: --name, --time;" in shown
    assert "  script:     job.sh (sent with the job)" in shown


def test_sbatch_lines_make_it_a_slurm_batch_job(cluster: LocalCluster, tmp_path: Path) -> None:
    """`mgpu submit FILE` of a script with #SBATCH lines is what `sbatch FILE` submits:
    Slurm's variables and output file, no GPU unless asked, the script's name as the job's;
    mgpu's #MGPU lines and command line still win."""
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n"
        "#SBATCH -n 3 --mem=1G -t 0:30\n"
        "#SBATCH --output=out-%x-%j.txt\n"
        "#MGPU --priority 4\n"
        'echo "$SLURM_JOB_NAME $SLURM_NTASKS $SLURM_JOB_ID [$CUDA_VISIBLE_DEVICES] $1"\n'
    )
    res = mgpu(cluster, tmp_path, "submit", "--time", "20", "job.sh", "arg1")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # --mem is scheduled: no warning
    job_id = res.stdout.strip()
    job = ended(cluster, job_id)
    assert job["state"] == "completed", job
    assert (job["gpus"], job["priority"], job["time_limit"]) == (0, 4, 1200)
    assert job["slurm"]["batch"] and job["slurm"]["ntasks"] == 3
    assert job["mem_mb"] == 1024  # held on its node
    assert job["option_sources"] == {"time": "command line", "priority": "#MGPU"}
    line = f"job.sh 3 {job_id} [] arg1\n"
    assert (tmp_path / f"out-job.sh-{job_id}.txt").read_text() == line
    assert cluster.client().logs(job_id) == line  # the master keeps it too


def test_bad_directives_and_options_are_refused_whole(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    (tmp_path / "bad.sh").write_text("#!/bin/sh\n#MGPU -N 2-4\ntrue\n")
    before = len(cluster.client().queue(all=True)["jobs"])
    res = mgpu(cluster, tmp_path, "submit", "bad.sh")
    assert res.returncode == 2
    assert res.stderr == (
        "mgpu: error: bad.sh line 2: #MGPU -N 2-4: argument --nodes/-N: invalid int value: '2-4'\n"
    )
    (tmp_path / "bad.sh").write_text("#!/bin/sh\n#SBATCH --open-mode=sideways\ntrue\n")
    res = mgpu(cluster, tmp_path, "submit", "bad.sh")
    assert (res.returncode, res.stderr) == (
        2,
        "mgpu: error: bad.sh: Invalid --open-mode specification\n",
    )
    (tmp_path / "huge.sh").write_text("#!/bin/sh\n" + "#" * (1 << 20))
    res = mgpu(cluster, tmp_path, "submit", "huge.sh")
    assert res.returncode == 2 and "is over 1 MiB" in res.stderr
    (tmp_path / "ok.sh").write_text("#!/bin/sh\n#SBATCH -N 1\ntrue\n")
    for args, words in (
        (["--signal", "KILL@5", "true"], "--signal: SIGKILL cannot be caught"),
        (["--signal", "USR1@600", "--time", "5", "true"], "before it starts"),
        (["--signal", "USR1@", "true"], "is not a signal spec"),
        (["--image", "alpine", "ok.sh"], "a job script cannot run in --image yet"),
    ):
        res = mgpu(cluster, tmp_path, "submit", *args)
        assert res.returncode == 1 and words in res.stderr, res.stderr
        assert res.stderr.startswith("mgpu: error: ") and res.stderr.count("\n") == 1
    assert len(cluster.client().queue(all=True)["jobs"]) == before


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-traversable submit dir (pytest's own are private to root, and a job of
    another account must be able to enter its working directory)."""
    top = Path(tempfile.mkdtemp(prefix="mgpu-script-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_script_of_another_user_is_theirs_and_removed_after(
    cluster: LocalCluster, shared_dir: Path
) -> None:
    token = cluster.client().create_token("daemon")["token"]
    (shared_dir / "whoami.sh").write_text(
        '#!/bin/sh\nid -un; stat -c "%U %a" "$0" "$(dirname "$0")"; echo "$0"\n'
    )
    res = mgpu(cluster, shared_dir, "submit", "--gpus", "0", "whoami.sh", token=token)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    assert Client(cluster.address, token=token).wait(job_id, timeout=30)["state"] == "completed"
    user, file_mode, dir_mode, path = cluster.client().logs(job_id).splitlines()
    assert (user, file_mode, dir_mode) == ("daemon", "daemon 700", "daemon 700")
    wait_for(lambda: not Path(path).parent.exists(), what="the script's removal")
    show = json.loads(cluster.cli("show", job_id, "--json", check=True).stdout)
    assert show["user"] == "daemon"


def test_a_script_dir_swapped_for_a_link_makes_the_agent_remove_nothing_else(
    cluster: LocalCluster, shared_dir: Path
) -> None:
    """The script's directory is the job user's: they may put a symbolic link to any
    directory in its place.  The root agent's clean-up must not remove the file of the
    script's name there (it removes the link only)."""
    victim = shared_dir / "victim"
    victim.mkdir()
    (victim / "swap.sh").write_text("root's file\n")
    token = cluster.client().create_token("daemon")["token"]
    (shared_dir / "swap.sh").write_text(
        '#!/bin/sh\nd=$(dirname "$0")\n'
        f'mv "$d" "$d.old" && ln -s {victim} "$d" && rm -rf "$d.old" && echo "$d"\n'
    )
    res = mgpu(cluster, shared_dir, "submit", "--gpus", "0", "swap.sh", token=token)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    done = Client(cluster.address, token=token).wait(job_id, timeout=30)
    link = Path(cluster.client().logs(job_id).strip())
    assert done["state"] == "completed" and link.is_symlink(), (done, link)
    wait_for(lambda: not os.path.lexists(link), what="the agent's clean-up of the run")
    assert (victim / "swap.sh").read_text() == "root's file\n"


def test_a_stopped_agent_leaves_no_job_script_behind(tmp_path: Path) -> None:
    """Job scripts live in the agent's temp dir and go a moment after each run's end; an
    agent stopped (SIGTERM) right after its jobs ended removes them before it goes."""
    from helpers import kill_group, local_cluster

    temp = tmp_path / "agent-tmp"
    temp.mkdir()
    (tmp_path / "c").mkdir()
    with local_cluster(tmp_path / "c", agents=0) as c:
        c.env["TMPDIR"] = str(temp)  # the agent's tempfile.mkdtemp
        agent = c.start_agent("node001", gpus=1)
        (tmp_path / "job.sh").write_text("#!/bin/sh\necho ran\n")
        ids = [mgpu(c, tmp_path, "submit", "--gpus", "0", "job.sh").stdout.strip() for _ in "ab"]
        for job_id in ids:
            assert ended(c, job_id)["state"] == "completed"
        kill_group(agent)  # SIGTERM, waited for
        assert agent.returncode == -15  # it still ends as SIGTERM ends it
        assert list(temp.iterdir()) == []
