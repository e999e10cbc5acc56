"""Fractional jobs under NVIDIA MPS, where the node runs its control daemon.

A job with a share of a GPU (`--gpu-share F`: the master sets `MGPU_GPU_SHARE`,
`MGPU_GPU_MEMORY_LIMIT_MB` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` in its environment) is
run as an MPS client when `nvidia-cuda-mps-control -d` runs on the node: its pipe directory
(the agent's own `$CUDA_MPS_PIPE_DIRECTORY`, else MPS's default `/tmp/nvidia-mps`) holds the
daemon's `control` FIFO.  The job then gets the daemon's pipe and log directories and
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=NNNM`, so the MPS server caps the memory it may pin on
its GPU (device 0: the only one its `CUDA_VISIBLE_DEVICES` shows it) at its share.  Without a
daemon a shared job runs as any other, and the share is advisory (its variables say it).

Looked up at every launch (a few stats): the daemon may be started or stopped while the
agent runs.

Both directories must be the daemon's: owned by root (or the agent's account), not
writable by group or others, and not a symbolic link.  The default pipe directory is in
`/tmp`, where any user could make `/tmp/nvidia-mps` with a `control` FIFO of their own
before the daemon starts: other users' shared jobs would then talk to that user's "MPS
server".  A directory that fails is refused with a log line, and shared jobs run without
MPS.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_LOG_DIR", "DEFAULT_PIPE_DIR", "mps_env", "pipe_dir", "unsafe"]

log = logging.getLogger("mgpu.agent")

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"


def pipe_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The running MPS control daemon's pipe directory, or None when there is none (or
    it is not safe to use: see `unsafe`)."""
    env = os.environ if environ is None else environ
    path = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    try:
        mode = (path / "control").stat().st_mode
    except OSError:
        return None
    if not stat.S_ISFIFO(mode):
        return None
    why = unsafe(str(path))
    if why is not None:
        _refuse(f"MPS pipe directory {why}")
        return None
    return path


def unsafe(path: str) -> str | None:
    """Why the directory `path` may not be the MPS daemon's (a user could have made it or
    could change it), or None when it is safe: a directory itself (not a link), owned by
    root or the agent's account, writable by its owner only."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_refused: set[str] = set()


def _refuse(why: str) -> None:
    """Log why MPS is not used, once per reason (not at every launch)."""
    if why not in _refused:
        _refused.add(why)
        log.warning("%s: shared jobs run without MPS", why)


def mps_env(job_env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a shared job's environment gets to run under MPS (empty: not shared, or no
    daemon on this node)."""
    if "MGPU_GPU_SHARE" not in job_env:
        return {}
    env = os.environ if environ is None else environ
    pipes = pipe_dir(env)
    if pipes is None:
        return {}
    logs = env.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR
    why = unsafe(logs)
    if why is not None:
        _refuse(f"MPS log directory {why}")
        return {}
    out = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": logs}
    limit = job_env.get("MGPU_GPU_MEMORY_LIMIT_MB")
    if limit and limit.isdigit():
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    return out
