"""Several masters on one PostgreSQL database: one leads, the others stand by and take over.

Real masters as processes (each its own state dir and port) on the `pg_url` database; every
process is stopped by process group (LocalCluster.stop)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from websockets.sync.client import connect

from helpers import BIN, LocalCluster, wait_for
from mgpu.agent.options import AgentOptions
from mgpu.master.store.outputtables import ONE_QUERY_ENV
from mgpu.master.store.pglink import backend_tag
from mgpu.protocol import Hello
from mgpu.testing import kill_leftover_jobs
from pgserver import PgServer
from stores import durable

SECRET = "correct horse battery staple, forty bytes"
DB_PASSWORD = "the-database-Passw0rd"
"""In every master's database file (the test server trusts loopback: never asked for), and
so in none of their logs or command lines."""


class Master:
    """One `mgpu master --database URL` as a process, with its own state dir."""

    def __init__(self, root: Path, name: str, pg_url: str, secret: str = SECRET) -> None:
        self.cluster = LocalCluster(root / name)
        self.cluster.root.mkdir(parents=True)
        self.name = name
        self.secret_file = self.cluster.root / "secret"
        self.secret_file.write_text(secret + "\n")
        self.secret_file.chmod(0o600)
        database = self.cluster.root / "database"
        database.write_text(f"{pg_url}?password={DB_PASSWORD}\n")
        database.chmod(0o600)
        argv = [str(BIN / "mgpu"), "master", "--port", str(self.cluster.port)]
        argv += ["--state-dir", str(self.cluster.state_dir), "--database-file", str(database)]
        argv += ["--cluster-secret-file", str(self.secret_file)]
        self.proc = self.cluster._spawn(argv, self.cluster.root / "master.log")
        self.address = self.cluster.address

    def get(self, path: str, token: str | None = None) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.cluster.port, timeout=5)
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            conn.request("GET", path, headers=headers)
            res = conn.getresponse()
            raw = res.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            return res.status, {k.lower(): v for k, v in res.getheaders()}, body
        finally:
            conn.close()

    def role(self) -> str | None:
        status, _, body = self.get("/healthz")
        return body.get("role") if status == 200 else None

    def leads(self) -> bool:
        return self.get("/readyz")[0] == 200

    def stands_by_for(self, leader: Master) -> bool:
        """A standby that has read the lease: a (re)started master says "standby" before
        it knows who leads, so the role alone is not enough.  `/readyz` says both."""
        body = self.get("/readyz")[2]
        return (
            isinstance(body, dict)
            and body.get("role") == "standby"
            and body.get("leader") == leader.address
        )

    def log(self) -> str:
        return self.cluster.log("master")

    def argv(self) -> list[str]:
        """The master's command line as `ps` shows it to every account."""
        raw = Path(f"/proc/{self.proc.pid}/cmdline").read_bytes()
        return [w.decode() for w in raw.split(b"\0") if w]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped one cannot stop
        self.cluster.stop()
        kill_leftover_jobs(self.cluster.root)


@pytest.fixture
def masters(tmp_path: Path, pg_url: str) -> Iterator[list[Master]]:
    started: list[Master] = []

    class Start(list[Master]):
        def start(self, name: str, secret: str = SECRET) -> Master:
            m = Master(tmp_path, name, pg_url, secret)
            started.append(m)
            return m

        def leader_and_standby(self) -> tuple[Master, Master]:
            """Master a, once it leads, and master b, once it stands by knowing that."""
            a = self.start("a")
            wait_for(a.leads, timeout=30, what="the first master to lead")
            b = self.start("b")
            wait_for(
                lambda: b.stands_by_for(a),
                timeout=30,
                what="the second to stand by, naming the first",
            )
            return a, b

    try:
        yield Start()  # type: ignore[misc]
    finally:
        for m in started:
            m.stop()


def test_two_masters_elect_one_leader_and_the_standby_points_at_it(masters: Any) -> None:
    a, b = masters.leader_and_standby()
    assert a.role() == "leader"

    status, _, body = b.get("/readyz")
    assert status == 503
    assert body["role"] == "standby" and body["leader"] == a.address

    # Any other route: 503, where the leader is, in the body and a header.
    token = (a.cluster.state_dir / "admin-token").read_text().strip()
    status, headers, body = b.get("/api/jobs", token)
    assert status == 503
    assert body == {
        "detail": f"this master is a standby; the leader is {a.address}",
        "role": "standby",
        "leader": a.address,
    }
    assert headers["x-mgpu-leader"] == a.address

    # A WebSocket (an agent's link) is refused at its handshake with the same 503.
    conn = http.client.HTTPConnection("127.0.0.1", b.cluster.port, timeout=5)
    conn.request(
        "GET",
        "/api/agent",
        headers={
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    )
    res = conn.getresponse()
    assert res.status == 503
    assert json.loads(res.read())["leader"] == a.address
    conn.close()

    # The leader's Welcome carries its lease generation (agents refuse older leaders).
    join = (a.cluster.state_dir / "join-token").read_text().strip()
    hello = Hello(node_id="probe", hostname="probe", ip="127.0.0.1", gpus=[], token=join)
    with connect(f"ws://{a.address}/api/agent", open_timeout=10) as ws:
        ws.send(hello.model_dump_json())
        welcome = json.loads(ws.recv(timeout=10))
    assert welcome["type"] == "welcome" and welcome["generation"] == 1

    # One identity: the same CA and tokens in both state dirs.
    for name in ("ca.crt", "ca.key", "join-token", "admin-token"):
        assert (a.cluster.state_dir / name).read_bytes() == (
            b.cluster.state_dir / name
        ).read_bytes()
        assert (b.cluster.state_dir / name).stat().st_mode & 0o777 in (0o600, 0o644)
    assert (b.cluster.state_dir / "ca.key").stat().st_mode & 0o077 == 0
    assert a.get("/api/ca")[2] == b.get("/api/ca")[2]


def test_the_standby_leads_soon_after_a_kill_9(masters: Any) -> None:
    a, b = masters.leader_and_standby()
    token = (a.cluster.state_dir / "admin-token").read_text().strip()
    assert a.get("/api/nodes", token)[0] == 200

    killed = time.monotonic()
    os.killpg(a.proc.pid, signal.SIGKILL)
    wait_for(b.leads, timeout=30, interval=0.05, what="the standby to lead")
    took = time.monotonic() - killed
    # The figure itself (2.2-2.8 s) is bench/failover.py's: on a loaded machine only that
    # nothing but the lease's TTL (2.5 s) and a few renew periods stood in the way.
    assert took < 15, f"the standby led {took:.1f} s after the kill"
    assert b.get("/healthz")[2]["generation"] == 2
    # The admin token the first master made works on the second.
    assert b.get("/api/nodes", token)[0] == 200


def test_a_leader_stopped_cleanly_hands_over_at_once(masters: Any) -> None:
    """SIGTERM: the leader writes its last, then gives the lease up; the standby need not
    wait for the TTL."""
    a, b = masters.leader_and_standby()
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(timeout=20) in (0, -signal.SIGTERM)  # uvicorn raises it again
    assert "lease released" in a.log()
    wait_for(b.leads, timeout=30, interval=0.05, what="the standby to lead")


def test_two_masters_wait_out_a_restart_of_postgresql(
    tmp_path: Path, pg_url: str, postgres: PgServer
) -> None:
    """The database restarts under a leader and a standby: afterwards one of them leads
    (the old leader renews, or the standby takes over), neither process died, and what
    was stored is there."""
    url = durable(pg_url)
    a, b = Master(tmp_path, "a", url), Master(tmp_path, "b", url)
    try:
        wait_for(lambda: a.leads() or b.leads(), timeout=30, what="a leader")
        wait_for(lambda: {a.role(), b.role()} == {"leader", "standby"}, timeout=30, what="roles")
        a.cluster._load_tokens()
        b.cluster._load_tokens()
        leader = a if a.leads() else b
        before = leader.cluster.client().submit("true", gpus=0)
        postgres.restart()

        def one_leads() -> Master | None:
            leading = [m for m in (a, b) if m.leads()]
            return leading[0] if len(leading) == 1 else None

        now = wait_for(one_leads, timeout=60, what="one leader after the restart")
        assert a.proc.poll() is None and b.proc.poll() is None
        client = now.cluster.client()
        assert client.show(before.id)["id"] == before.id
        after = client.submit("true", gpus=0)
        assert int(after.id) == int(before.id) + 1
    finally:
        a.stop()
        b.stop()


def test_a_master_with_another_secret_refuses_to_start(masters: Any) -> None:
    a = masters.start("a")
    wait_for(a.leads, timeout=30, what="the first master to lead")
    c = masters.start("c", secret="another secret, not the cluster's one")
    assert c.proc.wait(timeout=60) == 1
    lines = [line for line in c.log().splitlines() if line.strip()]
    assert lines[-1] == (
        "mgpu: error: the cluster secret does not open the cluster identity stored in the "
        "database: give this master the same --cluster-secret-file as the other masters"
    )
    assert "Traceback" not in c.log()


def test_a_secret_file_others_may_read_is_refused(tmp_path: Path, pg_url: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o644)
    argv = [str(BIN / "mgpu"), "master", "--state-dir", str(tmp_path / "m"), "--database"]
    argv += [pg_url, "--cluster-secret-file", str(secret)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"mgpu: error: permissions 0644 for {secret} are too open: the cluster secret file "
        f"must be readable by its owner only (chmod 600 {secret})"
    ]


def test_a_master_of_a_database_needs_the_secret(tmp_path: Path, pg_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MGPU_CLUSTER_SECRET"}
    res = subprocess.run(
        [str(BIN / "mgpu"), "master", "--state-dir", str(tmp_path / "m"), "--database", pg_url],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "mgpu: error: a master on a PostgreSQL database needs the cluster secret every master of "
        "the cluster shares: give --cluster-secret-file FILE or set $MGPU_CLUSTER_SECRET"
    ]


def test_a_deposed_leader_writes_and_sends_nothing_after_sigcont(masters: Any, pg_url: str) -> None:
    """SIGSTOP the leader until the standby leads, give it work meanwhile (a submit and a
    cancel wait in its socket's backlog), SIGCONT: it exits deposed, the database holds
    nothing it did, and its agent got neither a launch nor a kill."""
    a, b = masters.leader_and_standby()
    a.cluster._load_tokens()
    a.cluster.start_agent("n1", gpus=2)
    running = a.cluster.client().submit("sleep 600", gpus=1)
    wait_for(
        lambda: a.cluster.client().show(running.id)["state"] == "running", what="a running job"
    )
    spool = a.cluster.root / "agent-n1"
    wait_for(lambda: list(spool.glob("**/*.run")), what="its run record")

    os.killpg(a.proc.pid, signal.SIGSTOP)

    def submit() -> None:
        with contextlib.suppress(Exception):  # the deposed master never answers
            a.cluster.client().submit("echo ran-on-the-old-leader", gpus=1)

    def cancel() -> None:
        with contextlib.suppress(Exception):
            a.cluster.client().cancel(running.id)

    for work in (submit, cancel):
        threading.Thread(target=work, daemon=True).start()
    # Generous: a stop inside a write transaction costs the standby a lock wait more.
    wait_for(b.leads, timeout=30, interval=0.05, what="the standby to lead")
    os.killpg(a.proc.pid, signal.SIGCONT)
    # It replaces itself with a fresh start (the same pid), back as a standby.
    wait_for(lambda: "deposed: another master leads now" in a.log(), what="it to step down")
    wait_for(lambda: a.stands_by_for(b), timeout=30, what="the old leader to stand by")
    assert a.proc.poll() is None
    # Started again with the same argv: the database file's name, never the password.
    assert "--database-file" in a.argv() and DB_PASSWORD not in " ".join(a.argv())
    assert DB_PASSWORD not in a.log() + b.log()

    with psycopg.connect(pg_url) as db:
        (submitted,) = db.execute(
            "SELECT count(*) FROM jobs WHERE record LIKE '%ran-on-the-old-leader%'"
        ).fetchone()
        (state,) = db.execute("SELECT state FROM jobs WHERE id = %s", (running.id,)).fetchone()
        (cancels,) = db.execute("SELECT count(*) FROM events WHERE kind LIKE '%cancel%'").fetchone()
    assert (submitted, state, cancels) == (0, "running", 0)
    assert len(list(spool.glob("**/*.run"))) == 1, "the deposed leader launched a job"
    assert "ran-on-the-old-leader" not in a.cluster.log("n1")
    token = (a.cluster.state_dir / "admin-token").read_text().strip()
    status, _, body = b.get(f"/api/jobs/{running.id}", token)
    assert status == 200 and body["state"] == "running"  # the new leader keeps it running


HOLDING = """
SELECT a.pid, a.state, a.wait_event FROM pg_stat_activity a
  JOIN pg_locks l ON l.pid = a.pid JOIN pg_class c ON c.oid = l.relation
 WHERE c.relname = 'mgpu_lease' AND l.mode = 'RowShareLock' AND l.granted
   AND starts_with(a.application_name, %s)
"""
"""The leader's backends inside a write transaction past its fence's check (the lease row
held FOR KEY SHARE), with what each is doing."""
STALLED = (
    HOLDING
    + """
   AND (a.state = 'idle in transaction' OR a.wait_event = 'ClientRead')
   AND a.state_change < clock_timestamp() - interval '0.3 s'
"""
)
"""Those of them that have waited on the master for a while."""


def _waits_on_its_client(rows: list[Any]) -> bool:
    return any(state == "idle in transaction" or wait == "ClientRead" for _, state, wait in rows)


def _stop_holding_the_lease_row(leader: Master, db: Any, tag: str) -> tuple[Any, ...]:
    """SIGSTOP `leader` at a moment one of its backends holds the lease row in an open
    transaction and waits for the master (idle in transaction, or in the middle of a COPY
    or a pipeline), as found in pg_stat_activity; the backend's row, once it stays so
    while the leader is stopped.  Moments that do not hold are let go (SIGCONT)."""
    deadline = time.monotonic() + 120
    tries = 0
    while time.monotonic() < deadline:
        if not _waits_on_its_client(db.execute(HOLDING, (tag,)).fetchall()):
            continue
        tries += 1
        os.killpg(leader.proc.pid, signal.SIGSTOP)
        # Anything the master sent before it stopped is done within a moment: a backend
        # still waiting on it well after its last change of state is the stall.
        until = time.monotonic() + 3
        while time.monotonic() < until:
            rows = db.execute(STALLED, (tag,)).fetchall()
            if rows:
                return tuple(rows[0])
            if not db.execute(HOLDING, (tag,)).fetchall():
                break  # it committed: another moment
        os.killpg(leader.proc.pid, signal.SIGCONT)
    raise AssertionError(f"the leader never stopped in a write transaction ({tries} tries)")


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_a_leader_stopped_holding_the_lease_row_does_not_stop_the_standby(
    masters: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader is stopped inside a write transaction (its fence holds the lease row
    FOR KEY SHARE; caught in pg_stat_activity): the standby leads within seconds all the same,
    while the leader stays stopped, and once continued the old leader leads no more."""
    # A few output records go as one query, which never waits on the master holding the
    # row: every flush through COPY here, a transaction of several round trips.
    monkeypatch.setenv(ONE_QUERY_ENV, "0")
    a, b = masters.leader_and_standby()
    a.cluster._load_tokens()
    a.cluster.start_agent("n1", gpus=2)
    # A chatty job: its output is a write transaction of the leader's every 50 ms.
    chatty = a.cluster.client().submit("while :; do echo chatty; sleep 0.005; done", gpus=1)
    wait_for(lambda: a.cluster.client().show(chatty.id)["state"] == "running", what="running")

    with psycopg.connect(pg_url, autocommit=True) as db:
        (holder,) = db.execute("SELECT holder FROM mgpu_lease").fetchone()
        tag = backend_tag(holder)
        pid, state, wait = _stop_holding_the_lease_row(a, db, tag)
        stopped = time.monotonic()
        wait_for(b.leads, timeout=30, interval=0.05, what="the standby to lead")
        took = time.monotonic() - stopped
        assert _stopped(a.proc.pid), "the leader was continued before the standby led"
        assert db.execute(HOLDING, (tag,)).fetchall() == []  # its session was ended
    assert b.get("/healthz")[2]["generation"] == 2
    print(f"backend {pid} held the row ({state}, {wait}); the standby led {took:.1f} s later")

    os.killpg(a.proc.pid, signal.SIGCONT)
    wait_for(lambda: "deposed: another master leads now" in a.log(), what="it to step down")
    wait_for(lambda: a.stands_by_for(b), timeout=30, what="the old leader to stand by")
    assert not a.leads() and b.leads()


@pytest.mark.skipif(
    not hasattr(AgentOptions, "addresses"), reason="the agent dials one master (helper multiaddr)"
)
def test_a_running_job_goes_on_through_a_kill_9_of_the_leader(masters: Any) -> None:
    """The agent dials both masters: when the leader dies, it says hello to the new one,
    which takes its report within the grace: the job is neither killed, nor failed, nor
    run twice, and the node is never marked down."""
    a, b = masters.leader_and_standby()
    a.cluster._load_tokens()
    b.cluster._load_tokens()
    a.cluster.start_agent("n1", gpus=2, extra=["--master-host", f"{a.address},{b.address}"])
    script = "for i in $(seq 1 40); do echo line $i; sleep 0.2; done"
    job = a.cluster.client().submit(script, gpus=1)
    wait_for(lambda: a.cluster.client().show(job.id)["state"] == "running", what="running")
    time.sleep(1.0)  # a few lines out

    os.killpg(a.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(b.leads, timeout=30, interval=0.05, what="the standby to lead")
    assert time.monotonic() - killed < 15  # its lease's TTL, with a loaded machine's slack
    client = b.cluster.client()
    wait_for(
        lambda: any(n["node_id"] == "n1" and n["connected"] for n in client.nodes()),
        timeout=30,
        what="the agent to find the new leader",
    )
    shown = client.show(job.id)
    assert shown["state"] == "running", shown
    done = client.wait(job.id, timeout=60)
    assert done["state"] == "completed" and done["exit_code"] == 0, done
    shown = client.show(job.id)
    assert shown["restart_count"] == 0 and len(shown["attempts"]) == 1, shown  # ran once
    # Every line once, those written before the kill included (output in the database).
    lines = client.logs(job.id).splitlines()
    assert lines == [f"line {i}" for i in range(1, 41)], lines
    nodes = {n["node_id"]: n for n in client.nodes()}
    assert nodes["n1"]["state"] == "online"
    assert "lost" not in b.log()
