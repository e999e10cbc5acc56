"""Test helpers: the local-cluster harness lives in the package (benchmarks use it too)."""

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mgpu.testing import BIN, LocalCluster, free_port, kill_group, local_cluster, wait_for

__all__ = [
    "BIN",
    "LocalCluster",
    "dist_dir",
    "free_port",
    "kill_group",
    "local_cluster",
    "until",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[1]


async def until(cond: Callable[[], object], timeout: float, what: str) -> None:
    """`wait_for` on a running event loop: poll `cond` every 10 ms, not blocking the loop;
    fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def dist_dir() -> Path:
    """The standalone executables scripts/build-dist.sh builds with this Python, in
    build/dist-test (cached between runs: `make test` builds them beside lint); skips
    where PyInstaller is not installed."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        pytest.skip("PyInstaller is not installed (pip install 'pyinstaller>=6'; or make dist)")
    out = ROOT / "build" / "dist-test"
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-dist.sh")],
        env={**os.environ, "PYTHON": sys.executable, "MGPU_DIST_DIR": str(out)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out
