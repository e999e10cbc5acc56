"""`mgpu pod-init` (mgpu.podagent.init), a Kubernetes job's first process where its Pod
runs an agent: it runs the job as its child, sends it the signals it gets, and tells a
death by signal N as `-N` in the termination message (Kubernetes says 128+N for both a
death by signal and an exit with 128+N); and the master's reading of that message
(mgpu.master.kube.runs.container_end).  Real processes; the message file is a temp file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpu.master.kube.runs import container_end
from mgpu.podagent import init
from mgpu.testing import kill_group


@pytest.fixture
def message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setattr(init, "MESSAGE_PATH", str(path))
    return path


def test_an_exit_is_told_as_its_code(message: Path) -> None:
    assert init.main(["--", "sh", "-c", "exit 137"]) == 137
    assert message.read_text() == "137\n"  # an exit with 137: no signal


def test_a_death_by_signal_is_told_as_minus_the_signal(message: Path) -> None:
    assert init.main(["sh", "-c", "kill -9 $$"]) == 137
    assert message.read_text() == "-9\n"


def test_a_missing_program_is_127_with_a_sentence(
    message: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert init.main(["/nonexistent/prog"]) == 127
    assert "/nonexistent/prog: No such file or directory" in capsys.readouterr().err
    assert message.read_text() == "127\n"


def test_a_signal_sent_to_it_reaches_the_job_and_the_mark_does_not(tmp_path: Path) -> None:
    """SIGTERM to pod-init (the kubelet's, on a cancel) reaches the job, whose trap runs;
    the job's environment has no MGPU_POD_INIT (the pod agent would spare it)."""
    ready, out = tmp_path / "ready", tmp_path / "out"
    job = (
        f"trap 'echo term >> {out}; exit 3' TERM; env > {tmp_path}/env; touch {ready}; "
        "while :; do sleep 0.1; done"
    )
    code = (
        "import sys; from mgpu.podagent import init; "
        f"init.MESSAGE_PATH = {str(tmp_path / 'msg')!r}; sys.exit(init.main(sys.argv[1:]))"
    )
    env = {**os.environ, "MGPU_POD_INIT": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "sh", "-c", job], env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 3
    finally:
        kill_group(proc)
    assert out.read_text() == "term\n"
    assert (tmp_path / "msg").read_text() == "3\n"
    assert "MGPU_POD_INIT=" not in (tmp_path / "env").read_text()


@pytest.mark.parametrize(
    ("details", "code"),
    [
        ({"exitCode": 137, "message": "-9\n"}, -9),
        ({"exitCode": 137, "message": "137\n"}, 137),  # exit 137
        ({"exitCode": 137}, 137),  # no pod-init (no pod agent): Kubernetes' word
        ({"exitCode": 3, "message": "-9"}, 3),  # a message that does not match the code
        ({"exitCode": 143, "message": "-15"}, -15),
        ({"exitCode": 0, "message": "hello"}, 0),
        ({}, None),
    ],
)
def test_the_master_reads_a_death_by_signal_from_the_message(
    details: dict[str, object], code: int | None
) -> None:
    assert container_end(details) == code


def _proc(root: Path, pid: int, ppid: int, env: list[str]) -> None:
    d = root / str(pid)
    d.mkdir()
    d.joinpath("stat").write_text(f"{pid} (sh) S {ppid} {pid} 7 0")
    d.joinpath("environ").write_bytes(b"\0".join(e.encode() for e in env) + b"\0")


def test_a_forwarded_signal_goes_to_the_runners_script(tmp_path: Path) -> None:
    """Under the -o/-e runner (8, pod-init's child) the signal goes to the marked batch
    script (10), not its marked child (11) nor the runner; a marked process elsewhere (a
    step of another shape, 40) is not the job's top; without a marked one, the child."""
    _proc(tmp_path, 7, 0, ["MGPU_POD_INIT=1"])
    _proc(tmp_path, 8, 7, ["A=1"])
    _proc(tmp_path, 9, 8, ["A=1"])  # a tee
    _proc(tmp_path, 10, 9, ["MGPU_BATCH_TOP=1"])
    _proc(tmp_path, 11, 10, ["MGPU_BATCH_TOP=1"])
    _proc(tmp_path, 40, 1, ["MGPU_BATCH_TOP=1"])
    assert init.top(8, str(tmp_path)) == 10
    assert init.top(99, str(tmp_path)) == 99
