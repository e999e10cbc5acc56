"""A Kubernetes batch job's -o/-e files, written in its Pod by the runner
(mgpu.master.kube.podoutput), run here by the shells a Pod's image may have (dash as
/bin/sh, busybox's ash where installed): the files get every byte the script wrote, the
Pod's log (the runner's stdout and stderr) gets the same bytes, the script's status is
the runner's, and a file that cannot be opened is Slurm's sentence and status 53."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu.exits import open_failure
from mgpu.kubesection import KubernetesSection
from mgpu.master.kube.podoutput import OPEN_FAILED, runner
from mgpu.master.kube.podspec import PodShape, build_pod
from mgpu.protocol import Grant, Launch

SCRIPT = """#!/bin/sh
for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; done
echo "args $*"
exit 7
"""
SHELLS = [["/bin/sh"]] + ([["busybox", "sh"]] if shutil.which("busybox") else [])


def _run(shell: list[str], cwd: Path, out: str, err: str, append: bool = False):  # type: ignore[no-untyped-def]
    argv = runner("job.sh", out, err, append, ["a", "b"])
    assert argv[:2] == ["/bin/sh", "-c"]
    return subprocess.run(
        [*shell, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MGPU_BATCH_SCRIPT": SCRIPT},
    )  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_one_file_gets_both_streams_and_the_log_the_same(shell: list[str], tmp_path: Path) -> None:
    done = _run(shell, tmp_path, "slurm-5.out", "slurm-5.out")
    assert done.returncode == 7, done.stderr
    text = (tmp_path / "slurm-5.out").read_text()
    lines = text.splitlines()
    assert sorted(lines) == sorted([*(f"out {i}" for i in (1, 2, 3)),
                                    *(f"err {i}" for i in (1, 2, 3)), "args a b"])  # fmt: skip
    assert done.stdout == text and done.stderr == ""  # the log: the same bytes, once


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_separate_error_file_and_append(shell: list[str], tmp_path: Path) -> None:
    (tmp_path / "o.txt").write_text("before\n")
    done = _run(shell, tmp_path, "o.txt", "e.txt", append=True)
    assert done.returncode == 7
    assert (tmp_path / "o.txt").read_text() == "before\nout 1\nout 2\nout 3\nargs a b\n"
    assert (tmp_path / "e.txt").read_text() == "err 1\nerr 2\nerr 3\n"
    assert done.stdout == "out 1\nout 2\nout 3\nargs a b\n"
    assert done.stderr == "err 1\nerr 2\nerr 3\n"
    again = _run(shell, tmp_path, "o.txt", "e.txt")  # truncate: the default
    assert (tmp_path / "o.txt").read_text() == "out 1\nout 2\nout 3\nargs a b\n"
    assert again.returncode == 7


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_file_that_cannot_be_opened_is_slurms_sentence(shell: list[str], tmp_path: Path) -> None:
    done = _run(shell, tmp_path, "no/such/dir/x.out", "no/such/dir/x.out")
    assert done.returncode == OPEN_FAILED
    # Slurm's words: the path from the working directory, the C library's reason.
    assert done.stderr == (
        f"slurmstepd: error: Could not open stdout file {tmp_path}/no/such/dir/x.out: "
        "No such file or directory\n"
    ), done.stderr
    assert "out 1" not in done.stdout  # the script did not run
    first_line = done.stderr.splitlines()[0]
    assert open_failure(done.returncode, [first_line]) == (
        f"Could not open stdout file {tmp_path}/no/such/dir/x.out: No such file or directory"
    )


def test_a_batch_pod_with_output_files_runs_the_runner() -> None:
    launch = Launch(job_id="5", epoch=1, argv=["x"], env={}, grant=Grant(gpus=[]),
                    script=SCRIPT, script_name="job.sh", output_file="slurm-5.out",
                    cwd="/nas/alice/run")  # fmt: skip
    shape = PodShape(cluster="lab", rank=0, slot_node="n1", pinned=False, gang=1, gpus=0,
                     uid=1000, gid=1000)  # fmt: skip
    mount = {"name": "nas", "mountPath": "/nas"}
    template = {"spec": {"containers": [{"name": "main", "volumeMounts": [mount]}]}}
    container = build_pod(launch, KubernetesSection(image="i", pod_template=template), shape)
    job = container["spec"]["containers"][0]
    assert job["command"] == runner("job.sh", "slurm-5.out", "slurm-5.out", False, ["x"])
    assert job["workingDir"] == "/nas/alice/run"
    env = {e["name"]: e.get("value") for e in job["env"]}
    assert env["MGPU_BATCH_SCRIPT"] == SCRIPT
    # No volume holds the job's directory: the files would go with the container; none.
    bare = build_pod(launch, KubernetesSection(image="i"), shape)["spec"]["containers"][0]
    assert "slurm-5.out" not in bare["command"]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_script_without_files_writes_one_stream_in_its_order(shell: list[str]) -> None:
    """No volume, no files: the script's stderr is its stdout, so the Pod's log (the
    runtime reads a container's streams apart) keeps the order the script wrote in."""
    launch = Launch(job_id="5", epoch=1, argv=["a", "b"], env={}, grant=Grant(gpus=[]),
                    script=SCRIPT, script_name="job.sh", output_file="slurm-5.out")  # fmt: skip
    shape = PodShape(cluster="lab", rank=0, slot_node="n1", pinned=False, gang=1, gpus=0,
                     uid=1000, gid=1000)  # fmt: skip
    command = build_pod(launch, KubernetesSection(image="i"), shape)["spec"]["containers"][0][
        "command"
    ]
    done = subprocess.run(
        [*shell, *command[1:]], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MGPU_BATCH_SCRIPT": SCRIPT},
    )  # fmt: skip
    assert done.returncode == 7
    assert done.stdout == "out 1\nerr 1\nout 2\nerr 2\nout 3\nerr 3\nargs a b\n"
    assert done.stderr == ""


def _run_script(shell: list[str], cwd: Path, script: str) -> subprocess.CompletedProcess[str]:
    argv = runner("job.sh", "o.txt", "o.txt", False, [])
    return subprocess.run(
        [*shell, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MGPU_BATCH_SCRIPT": script},
    )  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_script_killed_by_a_signal_kills_the_runner_with_it(
    shell: list[str], tmp_path: Path
) -> None:
    """The runner dies of the script's signal (so `mgpu pod-init` tells `-9`), and the
    shell's `Killed` line is in neither the file nor the log (Slurm's output has none)."""
    done = _run_script(shell, tmp_path, "#!/bin/sh\necho before\nkill -9 $$\n")
    assert done.returncode == -9, done
    assert (tmp_path / "o.txt").read_text() == "before\n"
    assert done.stdout == "before\n" and done.stderr == ""


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_script_that_exits_137_is_an_exit(shell: list[str], tmp_path: Path) -> None:
    done = _run_script(shell, tmp_path, "#!/bin/sh\necho Killed\nexit 137\n")
    assert done.returncode == 137, done
    assert done.stdout == "Killed\n"
