"""Fractional jobs under NVIDIA MPS, where the node runs its control daemon.

A job with a share of a GPU (`--gpu-share F`: the master sets `MGPU_GPU_SHARE`,
`MGPU_GPU_MEMORY_LIMIT_MB` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` in its environment) is
run as an MPS client when `nvidia-cuda-mps-control -d` runs on the node: its pipe directory
(the agent's own `$CUDA_MPS_PIPE_DIRECTORY`, else MPS's default `/tmp/nvidia-mps`) holds the
daemon's `control` FIFO.  The job then gets the daemon's pipe and log directories and
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=NNNM`, so the MPS server caps the memory it may pin on
its GPU (device 0: the only one its `CUDA_VISIBLE_DEVICES` shows it) at its share.  Without a
daemon a shared job runs as any other, and the share is advisory (its variables say it).

Looked up at every launch (one stat): the daemon may be started or stopped while the agent
runs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_LOG_DIR", "DEFAULT_PIPE_DIR", "mps_env", "pipe_dir"]

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"


def pipe_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The running MPS control daemon's pipe directory, or None when there is none."""
    env = os.environ if environ is None else environ
    path = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    try:
        mode = (path / "control").stat().st_mode
    except OSError:
        return None
    return path if stat.S_ISFIFO(mode) else None


def mps_env(job_env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a shared job's environment gets to run under MPS (empty: not shared, or no
    daemon on this node)."""
    if "MGPU_GPU_SHARE" not in job_env:
        return {}
    env = os.environ if environ is None else environ
    pipes = pipe_dir(env)
    if pipes is None:
        return {}
    out = {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
        "CUDA_MPS_LOG_DIRECTORY": env.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR,
    }
    limit = job_env.get("MGPU_GPU_MEMORY_LIMIT_MB")
    if limit and limit.isdigit():
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    return out
