"""Test helpers: the local-cluster harness lives in the package (benchmarks use it too)."""

import os
import subprocess
import sys
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
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[1]


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
