"""Shares are enforced only with MPS, end to end on a simulated GPU: where the node has
`nvidia-cuda-mps-control` (a fake one on the agent's PATH), the agent starts its daemon for
a shared job and stops it when the job is gone; where it has none, the node says shares
are not enforced and the share job is told so in its output."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import LocalCluster, wait_for

CONFIG = "networking: {heartbeat_interval: 0.25, timeout: 10}\n"

FAKE_CONTROL = """#!/bin/sh
log="$(dirname "$0")/calls"
if [ "$1" = "-d" ]; then
    echo start >> "$log"
    mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
read -r command
[ "$command" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
echo "$command" >> "$log"
"""


def cluster(root: Path, path: str | None = None) -> LocalCluster:
    c = LocalCluster(root, CONFIG)
    c.start_master()
    saved = dict(c.env)
    c.env["CUDA_MPS_PIPE_DIRECTORY"] = str(root / "mps")  # the agent's environment
    c.env["CUDA_MPS_LOG_DIRECTORY"] = str(root / "mps-log")
    if path is not None:
        c.env["PATH"] = path
    c.start_agent("node001", gpus=1)
    c.env = saved
    return c


@pytest.fixture
def with_mps(tmp_path: Path) -> Iterator[LocalCluster]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(FAKE_CONTROL)
    script.chmod(0o755)
    c = cluster(tmp_path, f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def without_mps(tmp_path: Path) -> Iterator[LocalCluster]:
    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("this machine has NVIDIA MPS")
    c = cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def calls(c: LocalCluster) -> list[str]:
    log = c.root / "bin" / "calls"
    return log.read_text().split() if log.exists() else []


def shares_enforced(c: LocalCluster) -> bool | None:
    gpu = c.client().nodes()[0]["gpus"][0]
    return (gpu.get("telemetry") or {}).get("shares_enforced")


def test_the_agent_runs_mps_while_a_shared_job_runs(with_mps: LocalCluster) -> None:
    c = with_mps
    client = c.client()
    wait_for(lambda: shares_enforced(c) is True, what="the node saying shares are enforced")
    assert calls(c) == []  # no shared job yet: no daemon
    job = c.cli(
        "submit", "--gpu-share", "0.5", "echo pipe=$CUDA_MPS_PIPE_DIRECTORY", check=True
    ).stdout.strip()
    assert client.wait(job, timeout=30)["state"] == "completed"
    assert client.logs(job) == f"pipe={c.root / 'mps'}\n"  # and nothing said about shares
    assert calls(c)[0] == "start"
    wait_for(lambda: calls(c) == ["start", "quit"], what="the daemon stopped after the job")
    assert not (c.root / "mps" / "control").exists()
    assert "not enforced" not in c.cli("nodes", check=True).stdout


def test_a_node_without_mps_says_shares_are_not_enforced(without_mps: LocalCluster) -> None:
    c = without_mps
    client = c.client()
    wait_for(lambda: shares_enforced(c) is False, what="the node saying shares are not")
    assert "GPU shares not enforced (no MPS)" in c.cli("nodes", check=True).stdout
    job = c.cli("submit", "--gpu-share", "0.5", "sleep 30", check=True).stdout.strip()
    said = "mgpu: node001 does not hold GPU shares to their limits (no NVIDIA MPS there)"
    try:
        wait_for(lambda: said in client.logs(job), what="the share job told")
    finally:
        c.cli("cancel", job, check=True)
    assert client.logs(job).count(said) == 1
