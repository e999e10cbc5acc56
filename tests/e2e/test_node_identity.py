"""Issue 11, item 4: node identity.  The join token lets a machine join; the node secret
it receives at its first join is what proves, from then on, which node it is.

Real masters and agents on loopback; raw hellos over a WebSocket where an agent would
never send them.  Every process a test starts is stopped by pid or process group.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from websockets.sync.client import connect

from helpers import BIN, LocalCluster, local_cluster, wait_for
from mgpu.master.security.nodeauth import NodeSecrets
from mgpu.master.store.sqlite import MEMORY, SqliteStore
from mgpu.protocol import PROTOCOL_VERSION, HelloError, parse_hello

GATE_WAIT = "while [ ! -e {gate} ]; do sleep 0.05; done; echo done on $MGPU_NODE_ID"


@pytest.fixture
def one(tmp_path: Path) -> Iterator[LocalCluster]:
    """A master and node001 (2 fake GPUs)."""
    with local_cluster(tmp_path, agents=1, gpus=2) as c:
        yield c


def agent_argv(c: LocalCluster, node_id: str, state_dir: Path) -> list[str]:
    argv = [str(BIN / "mgpu"), "node", "--node-id", node_id, "--fake-gpus", "1"]
    return [*argv, "--master-port", str(c.port), "--state-dir", str(state_dir)]


def refused_agent(c: LocalCluster, node_id: str, state_dir: Path) -> str:
    """Run an agent that the master must refuse: it exits; its error line is returned."""
    res = subprocess.run(
        agent_argv(c, node_id, state_dir), capture_output=True, text=True, env=c.env, timeout=60
    )
    assert res.returncode != 0, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("mgpu: error: the master refused this node: "), res.stderr
    return last


def node(c: LocalCluster, node_id: str) -> dict[str, Any] | None:
    return next((n for n in c.client().nodes() if n["node_id"] == node_id), None)


def connected(c: LocalCluster, node_id: str) -> bool:
    n = node(c, node_id)
    return n is not None and bool(n["connected"])


def secret_file(state_dir: Path, node_id: str) -> Path:
    return state_dir / f"node-{node_id}" / "node-secret"


def gated_job(c: LocalCluster, gate: Path, **options: Any) -> tuple[str, int]:
    job_id = c.client().submit(GATE_WAIT.format(gate=gate), **options).id
    job = wait_for(
        lambda: (
            (j := c.client().show(job_id))["state"] == "running" and j["allocation"][0]["pid"] and j
        ),
        what="the job running",
    )
    return job_id, int(job["allocation"][0]["pid"])


def wait_end(c: LocalCluster, job_id: str) -> dict[str, Any]:
    return c.client().wait(job_id, timeout=30)


# ---- an impostor never disturbs the node it names ---------------------------------------


def test_impostor_is_refused_and_the_real_node_keeps_its_job(one: LocalCluster) -> None:
    c = one
    gate = c.root / "gate"
    job_id, pid = gated_job(c, gate, gpus=1)
    before = node(c, "node001")
    assert before is not None
    # Same join token, same node id, its own state dir: no secret, then a wrong one.
    line = refused_agent(c, "node001", c.root / "impostor")
    assert "node node001 has joined before and this agent has no node secret for it" in line
    assert "`mgpu node remove node001`" in line
    wrong = c.root / "impostor2"
    secret_file(wrong, "node001").parent.mkdir(parents=True)
    secret_file(wrong, "node001").write_text("mgpunode_guessed\n")
    assert "a wrong node secret" in refused_agent(c, "node001", wrong)
    # The real node never noticed: still online on its first connection, its job running.
    after = node(c, "node001")
    assert after is not None and after["state"] == "online" and after["connected"]
    assert after["ip"] == before["ip"] and len(after["gpus"]) == 2
    assert c.agents["node001"].poll() is None
    assert psutil.pid_exists(pid) and c.client().show(job_id)["state"] == "running"
    gate.touch()
    job = wait_end(c, job_id)
    assert job["state"] == "completed" and job["retries"] == 0, job
    assert len(job["attempts"]) == 1
    (refused,) = [e for e in c.client().audit() if e["kind"] == "agent_refused"]
    assert refused["actor"] == "node001" and refused["detail"].startswith("2 refused hellos")
    assert "no node secret" in refused["detail"] and "a wrong node secret" in refused["detail"]


def test_made_up_id_joins_once_then_belongs_to_its_first_agent(one: LocalCluster) -> None:
    c = one
    first = c.root / "ghost-a"
    c.agents["ghost"] = c._spawn(agent_argv(c, "ghost", first), c.root / "ghost.log")
    c.wait_node("ghost", "online")  # a new id is allowed with the join token
    line = refused_agent(c, "ghost", c.root / "ghost-b")
    assert "node ghost has joined before" in line
    assert c.agents["ghost"].poll() is None
    ghost = node(c, "ghost")
    assert ghost is not None and ghost["connected"] and ghost["state"] == "online"


def test_secret_is_private_and_the_master_keeps_only_its_hash(cluster: LocalCluster) -> None:
    agent_dir = cluster.root / "agent-node001"
    path = secret_file(agent_dir, "node001")
    secret = wait_for(lambda: path.exists() and path.read_text().strip(), what="the secret")
    assert secret.startswith("mgpunode_") and len(secret) >= 40
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    db = sqlite3.connect(cluster.state_dir / "mgpu.db")
    try:
        rows = dict(db.execute("SELECT node_id, hash FROM node_secrets").fetchall())
    finally:
        db.close()
    assert rows["node001"] == hashlib.sha256(secret.encode()).hexdigest()
    assert rows["node002"] != rows["node001"]
    for name in ("mgpu.db", "mgpu.db-wal"):
        file = cluster.state_dir / name
        if file.exists():
            assert secret.encode() not in file.read_bytes()


# ---- the node itself always gets back in --------------------------------------------------


def test_agent_killed_and_restarted_gets_back_in_and_readopts(one: LocalCluster) -> None:
    c = one
    gate = c.root / "gate"
    job_id, pid = gated_job(c, gate, gpus=1)
    os.killpg(c.agents["node001"].pid, signal.SIGKILL)
    c.agents["node001"].wait(timeout=10)
    # At once, whether or not the master has seen the old connection end yet.
    c.start_agent("node001", gpus=2)
    assert psutil.pid_exists(pid)
    gate.touch()
    job = wait_end(c, job_id)
    assert job["state"] == "completed" and job["retries"] == 0, job
    assert len(job["attempts"]) == 1
    assert c.client().logs(job_id) == "done on node001\n"


def test_proven_owner_replaces_a_connection_that_still_looks_open(one: LocalCluster) -> None:
    c = one
    gate = c.root / "gate"
    job_id, pid = gated_job(c, gate, gpus=1)
    old = c.agents["node001"]
    os.kill(old.pid, signal.SIGSTOP)  # hangs with its connection open, like a dead machine
    try:
        # The node's state dir, moved to a new agent process (a machine back from a crash).
        moved = c.root / "agent-node001-moved"
        shutil.copytree(c.root / "agent-node001", moved)
        assert connected(c, "node001")
        log = c.root / "moved.log"
        c.agents["moved"] = c._spawn(agent_argv(c, "node001", moved), log)
        wait_for(lambda: "connected to the master" in log.read_text(), what="moved agent in")
        assert "node node001 proved its secret: its older connection is dropped" in c.log("master")
        ghost_line = refused_agent(c, "node001", c.root / "impostor")
        assert "has joined before" in ghost_line  # an impostor still cannot
        gate.touch()
        # Only the new agent can report the end: the old one is stopped.
        job = wait_end(c, job_id)
        assert job["state"] == "completed" and job["retries"] == 0, job
        assert job["allocation"][0]["pid"] == pid
        assert c.client().logs(job_id) == "done on node001\n"
        assert node(c, "node001")["state"] == "online"  # type: ignore[index]
    finally:
        os.killpg(old.pid, signal.SIGKILL)
        old.wait(timeout=10)


def test_nodes_from_before_secrets_get_one_at_their_next_join(one: LocalCluster) -> None:
    c = one
    assert c.master is not None
    for proc in (c.agents["node001"], c.master):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # As a database and agent state dir written before node secrets existed.
    db = sqlite3.connect(c.state_dir / "mgpu.db")
    with db:
        db.execute("DROP TABLE node_secrets")
        db.execute("DROP TABLE schema_version")  # nor schema versions
    db.close()
    path = secret_file(c.root / "agent-node001", "node001")
    path.unlink(missing_ok=True)  # (if the agent had time to write it)
    c.start_master()
    c.start_agent("node001", gpus=2)
    wait_for(lambda: path.read_text().startswith("mgpunode_"), what="a secret issued")
    assert "has joined before" in refused_agent(c, "node001", c.root / "impostor")


# ---- mgpu node remove ---------------------------------------------------------------------


def test_node_remove(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=2, gpus=2) as c:
        gate = c.root / "gate"
        job_id, _ = gated_job(c, gate, gpus=1, nodelist="node002")
        user = c.client().create_token("daemon")["token"]
        res = c.cli("--token", user, "node", "remove", "node002")
        assert res.returncode != 0 and "needs an admin token" in res.stderr
        # Connected and running a job: refused, nothing changes.
        res = c.cli("node", "remove", "node002")
        assert res.returncode != 0
        assert res.stderr.count("\n") == 1, res.stderr
        assert "node node002 is connected and runs 1 job(s)" in res.stderr
        assert connected(c, "node002")
        # Its agent gone for good: the node can be forgotten.
        os.killpg(c.agents["node002"].pid, signal.SIGKILL)
        c.agents["node002"].wait(timeout=10)
        wait_for(lambda: not connected(c, "node002"), what="node002 disconnected")
        res = c.cli("node", "remove", "node002", check=True)
        assert res.stdout == f"removed node002; requeued {job_id}\n"
        assert node(c, "node002") is None
        job = c.client().show(job_id)
        assert job["state"] == "queued" and job["retries"] == 1, job
        assert job["attempts"][0]["end_reason"] == "node node002 removed"
        (event,) = [e for e in c.client().audit() if e["kind"] == "node_remove"]
        assert event["target"] == "node002" and job_id in event["detail"]
        # A fresh agent (a new state dir, no secret) joins under that id and runs the job.
        fresh = c.root / "agent-node002-new"
        c.agents["fresh"] = c._spawn(agent_argv(c, "node002", fresh), c.root / "fresh.log")
        c.wait_node("node002", "online")
        gate.touch()
        assert wait_end(c, job_id)["state"] == "completed"
        # An idle node whose agent still runs is forgotten, and joins again as a new node.
        path = secret_file(c.root / "agent-node001", "node001")
        old_secret = path.read_text()
        assert c.client().remove_node("node001") == {"removed": "node001", "requeued": []}
        c.wait_node("node001", "online")
        wait_for(lambda: path.read_text() != old_secret, what="node001's new secret")
        res = c.cli("node", "remove", "nosuch")
        assert res.returncode != 0 and "no such job or node: nosuch" in res.stderr


# ---- hello fields -------------------------------------------------------------------------


def hello(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "node_id": "raw001",
        "hostname": "h",
        "ip": "127.0.0.1",
        "gpus": [{"index": 0, "name": "g", "memory_mb": 1}],
    }
    return {**base, **fields}


def say_hello(c: LocalCluster, message: dict[str, Any] | str) -> dict[str, Any]:
    """Send one hello over a raw agent WebSocket; the master's first answer."""
    with connect(f"ws://{c.address}/api/agent", open_timeout=10) as ws:
        ws.send(message if isinstance(message, str) else json.dumps(message))
        return dict(json.loads(ws.recv(timeout=30)))


GPU = {"name": "g", "memory_mb": 1}


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        ({"gpus": [{"index": 0, **GPU}, {"index": 0, **GPU}]}, "gpus lists GPU index 0 twice"),
        ({"hostname": "h" * 10000}, "hostname is 10000 characters long; 1 to 253 are"),
        ({"node_id": "../etc"}, "node_id '../etc' is not valid"),
        ({"node_id": "n" * 65}, "is 65 characters long; at most 64"),
        ({"gpus": [{"index": i, **GPU} for i in range(65)]}, "gpus lists 65 GPUs; at most 64"),
        ({"gpus": [{"index": 0, "name": "g", "memory_mb": -1}]}, "gpus.0.memory_mb should be"),
        ({"ip": "1.2.3.4\n"}, "ip '1.2.3.4\\n' is not an IP address"),
        ({"hostname": "h slots=64"}, "hostname 'h slots=64' is not a host name"),
        ({"features": ["x" * 65]}, "features is 65 characters long"),
        ({"running": [{"job_id": "j", "epoch": 1}] * 10001}, "running lists 10001 runs"),
        ({"hostname": None}, "hostname should be a valid string"),
    ],
)
def test_invalid_hello_fields_are_named_in_one_sentence(
    fields: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(HelloError) as err:
        parse_hello(json.dumps(hello(**fields)))
    text = str(err.value)
    assert text.startswith("invalid hello: ") and sentence in text and "\n" not in text


def test_master_refuses_bad_hellos_and_throttles_bad_secrets(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=0) as c:
        token = c.join_token
        for fields, sentence in (
            ({"gpus": [{"index": 1, **GPU}, {"index": 1, **GPU}]}, "gpus lists GPU index 1 twice"),
            ({"hostname": "h" * 10000}, "hostname is 10000 characters long"),
            ({"node_id": "bad id"}, "node_id 'bad id' is not valid"),
        ):
            reply = say_hello(c, hello(token=token, **fields))
            assert reply["type"] == "refused" and sentence in reply["reason"], reply
        reply = say_hello(c, "not json")
        assert reply == {
            "type": "refused",
            "reason": "the first message must be hello (it is not JSON)",
        }
        assert c.client().nodes() == []  # nothing half-stored
        # A raw hello that is valid joins and is handed its secret, once.
        welcome = say_hello(c, hello(token=token))
        assert welcome["type"] == "welcome" and welcome["node_secret"].startswith("mgpunode_")
        again = say_hello(c, hello(token=token, node_secret=welcome["node_secret"]))
        assert again["type"] == "welcome" and again["node_secret"] is None
        # Guessing the secret: three free tries, then 0.05 s doubling, as for bad tokens.
        times = []
        for _ in range(7):
            t0 = time.monotonic()
            reply = say_hello(c, hello(token=token, node_secret="mgpunode_guess"))
            times.append(time.monotonic() - t0)
            assert reply["type"] == "refused" and "a wrong node secret" in reply["reason"]
        assert times[-1] >= 0.4, times
        assert "Traceback" not in c.log("master")


def test_a_peer_that_never_says_hello_or_says_too_much_is_let_go(tmp_path: Path) -> None:
    """The agent port is open to anyone who reaches it: a connection that sends nothing is
    refused and closed after HELLO_TIMEOUT (10 s), a hello over HELLO_LIMIT (4 MiB) is
    refused at once; the master stays healthy."""
    from mgpu.master.http.agents import HELLO_LIMIT, HELLO_TIMEOUT

    with local_cluster(tmp_path, agents=0) as c:
        with connect(f"ws://{c.address}/api/agent", open_timeout=10) as silent:
            opened = time.monotonic()
            huge = json.dumps(hello(token=c.join_token, pad="x" * HELLO_LIMIT))
            reply = say_hello(c, huge)
            assert reply["type"] == "refused" and "characters long; at most" in reply["reason"]
            answer = json.loads(silent.recv(timeout=HELLO_TIMEOUT + 20))
            waited = time.monotonic() - opened
        assert answer == {"type": "refused", "reason": f"no hello within {HELLO_TIMEOUT:g} s"}
        assert HELLO_TIMEOUT - 1 < waited < HELLO_TIMEOUT + 20
        assert c.client().nodes() == []
        assert "Traceback" not in c.log("master")


# ---- the secret store alone ---------------------------------------------------------------


def test_node_secret_verdicts() -> None:
    secrets = NodeSecrets(SqliteStore(MEMORY))
    first = secrets.verify("n1", None, connected=False)
    assert first.refusal is None and first.new_secret and not first.replaces_link
    assert secrets.known("n1")
    # A second agent for a node without a secret that is connected: refused, not issued.
    other = NodeSecrets(SqliteStore(MEMORY))
    assert other.verify("n2", None, connected=True).refusal == "node n2 is already connected"
    assert not other.known("n2")
    proven = secrets.verify("n1", first.new_secret, connected=True)
    assert proven.refusal is None and proven.replaces_link and proven.new_secret is None
    for given in (None, "", "mgpunode_x", first.new_secret + "x"):
        verdict = secrets.verify("n1", given, connected=False)
        assert verdict.refusal and verdict.bad_secret and verdict.new_secret is None
    assert secrets.forget("n1") and not secrets.known("n1")
    assert secrets.verify("n1", first.new_secret, connected=False).new_secret  # afresh
