"""Several master addresses (issue 24): an agent and clients given a dead master first and a
live one second find the live one; `mgpu logs -f` goes on through a master's restart (the
stand-in for a failover: the master keeps its state) without losing or repeating a line.

Real master and agent on loopback (LocalCluster).  The dead address is a bound socket that
does not listen: connections to it are refused.  Every wait is on an observable condition
with a deadline; every process started is killed by its process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import BIN, LocalCluster, kill_group, wait_for
from mgpu import Client

CONFIG = """
networking:
  heartbeat_interval: 0.2
  timeout: 8
"""


@pytest.fixture
def dead_port() -> Iterator[int]:
    with socket.socket() as s:  # bound, not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.fixture
def two(tmp_path: Path, dead_port: int) -> Iterator[tuple[LocalCluster, str]]:
    """A master and one agent that was told a dead master first; and the client's
    address list, the dead one first."""
    c = LocalCluster(tmp_path, CONFIG)
    try:
        c.start_master()
        masters = f"127.0.0.1:{dead_port},{c.address}"
        c.start_agent("node001", gpus=2, extra=["--master-host", masters])
        yield c, masters
    finally:
        c.stop()


def gate(path: Path) -> str:
    return f"while [ ! -e {path} ]; do sleep 0.05; done;"


def test_agent_and_clients_skip_a_dead_master(two: tuple[LocalCluster, str]) -> None:
    c, masters = two
    env = {**c.env, "MGPU_MASTER": masters}
    res = subprocess.run(
        [str(BIN / "mgpu"), "queue"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    client = Client(masters, token=c.admin_token)
    job = client.submit('echo "$MGPU_MASTER"', gpus=1)
    assert client.wait(job.id, timeout=30)["state"] == "completed"
    assert client.address == c.address  # the leader, found and remembered
    # The job is told every master the agent knows, the one it is connected to first.
    dead = masters.split(",")[0]
    assert client.logs(job.id) == f"{c.address},{dead}\n"


def test_logs_follow_resumes_across_a_master_restart(
    two: tuple[LocalCluster, str], tmp_path: Path
) -> None:
    c, masters = two
    a, b = tmp_path / "a", tmp_path / "b"
    script = "for i in 1 2 3 4 5; do echo line $i; done;" + gate(a)
    script += "for i in 6 7 8 9 10; do echo line $i; done;" + gate(b)
    script += "for i in 11 12 13 14 15; do echo line $i; done"
    client = Client(masters, token=c.admin_token)
    job = client.submit(script, gpus=1)
    out = tmp_path / "follow.out"
    env = {**c.env, "MGPU_MASTER": masters}
    with open(out, "wb") as f:
        follower = subprocess.Popen(
            [str(BIN / "mgpu"), "logs", "-f", job.id],
            stdout=f,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    try:
        wait_for(lambda: out.read_text().count("\n") == 5, timeout=30, what="lines 1-5")
        assert c.master is not None
        os.killpg(c.master.pid, signal.SIGKILL)  # the connection drops mid-stream
        c.master.wait(timeout=10)
        a.touch()  # lines 6-10 are written while no master runs
        c.start_master()
        c.wait_node("node001", "online")
        b.touch()
        _, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
    finally:
        kill_group(follower)
    assert out.read_text() == "".join(f"line {i}\n" for i in range(1, 16))
    assert Client(masters, token=c.admin_token).wait(job.id, timeout=30)["state"] == "completed"
