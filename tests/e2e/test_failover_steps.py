"""Steps, allocations and job control through a failover (issue 32, item 7): the leader is
killed with `kill -9` while (a) an `srun` step runs inside a batch job, (b) `mgpu alloc`
holds an allocation with a step running, (c) a cancel is on its way to it; and (d) the
leader is cut from PostgreSQL for ~10 s while a long job and a step run.  Each step
finishes once, its output whole and its exit code given to its srun client; the allocation
lives on; the cancel takes effect once; after the cut heals the old leader leads no more.

The steps' tasks wait for a file the test makes after the failover, so each runs through
it whatever the machine's load.  (tests/hacluster.py starts the processes; each test
stops them by process group at its end.)"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from test_sruns import SRUN

from hacluster import HaCluster, leader_standby_and_agents
from helpers import BIN, kill_group, wait_for
from mgpu import Client

FAILOVER_S = 30.0
"""What a test allows a standby to lead in (the issue's target is 5 s: bench/failover.py
measures it; a loaded two-core machine gets slack here)."""


@pytest.fixture
def ha(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[HaCluster]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the clients' leader
    with leader_standby_and_agents(tmp_path, pg_url) as cluster:
        cluster.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
        yield cluster


def _env(ha: HaCluster, tmp_path: Path) -> dict[str, str]:
    """The cluster's environment with Slurm's `srun` (and `mgpu`) first on PATH."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    srun = shims / "srun"
    srun.write_text(SRUN)
    srun.chmod(0o755)
    return {**ha.env, "PATH": f"{shims}:{BIN}:{ha.env.get('PATH', '')}"}


def _task(marks: Path, go: Path, code: int) -> str:
    """A step's task: says it started (once per run), prints, waits for `go`, prints, ends
    with `code`."""
    return (
        f'echo "start $SLURM_PROCID" >> {marks}; echo before-$SLURM_PROCID; '
        f"while [ ! -e {go} ]; do sleep 0.1; done; "
        f"for i in 1 2 3 4 5; do echo after-$SLURM_PROCID-$i; done; exit {code}"
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _fail_over(ha: HaCluster) -> int:
    old = ha.leader()
    ha.kill_master(old)
    return ha.leader(timeout=FAILOVER_S, other_than=old)


def test_an_srun_step_in_a_batch_job_runs_on_through_a_kill_9(
    ha: HaCluster, tmp_path: Path
) -> None:
    marks, go = tmp_path / "marks", tmp_path / "go"
    script = f"#!/bin/sh\nsrun -l sh -c '{_task(marks, go, 7)}'\necho srun=$?\n"
    client = ha.client()
    slurm = {"batch": True}
    job = client.submit_script(
        script, name="batch", nodes=2, gpus_per_node=1, env=_env(ha, tmp_path), slurm=slurm
    )
    wait_for(
        lambda: all(f"{t}: before-{t}" in client.logs(job.id) for t in (0, 1)),
        timeout=60,
        what="both tasks running",
    )
    _fail_over(ha)
    go.touch()

    end = ha.client().wait(job.id, timeout=120)
    out = ha.client().logs(job.id)
    assert (end["state"], len(end["attempts"])) == ("completed", 1), out
    want = [f"{t}: before-{t}" for t in (0, 1)]
    want += [f"{t}: after-{t}-{i}" for t in (0, 1) for i in range(1, 6)]
    got = sorted(line for line in out.splitlines() if line[:1].isdigit())
    assert got == sorted(want), f"lost or repeated lines\n{out}\n{ha.logs_of_masters()}"
    assert "srun=7" in out.splitlines(), out  # the step's exit code, to its srun client
    assert sorted(_lines(marks)) == ["start 0", "start 1"]  # each task ran once


def test_an_allocation_and_its_step_live_through_a_kill_9(ha: HaCluster, tmp_path: Path) -> None:
    marks, go = tmp_path / "marks", tmp_path / "go"
    command = f"mgpu srun sh -c '{_task(marks, go, 5)}'; echo srun=$?"
    err = tmp_path / "alloc.err"
    got: list[str] = []
    with open(err, "wb") as err_file:
        alloc = subprocess.Popen(
            [str(BIN / "mgpu"), "alloc", "--gpus", "1", "--", "sh", "-c", command],
            stdout=subprocess.PIPE,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
            text=True,
            env=_env(ha, tmp_path),
            start_new_session=True,
        )
    assert alloc.stdout is not None
    reader = threading.Thread(target=lambda: got.extend(alloc.stdout or []), daemon=True)
    reader.start()
    try:
        wait_for(lambda: "before-\n" in got, timeout=60, what="the step running")
        _fail_over(ha)
        go.touch()
        assert alloc.wait(timeout=120) == 0, err.read_text()
        reader.join(timeout=10)
    finally:
        kill_group(alloc, timeout=5)
    # (mgpu srun inside an allocation sets no SLURM_PROCID: the task's id is empty)
    want = ["before-", *(f"after--{i}" for i in range(1, 6)), "srun=5"]
    assert [line.rstrip("\n") for line in got] == want, err.read_text()
    assert _lines(marks) == ["start "]  # ran once
    (job,) = ha.client().queue(all=True)["jobs"]
    assert (job["kind"], job["state"]) == ("allocation", "completed")


def _request_waiting(port: int) -> bool:
    """A connection to `port` holds bytes its server has not read (a frozen master's)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for row in f.readlines()[1:]:
                fields = row.split()
                local, state, queues = fields[1], fields[3], fields[4]
                here = int(local.rsplit(":", 1)[1], 16) == port and state == "01"
                if here and int(queues.split(":")[1], 16) > 0:
                    return True
    return False


def test_a_cancel_sent_as_the_leader_is_killed_takes_effect_once(
    ha: HaCluster, tmp_path: Path
) -> None:
    client = ha.client()
    job = client.submit("sleep 300", gpus=1)
    wait_for(lambda: client.show(job.id)["state"] == "running", timeout=60, what="running")
    old = ha.leader()
    proc = ha.masters[old]
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)  # frozen: it takes the cancel and answers nothing
    try:
        env = {**ha.env, "MGPU_MASTER": ha.address}  # the frozen leader first
        cancel = subprocess.Popen(
            [str(BIN / "mgpu"), "cancel", job.id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        wait_for(
            lambda: _request_waiting(ha.ports[old]) or cancel.poll() is not None,
            timeout=30,
            what="the cancel on its way to the frozen leader",
        )
        ha.kill_master(old)  # its answer is lost with it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
    try:
        out, err = cancel.communicate(timeout=120)
    finally:
        kill_group(cancel, timeout=5)
    assert cancel.returncode == 0, err
    assert job.id in out and "cancel" in out, out
    end = ha.client().wait(job.id, timeout=60)
    assert (end["state"], len(end["attempts"])) == ("cancelled", 1)
    cancels = [e for e in ha.client().audit() if e["kind"] == "cancel" and e["target"] == job.id]
    assert len(cancels) == 1, cancels  # done once, however many times it was sent


class Proxy:
    """A TCP proxy between one master and PostgreSQL that the test can cut: while cut it
    moves no byte either way and takes no new connection (a network cut: the master's
    connections hang, none is refused or reset), and after it heals it moves them on."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.open = threading.Event()
        self.open.set()
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: str) -> str:
        parts = urlsplit(database)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))

    def _accept(self) -> None:
        while not self.stopped.is_set():
            if not self.open.wait(0.1):
                continue
            ready, _, _ = select.select([self.server], [], [], 0.1)
            if not ready:
                continue
            try:
                near, _ = self.server.accept()
                far = socket.create_connection(self.target)
            except OSError:
                continue
            self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self.stopped.is_set():
            if not self.open.wait(0.1):
                continue  # cut: the bytes wait in the kernel's buffers
            try:
                ready, _, _ = select.select([src], [], [], 0.1)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.stopped.set()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


class CutCluster(HaCluster):
    """Each master reaches the database through its own Proxy."""

    proxies: list[Proxy]

    def start_master(self, i: int = 0, wait: bool = True) -> subprocess.Popen[bytes]:  # type: ignore[override]
        direct = self.database
        assert direct is not None
        self.database = self.proxies[i].url(direct)
        try:
            return super().start_master(i, wait)
        finally:
            self.database = direct


def test_a_leader_cut_from_postgresql_is_replaced_and_does_not_lead_again(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    where = urlsplit(pg_url)
    target = (where.hostname or "127.0.0.1", where.port or 5432)
    proxies = [Proxy(target), Proxy(target)]
    cluster = CutCluster(tmp_path, pg_url, masters=2)
    cluster.proxies = proxies
    cluster.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    try:
        cluster.start_master(0)
        assert cluster.leader(timeout=30) == 0
        cluster.start_master(1)
        for node in ("node001", "node002"):
            cluster.start_agent(node, gpus=2, wait=False)
        for node in ("node001", "node002"):
            cluster.wait_node(node, "online", timeout=60)
        cluster.supervise()  # a deposed master restarts itself: started again, as systemd
        _cut_while_a_job_and_a_step_run(cluster, tmp_path, proxies[0])
    finally:
        cluster.stop()
        for proxy in proxies:
            proxy.close()


def _cut_while_a_job_and_a_step_run(ha: CutCluster, tmp_path: Path, cut: Proxy) -> None:
    runs, marks, go = tmp_path / "runs", tmp_path / "marks", tmp_path / "go"
    client = ha.client()
    long = client.submit(f"echo $MGPU_JOB_ID >> {runs}; while [ ! -e {go} ]; do sleep 0.1; done")
    script = f"#!/bin/sh\nsrun sh -c '{_task(marks, go, 3)}'\necho srun=$?\n"
    batch = client.submit_script(
        script, name="batch", gpus=1, env=_env(ha, tmp_path), slurm={"batch": True}
    )
    wait_for(lambda: "before-0" in client.logs(batch.id), timeout=60, what="the step running")
    wait_for(lambda: _lines(runs), timeout=60, what="the long job running")

    cut.open.clear()  # master 0, the leader, is cut from the database
    cut_at = time.monotonic()
    try:
        new = ha.leader(timeout=FAILOVER_S + 30, other_than=0)
        assert new == 1
        _reads_reach_the_new_leader(ha)
        time.sleep(max(0.0, 10.0 - (time.monotonic() - cut_at)))  # the cut lasts ~10 s
    finally:
        cut.open.set()  # healed
    # The old leader, back on the database, finds the lease another's: it stands by.
    wait_for(lambda: ha.role(0) == "standby", timeout=60, what="master 0 standing by")
    assert ha.ready(1) and not ha.ready(0), ha.logs_of_masters()
    go.touch()

    client = ha.client()
    end = client.wait(batch.id, timeout=120)
    out = client.logs(batch.id)
    assert (end["state"], len(end["attempts"])) == ("completed", 1), out
    assert "srun=3" in out.splitlines(), f"{out}\n{ha.logs_of_masters()}"
    assert [line for line in out.splitlines() if line.startswith(("before", "after"))] == [
        "before-0",
        *(f"after-0-{i}" for i in range(1, 6)),
    ]
    assert _lines(marks) == ["start 0"]  # the step ran once
    done = client.wait(long.id, timeout=120)
    assert (done["state"], len(done["attempts"])) == ("completed", 1), done
    assert _lines(runs) == [long.id]  # the long job ran once
    assert ha.ready(1) and not ha.ready(0), "the old leader leads again"
    assert all(r["master"] == 0 for r in ha.restarts), ha.restarts


def _reads_reach_the_new_leader(ha: CutCluster) -> None:
    """The cut leader still answers from its memory (its nodes gone to the new leader),
    marked `X-Mgpu-Lease: lapsed`; a client that asks it first is sent to the new leader
    and sees both nodes online there."""
    token = ha.client().token
    request = urllib.request.Request(
        f"http://{ha.addresses[0]}/api/nodes", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers.get("X-Mgpu-Lease") == "lapsed"
    client = Client(f"http://{ha.addresses[0]},{ha.addresses[1]}", token=token)
    client._use(("127.0.0.1", int(ha.addresses[0].rpartition(":")[2])))  # asked first

    def both_online() -> bool:
        return sorted(n["state"] for n in client.nodes()) == ["online", "online"]

    wait_for(both_online, timeout=60, what="both nodes online, as the new leader sees them")
    assert client.address == ha.addresses[1]
