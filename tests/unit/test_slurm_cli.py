"""The Slurm commands as programs, against a fake master: what sbatch sends (the `slurm`
block, the fields), what it prints, `--parsable`/`-Q`, the mail fallback, `mgpu sbatch`,
and that squeue and its peers start at the floor (nothing heavy imported)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_cli_startup import HEAVY, MGPU, _FakeMaster, imported

from factories import http_server

JOB = {
    "id": "42",
    "name": "train",
    "user": "alice",
    "state": "running",
    "gpus": 1,
    "nodes": 1,
    "allocation": [{"node_id": "node001", "gpu_ids": [0]}],
    "submit_time": 1700000000.0,
    "start_time": 1700000001.0,
    "end_time": None,
    "time_limit": None,
    "exit_code": None,
    "reason": None,
}
NODE = {"node_id": "node001", "state": "online", "connected": True, "gpus": [{"index": 0}]}


class _Master(_FakeMaster):
    """test_cli_startup's fake master, with what the Slurm commands ask for."""

    posted: ClassVar[list[dict[str, Any]]] = []
    refuse_mail = False

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == "/api/jobs":
            self._answer(200, {"jobs": [JOB], "nodes": [NODE]})
        elif path == "/api/nodes":
            self._answer(200, {"nodes": [NODE]})
        elif path == "/api/whoami":
            self._answer(200, {"user": "alice", "admin": False})
        else:
            self._answer(404, {"detail": "no such job or node"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/api/jobs":
            if body.get("dependency") == "afterok:999":
                self._answer(422, {"detail": "--dependency afterok:999 names no known job"})
                return
            if self.refuse_mail and str(body.get("notify", "")).startswith("mailto:"):
                self._answer(422, {"detail": "--notify mailto:x: this cluster sends no e-mail"})
                return
            self.posted.append(body)
            self._answer(200, {"job_id": "43"})
        else:
            self._answer(404, {"detail": "no such job"})


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    with http_server(_Master) as address:
        yield address


def slurm(
    master: str, cwd: Path, *argv: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "MGPU_MASTER": master}
    env["MGPU_TOKEN"] = "mgpu_test"
    return subprocess.run(
        [sys.executable, "-m", "mgpu.slurm", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        input=input,
        timeout=60,
    )


def test_sbatch_sends_the_slurm_block(master: str, tmp_path: Path) -> None:
    _Master.posted.clear()
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n#SBATCH -N2 --gpus-per-node=2\n#SBATCH -n 8\nsrun x\n"
    )
    res = slurm(master, tmp_path, "sbatch", "-p", "gpu", "job.sh", "a", "b")
    assert (res.returncode, res.stdout, res.stderr) == (0, "Submitted batch job 43\n", "")
    body = _Master.posted[-1]
    assert body["argv"] == ["a", "b"]
    assert (body["script_name"], body["nodes"], body["gpus_per_node"]) == ("job.sh", 2, 2)
    assert body["script"].startswith("#!/bin/bash\n")
    block = body["slurm"]
    assert (block["batch"], block["ntasks"], block["partition"]) == (True, 8, "gpu")
    assert (block["job_name_default"], block["submit_dir"]) == ("job.sh", str(tmp_path))
    assert body["cwd"] == str(tmp_path)


def test_parsable_quiet_and_mail(master: str, tmp_path: Path) -> None:
    res = slurm(master, tmp_path, "sbatch", "--parsable", "--wrap", "true")
    assert res.stdout == "43\n"
    res = slurm(master, tmp_path, "sbatch", "-Q", "--mem=4G", "--wrap", "true")
    assert (res.stdout, res.stderr) == ("", "")
    _Master.refuse_mail = True
    try:
        res = slurm(master, tmp_path, "sbatch", "--mail-user=a@b.c", "--wrap", "true")
    finally:
        _Master.refuse_mail = False
    assert res.returncode == 0 and res.stdout == "Submitted batch job 43\n"
    assert res.stderr == (
        "sbatch: warning: --mail-user/--mail-type ignored: this cluster sends no e-mail\n"
    )
    assert "notify" not in _Master.posted[-1]


def test_the_masters_refusal_in_slurms_words(master: str, tmp_path: Path) -> None:
    res = slurm(master, tmp_path, "sbatch", "-d", "afterok:999", "--wrap", "true")
    assert (res.returncode, res.stdout, res.stderr) == (
        1,
        "",
        "sbatch: error: Batch job submission failed: Job dependency problem "
        "(--dependency afterok:999 names no known job)\n",
    )


def test_a_script_on_stdin(master: str, tmp_path: Path) -> None:
    res = slurm(master, tmp_path, "sbatch", input="#!/bin/sh\n#SBATCH -J piped\necho hi\n")
    assert res.returncode == 0, res.stderr
    body = _Master.posted[-1]
    assert (body["name"], body["script_name"], body["gpus"]) == ("piped", "sbatch", 0)


def test_singleton_waits_for_this_users_jobs_of_the_name(master: str, tmp_path: Path) -> None:
    res = slurm(master, tmp_path, "sbatch", "-J", "train", "-d", "singleton", "--wrap", "x")
    assert res.returncode == 0, res.stderr
    assert _Master.posted[-1]["dependency"] == "afterany:42"


def test_mgpu_squeue_is_the_same_command(master: str) -> None:
    if not MGPU.exists():
        pytest.skip("no mgpu console script next to this Python")
    host, port = master.split(":")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "MGPU_TOKEN": "t"}
    for argv in (
        ["squeue", "-h", "-o", "%i %T %N"],
        ["--host", host, "--port", port, "squeue", "-h", "-o", "%i %T %N"],
    ):
        given = env if argv[0] == "--host" else {**env, "MGPU_MASTER": master}
        res = subprocess.run(
            [str(MGPU), *argv], capture_output=True, text=True, env=given, timeout=60
        )
        assert (res.returncode, res.stdout) == (0, "42 RUNNING node001\n"), res.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["squeue"],
        ["squeue", "-h", "-o", "%i %T", "-t", "R"],
        ["sinfo"],
        ["sacct", "-j", "42", "-P"],
        ["scontrol", "show", "hostnames", "n[1-2]"],
    ],
)
def test_the_commands_import_nothing_heavy(argv: list[str], master: str) -> None:
    if not MGPU.exists():
        pytest.skip("no mgpu console script next to this Python")
    _, at_start = imported(["-c", "pass"], master)
    res, modules = imported([str(MGPU), *argv], master)
    assert res.returncode == 0, res.stderr[-2000:]
    heavy = {m for m in modules - at_start if m in HEAVY or m.split(".")[0] in HEAVY}
    # scontrol show hostnames parses a host list (re); sacct reads dates (time.strptime).
    allowed = ("re", "enum", "collections", "typing") if argv[0] in ("scontrol", "sacct") else ()
    left = {m for m in heavy if m.split(".")[0] not in allowed}
    assert not left, f"{' '.join(argv)} imports {sorted(left)}"


def test_srun_inside_a_job_is_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a job srun hands its options to helper steps' client (mgpu.client.steps)."""
    import types

    from mgpu.slurm import srun

    calls: list[tuple[list[str], dict[str, Any]]] = []

    class StepOptions:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    def run_step(argv: list[str], options: StepOptions) -> int:
        calls.append((argv, options.kw))
        return 7

    fake = types.ModuleType("mgpu.client.steps")
    fake.StepOptions = StepOptions  # type: ignore[attr-defined]
    fake.run_step = run_step  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mgpu.client.steps", fake)
    import mgpu.client

    # The package's attribute too: `from mgpu.client import steps` finds the real module
    # there once any other test has imported it.
    monkeypatch.setattr(mgpu.client, "steps", fake, raising=False)
    monkeypatch.setenv("MGPU_JOB_ID", "12")
    argv = [
        "-N2",
        "-n",
        "4",
        "-l",
        "--gpus-per-task=1",
        "-c3",
        "-K",
        "-D",
        "/w",
        "--gpu-bind=single:1",
        "--export=NONE",
        "python",
        "x.py",
        "-n",
        "3",
    ]
    assert srun.main(argv) == 7
    assert calls == [
        (
            ["python", "x.py", "-n", "3"],
            {
                "nodes": 2,
                "ntasks": 4,
                "ntasks_per_node": None,
                "nodelist": None,
                "gpus_per_task": 1,
                "cpus_per_task": 3,
                "label": True,
                "kill_on_bad_exit": True,
                "pty": False,
                "cwd": "/w",
                "job_id": None,
                "gpu_bind": "single:1",
                "export": "NONE",
                "image": None,
                "container": None,
            },
        )
    ]
    # Without the options, what the job's sbatch set (SLURM_GPU_BIND, SLURM_EXPORT_ENV),
    # SRUN_EXPORT_ENV over SLURM_EXPORT_ENV, as Slurm's srun reads them.
    calls.clear()
    monkeypatch.setenv("SLURM_GPU_BIND", "none")
    monkeypatch.setenv("SLURM_EXPORT_ENV", "NONE")
    monkeypatch.setenv("SRUN_EXPORT_ENV", "ALL")
    assert srun.main(["true"]) == 7
    assert (calls[0][1]["gpu_bind"], calls[0][1]["export"]) == ("none", "ALL")


def test_a_bad_gpu_bind_is_slurms_sentence_in_each_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mgpu.slurm import sbatch, srun
    from mgpu.slurm.common import SlurmError

    monkeypatch.setenv("MGPU_JOB_ID", "12")
    with pytest.raises(SlurmError) as e:
        srun.main(["--gpu-bind=sideways", "true"])
    assert str(e.value) == "srun: error: Invalid --gpu-bind argument: gpu:sideways"
    assert e.value.code != 0
    with pytest.raises(SlurmError, match=r"^sbatch: error: Invalid --gpu-bind argument: gpu:x$"):
        sbatch.main(["--gpu-bind=x", "--wrap", "true"])
