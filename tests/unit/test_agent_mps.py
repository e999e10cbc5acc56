"""Shared jobs under MPS: the agent finds the control daemon by its pipe and sets the job's
MPS variables (a fake pipe directory stands in for `nvidia-cuda-mps-control -d`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from mgpu.agent import mps
from mgpu.agent.mps import DEFAULT_LOG_DIR, mps_env, pipe_dir

SHARED = {"MGPU_GPU_SHARE": "0.25", "MGPU_GPU_MEMORY_LIMIT_MB": "20480"}


def daemon(tmp_path: Path) -> Path:
    pipes = tmp_path / "mps"
    pipes.mkdir(mode=0o755)
    os.mkfifo(pipes / "control")
    (tmp_path / "mps-log").mkdir(mode=0o755)
    return pipes


def daemon_env(tmp_path: Path) -> dict[str, str]:
    """The agent's environment: where the daemon's pipe and log directories are."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
    }


def test_shared_job_runs_under_the_daemon(tmp_path: Path) -> None:
    pipes = daemon(tmp_path)
    env = mps_env(SHARED, daemon_env(tmp_path))
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
    }


def test_the_default_log_directory_is_used_when_it_is_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipes = daemon(tmp_path)
    monkeypatch.setattr(mps, "DEFAULT_LOG_DIR", str(tmp_path / "mps-log"))
    env = mps_env(SHARED, {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps-log")
    assert DEFAULT_LOG_DIR == "/var/log/nvidia-mps"


@pytest.mark.parametrize("which", ["mps", "mps-log"])
@pytest.mark.parametrize("how", ["another user's", "group-writable", "world-writable", "a link"])
def test_a_directory_a_user_could_have_made_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str, how: str
) -> None:
    """/tmp/nvidia-mps (the default) can be made by anyone before the daemon starts: a
    user's fake `control` there would have other users' jobs talk to that user's server."""
    daemon(tmp_path)
    path = tmp_path / which
    if how == "another user's":
        os.chown(path, 12345, 12345)
    elif how == "group-writable":
        path.chmod(0o775)
    elif how == "world-writable":
        path.chmod(0o1777)  # sticky /tmp-like: still anyone's to fill
    else:
        real = tmp_path / f"{which}.real"
        path.rename(real)
        path.symlink_to(real)
    assert os.path.isdir(path)
    mps._refused.clear()
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        assert mps_env(SHARED, daemon_env(tmp_path)) == {}
        assert mps_env(SHARED, daemon_env(tmp_path)) == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(path) in lines[0] and "without MPS" in lines[0], lines


def test_a_missing_log_directory_is_refused(tmp_path: Path) -> None:
    daemon(tmp_path)
    (tmp_path / "mps-log").rmdir()
    assert mps_env(SHARED, daemon_env(tmp_path)) == {}


def test_no_daemon_or_no_share_no_mps(tmp_path: Path) -> None:
    pipes = daemon(tmp_path)
    assert mps_env({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}) == {}
    empty = tmp_path / "none"
    empty.mkdir()
    assert mps_env(SHARED, {"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) == {}
    (empty / "control").write_text("")  # a plain file is not the daemon's FIFO
    assert pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) is None
