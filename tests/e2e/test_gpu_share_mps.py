"""Shares are enforced only with MPS, end to end on a simulated GPU: where the node has
`nvidia-cuda-mps-control` (a fake one on the agent's PATH), the agent starts its daemon for
a shared job and stops it when the job is gone; where it has none, the node says shares
are not enforced and the share job is told so in its output."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import LocalCluster, wait_for

CONFIG = "networking: {heartbeat_interval: 0.25, timeout: 10}\n"

FAKE_CONTROL = r"""#!/bin/sh
# Each call logged one line; an MPS server is a real process (a sleep) of the agent's user,
# its pid in `servers`: the agent finds a server's user in /proc.
here="$(dirname "$0")"
log="$here/calls"
if [ "$1" = "-d" ]; then
    echo start >> "$log"
    mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
read -r command
set -- $command
case "$1" in
    start_server) sleep 300 </dev/null >/dev/null 2>&1 & echo $! >> "$here/servers" ;;
    get_server_list) cat "$here/servers" 2>/dev/null ;;
    quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
          for pid in $(cat "$here/servers" 2>/dev/null); do kill "$pid"; done
          : > "$here/servers" ;;
esac
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
        servers = bin_dir / "servers"  # the fake's "servers" that a failed test left
        for pid in servers.read_text().split() if servers.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)


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
    log = c.root / "bin" / "calls"
    # The job unsets its MPS variables (they are its own to change), and says it ran.
    script = (
        "unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; "
        f"echo job-spawned >> {log}; echo pipe=$CUDA_MPS_PIPE_DIRECTORY"
    )
    job = c.cli("submit", "--gpu-share", "0.5", script, check=True).stdout.strip()
    assert client.wait(job, timeout=30)["state"] == "completed"
    assert client.logs(job) == f"pipe={c.root / 'mps'}\n"  # and nothing said about shares
    wait_for(lambda: "quit" in calls(c), what="the daemon stopped after the job")
    memory = c.client().nodes()[0]["gpus"][0]["memory_mb"] // 2
    (pid,) = {line.split()[1] for line in log.read_text().splitlines() if line.startswith("set_")}
    # Before the job's process: the daemon, the user's server, the server held to the
    # job's grant (whatever the job does with its variables); the daemon quit after it.
    assert log.read_text().splitlines() == [
        "start",
        "get_server_list",
        f"start_server -uid {os.geteuid()}",
        "get_server_list",
        f"set_active_thread_percentage {pid} 50",
        f"set_device_pinned_mem_limit {pid} 0 {memory}M",
        "job-spawned",
        "quit",
    ]
    assert not (c.root / "mps" / "control").exists()
    assert "not enforced" not in c.cli("nodes", check=True).stdout


def test_a_node_without_mps_says_shares_are_not_enforced(without_mps: LocalCluster) -> None:
    c = without_mps
    client = c.client()
    wait_for(lambda: shares_enforced(c) is False, what="the node saying shares are not")
    assert "GPU shares not enforced (no MPS)" in c.cli("nodes", check=True).stdout
    job = c.cli("submit", "--gpu-share", "0.5", "sleep 30", check=True).stdout.strip()
    said = (
        "mgpu: node001 does not hold GPU shares to their limits "
        "(no nvidia-cuda-mps-control on this node)"
    )
    try:
        wait_for(lambda: said in client.logs(job), what="the share job told")
        assert_told_once(c, job, said)
    finally:
        c.cli("cancel", job, check=True)


def assert_told_once(c: LocalCluster, job: str, said: str) -> None:
    """The running share job says, in its output, `mgpu show` and its JSON, that its share
    is not held (once: its agent told it, the master's watch leaves it alone)."""
    client = c.client()
    wait_for(lambda: client.show(job)["share_enforced"] is False, what="the job's JSON")
    assert client.show(job)["allocation"][0]["share_enforced"] is False
    assert "share NOT enforced" in c.cli("show", job, check=True).stdout
    # The node says so too, and its watch (each heartbeat) does not tell the job again.
    wait_for(lambda: shares_enforced(c) is False, what="the node saying shares are not")
    deadline = time.monotonic() + 1.5  # six heartbeats (CONFIG)
    while time.monotonic() < deadline:
        assert client.logs(job).count(said) == 1, client.logs(job)
        time.sleep(0.1)


def test_a_daemon_that_cannot_start_is_said_by_the_node_and_the_job(tmp_path: Path) -> None:
    """`nvidia-cuda-mps-control -d` fails: the node said "enforced" (it has the binary) and
    ran the share without MPS, telling no one.  Now the node says what it achieved, and the
    job is told why and shows it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text("#!/bin/sh\necho 'no GPU for MPS' >&2\nexit 1\n")
    script.chmod(0o755)
    c = cluster(tmp_path, f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    try:
        client = c.client()
        wait_for(lambda: shares_enforced(c) is True, what="the node: it can start MPS")
        job = c.cli("submit", "--gpu-share", "0.5", "sleep 30", check=True).stdout.strip()
        said = "mgpu: node001 does not hold GPU shares to their limits ("
        try:
            wait_for(lambda: said in client.logs(job), what="the share job told")
            assert "-d failed" in client.logs(job)
            wait_for(lambda: shares_enforced(c) is False, what="the node saying shares are not")
            assert "GPU shares not enforced (no MPS)" in c.cli("nodes", check=True).stdout
            assert_told_once(c, job, said)
        finally:
            c.cli("cancel", job, check=True)
    finally:
        c.stop()
