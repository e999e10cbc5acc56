"""The GPU tier (`make gpu-test`): a real master and agent on this machine's NVIDIA GPUs,
no `--fake-gpus`.  Every test here is skipped where no NVIDIA GPU is (`nvidia-smi -L`
fails or NVML does not start), so that `pytest` anywhere else stays green."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from realgpu import CONFIG, RealCluster, why_no_gpu


@pytest.fixture(autouse=True)
def _needs_a_gpu() -> None:
    why = why_no_gpu()
    if why is not None:
        pytest.skip(f"the GPU tier needs an NVIDIA GPU: {why}")


@pytest.fixture(scope="module")
def gpus() -> Iterator[RealCluster]:
    why = why_no_gpu()
    if why is not None:
        pytest.skip(f"the GPU tier needs an NVIDIA GPU: {why}")
    root = Path(tempfile.mkdtemp(prefix="mgpu-gpu-"))
    root.chmod(0o755)  # jobs run as their owner, who must reach the files here
    cluster = RealCluster(root, CONFIG)
    try:
        cluster.start_master()
        cluster.start_real_agent()
        yield cluster
    finally:
        cluster.stop()
        keep = os.environ.get("MGPU_GPU_LOGS")  # the master's, agent's and MPS logs, kept
        if keep:
            shutil.copytree(root, keep, dirs_exist_ok=True, ignore=_not_logs)
        shutil.rmtree(root, ignore_errors=True)


def _not_logs(folder: str, names: list[str]) -> list[str]:
    """For copytree: keep the *.log files and the MPS log directory, nothing else."""
    return [
        n
        for n in names
        if not n.endswith(".log")
        and not n.startswith("mps-log")
        and not os.path.isdir(os.path.join(folder, n))
    ]
