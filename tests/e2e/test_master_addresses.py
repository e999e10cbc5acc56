"""Several master addresses (issue 24): an agent and clients given a dead master first and a
live one second find the live one; `mgpu logs -f` goes on through a master's restart (the
stand-in for a failover: the master keeps its state) without losing or repeating a line.

Real master and agent on loopback (LocalCluster).  The dead address is a bound socket that
does not listen: connections to it are refused.  Every wait is on an observable condition
with a deadline; every process started is killed by its process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from factories import http_server
from helpers import BIN, LocalCluster, kill_group, wait_for
from mgpu import Client, MgpuError

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


def standby_for(leader: str) -> type[BaseHTTPRequestHandler]:
    """A stand-in standby master: every request (a WebSocket handshake too) answered 503
    with the contract's JSON and header, naming `leader`."""

    class Standby(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _refuse(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(
                {
                    "detail": f"this master is a standby; the leader is {leader}",
                    "role": "standby",
                    "leader": leader,
                }
            ).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Mgpu-Leader", leader)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _refuse

        def log_message(self, *args: Any) -> None:
            pass

    return Standby


def test_a_standby_sends_agents_and_clients_to_the_leader(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, CONFIG)
    try:
        c.start_master()
        with http_server(standby_for(c.address)) as stand:
            # The standby first: its hint is followed to a listed master only.
            masters = f"{stand},{c.address}"
            c.start_agent("node001", gpus=1, extra=["--master-host", masters])
            env = {**c.env, "MGPU_MASTER": masters}
            res = subprocess.run(
                [str(BIN / "mgpu"), "submit", "--gpus", "1", "echo hi"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert res.returncode == 0, res.stderr
            client = Client(masters, token=c.admin_token)
            jobs = client.queue(all=True)["jobs"]
            assert len(jobs) == 1  # submitted once
            done = client.wait(jobs[0]["id"], timeout=30)
            assert done["state"] == "completed", (done, client.logs(done["id"]))
            assert client.address == c.address
    finally:
        c.stop()


SRUN = f"""#!{sys.executable}
import sys
import time
from mgpu.client.steps import StepOptions, run_step
sys.exit(run_step(sys.argv[1:], StepOptions()))
"""


def _srun_env(c: LocalCluster, tmp_path: Path) -> dict[str, str]:
    """The cluster's environment with the `srun` stand-in (and `mgpu`) first on PATH."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "srun").write_text(SRUN)
    (shims / "srun").chmod(0o755)
    return {**c.env, "PATH": f"{shims}:{BIN}:{c.env.get('PATH', '')}"}


def test_a_step_output_resumes_from_each_tasks_count(tmp_path: Path) -> None:
    """`srun` inside a job reconnects with how many records of each task it has
    (`/api/sruns/ID/output?since=N,M`): the master sends only those after them."""
    c = LocalCluster(tmp_path, CONFIG)
    try:
        c.start_master()
        c.start_agent("node001", gpus=1)
        c.start_agent("node002", gpus=1)
        gate = tmp_path / "gate"
        env = _srun_env(c, tmp_path)
        script = "#!/bin/sh\nsrun sh -c 'echo a$SLURM_PROCID; echo b$SLURM_PROCID'\n"
        script += f"while [ ! -e {gate} ]; do sleep 0.05; done\n"
        client = c.client()
        job = client.submit_script(script, nodes=2, gpus_per_node=1, env=env, slurm={"batch": True})
        path = f"/api/sruns/{job.id}.s1/output"

        def step_output() -> list[dict[str, Any]] | None:
            try:
                return list(client._stream_path(path, 30))  # to the step's end
            except MgpuError:  # not started yet
                return None

        full = wait_for(step_output, timeout=60, what="the step's output")
        ours = [r for r in full if r.get("t") == 0]
        theirs = [r for r in full if r.get("t") == 1]
        assert ours and theirs and full[-1]["end"], full
        assert "".join(r["d"] for r in theirs) == "a1\nb1\n"
        rest = list(client._stream_path(f"{path}?since={len(ours)},0", 30))
        assert rest == [*theirs, full[-1]]
        with pytest.raises(MgpuError, match="one count of records per task"):
            list(client._stream_path(f"{path}?since=1,2,3", 30))
        gate.touch()
        assert client.wait(job.id, timeout=30)["state"] == "completed"
    finally:
        c.stop()


def test_a_terminal_goes_on_through_a_master_restart(
    two: tuple[LocalCluster, str], tmp_path: Path
) -> None:
    """`mgpu srun --pty` with two addresses: the master is killed and restarted while the
    program waits for a line; the client attaches again (asking for the output after what
    it showed), the program goes on, and nothing it printed is shown twice."""
    from test_terminals import Term

    c, masters = two
    env = {**c.env, "MGPU_MASTER": masters, "PATH": f"{BIN}:{c.env.get('PATH', '')}"}
    program = "echo ready; read x; echo got=$x; read y; echo got2=$y"
    t = Term(env, "srun", "--pty", "--gpus", "1", "--", "sh", "-c", program)
    try:
        t.expect(r"ready")
        t.type(b"one\r")
        t.expect(r"got=one")
        assert c.master is not None
        os.killpg(c.master.pid, signal.SIGKILL)
        c.master.wait(timeout=10)
        t.expect(r"lost the connection to the master")
        c.start_master()
        c.wait_node("node001", "online")
        t.expect(r"reconnected")
        t.type(b"two\r")
        t.expect(r"got2=two")
        assert t.wait() == 0
        assert t.restored()
    finally:
        t.close()
    assert t.seen.count(b"got=one") == 1 and t.seen.count(b"ready") == 1, t.seen


def test_the_agent_leaves_a_stopped_master(two: tuple[LocalCluster, str]) -> None:
    """A stopped master (SIGSTOP) keeps the TCP link open and says nothing: with several
    masters the agent pings, so it leaves within seconds to look for a leader (and comes
    back once the master runs again)."""
    c, _ = two
    assert c.master is not None
    os.killpg(c.master.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: "lost" in c.log("node001"), timeout=30, what="the agent to leave")
        # A ping each 1 s, 3 s for its pong, 1 s to close: about 5 s (never, without pings).
        assert time.monotonic() - stopped < 20
    finally:
        os.killpg(c.master.pid, signal.SIGCONT)
    before = c.log("node001").count("connected to the master")
    wait_for(
        lambda: c.log("node001").count("connected to the master") > before,
        timeout=30,
        what="the agent back",
    )
    c.wait_node("node001", "online")


def test_srun_goes_on_through_its_only_masters_restart(tmp_path: Path) -> None:
    """A cluster with one master (no $MGPU_FAILOVER_WAIT): the master is killed while a
    batch job's `srun` step runs and stays down a few seconds (longer than three quick
    reopens: srun gave up then, and the batch script saw it fail).  srun waits for it,
    follows the step again, prints its output once and exits with the step's code."""
    c = LocalCluster(tmp_path, CONFIG)
    try:
        c.start_master()
        c.start_agent("node001", gpus=1)
        go = tmp_path / "go"
        env = _srun_env(c, tmp_path)
        env.pop("MGPU_FAILOVER_WAIT", None)
        script = (
            "#!/bin/sh\n"
            f"srun sh -c 'echo step-up; {gate(go)} echo step-done; exit 5'\n"
            'echo "srun=$?"\n'
        )
        client = c.client()
        job = client.submit_script(script, gpus=1, env=env, slurm={"batch": True})
        wait_for(lambda: "step-up" in client.logs(job.id), timeout=60, what="the step")
        assert c.master is not None
        os.killpg(c.master.pid, signal.SIGKILL)
        c.master.wait(timeout=10)
        time.sleep(6)  # the fault: the master stays down, not a wait for an event
        c.start_master()
        c.wait_node("node001", "online")
        go.touch()
        client = c.client()
        end = client.wait(job.id, timeout=60)
        out = client.logs(job.id)
        assert end["state"] == "completed", (end, out)
        lines = out.splitlines()
        assert lines[:2] == ["step-up", "step-done"] and lines[-1] == "srun=5", out
        assert "Exited with exit code 5" in lines[2] and len(lines) == 4, out
    finally:
        c.stop()
