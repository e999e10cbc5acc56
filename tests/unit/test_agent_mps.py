"""Shared jobs under MPS: the agent finds the control daemon by its pipe and sets the job's
MPS variables (a fake pipe directory stands in for `nvidia-cuda-mps-control -d`)."""

from __future__ import annotations

import os
from pathlib import Path

from mgpu.agent.mps import DEFAULT_LOG_DIR, mps_env, pipe_dir

SHARED = {"MGPU_GPU_SHARE": "0.25", "MGPU_GPU_MEMORY_LIMIT_MB": "20480"}


def daemon(tmp_path: Path) -> Path:
    pipes = tmp_path / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")
    return pipes


def test_shared_job_runs_under_the_daemon(tmp_path: Path) -> None:
    pipes = daemon(tmp_path)
    env = mps_env(SHARED, {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
        "CUDA_MPS_LOG_DIRECTORY": DEFAULT_LOG_DIR,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
    }
    logs = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": "/l"}
    assert mps_env(SHARED, logs)["CUDA_MPS_LOG_DIRECTORY"] == "/l"


def test_no_daemon_or_no_share_no_mps(tmp_path: Path) -> None:
    pipes = daemon(tmp_path)
    assert mps_env({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}) == {}
    empty = tmp_path / "none"
    empty.mkdir()
    assert mps_env(SHARED, {"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) == {}
    (empty / "control").write_text("")  # a plain file is not the daemon's FIFO
    assert pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) is None
