"""Several masters on one PostgreSQL database and agents given every master's address, as
real processes on loopback: for the failover tests (tests/e2e/test_failover.py) and
bench/failover.py.  Written against CONTRACT.md's round-3 options: `mgpu master --database
URL --cluster-secret-file FILE`, `mgpu node --master-host A,B`, `MGPU_MASTER=A,B`, and
`/healthz` / `/readyz` answering with the master's role.

Every process is started in its own session and stopped by process group (LocalCluster's
way); killing a master is `kill -9` of its process group (its pid is the group's).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mgpu.testing import BIN, LocalCluster, free_port, wait_for


def get_json(address: str, path: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of a plain GET to a master over loopback HTTP; (0, {}) when it
    does not answer."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read() or b"{}")
        except ValueError:
            body = {}
        return e.code, body
    except (OSError, ValueError):
        return 0, {}


class HaCluster(LocalCluster):
    """`masters` masters sharing `database`; `address` (and `$MGPU_MASTER` for the CLI) is
    every master's address, comma-separated, so clients find the leader themselves."""

    def __init__(
        self, root: Path, database: str, masters: int = 2, config: str | None = None
    ) -> None:
        super().__init__(root, config, database)
        self.ports = [self.port] + [free_port() for _ in range(masters - 1)]
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]
        self.address = ",".join(self.addresses)
        self.env["MGPU_MASTER"] = self.address
        self.env.pop("MGPU_CLUSTER_SECRET", None)
        self.secret_file = root / "cluster-secret"
        self.secret_file.write_text(secrets.token_hex(32) + "\n")
        self.secret_file.chmod(0o600)
        self.masters: list[subprocess.Popen[bytes] | None] = [None] * masters
        self.restarts: list[dict[str, Any]] = []
        """What the supervisor did: each master it started again, when, and its exit status."""
        self._supervising = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._held: set[int] = set()

    def state_dir_of(self, i: int) -> Path:
        return self.root / f"master{i}"

    def start_master(self, i: int = 0, wait: bool = True) -> subprocess.Popen[bytes]:  # type: ignore[override]
        """Start master `i` (again, after a kill: same state dir and port).  `wait`: until
        it answers `/healthz` (as leader or standby) and its tokens are in its state dir."""
        argv = [str(BIN / "mgpu"), "master", "--port", str(self.ports[i])]
        argv += ["--state-dir", str(self.state_dir_of(i))]
        assert self.database is not None
        argv += ["--database", self.database, "--cluster-secret-file", str(self.secret_file)]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        proc = self._spawn(argv, self.root / f"master{i}.log")
        self.masters[i] = proc
        self._held.discard(i)
        self.master = proc
        if wait:
            self.state_dir = self.state_dir_of(i)
            wait_for(self._load_tokens, timeout=60, what=f"master {i}'s tokens")
            wait_for(lambda: self.role(i), timeout=60, what=f"master {i} to answer /healthz")
        return proc

    def role(self, i: int) -> str | None:
        """ "leader" or "standby" as master `i`'s /healthz says; None if it does not answer."""
        status, body = get_json(self.addresses[i], "/healthz")
        return str(body.get("role")) if status == 200 and body.get("role") else None

    def ready(self, i: int) -> bool:
        """Master `i` leads and schedules (/readyz 200)."""
        return get_json(self.addresses[i], "/readyz")[0] == 200

    def leader(self, timeout: float = 30.0, other_than: int | None = None) -> int:
        """The index of the master that leads (its /readyz is 200)."""

        def find() -> int | None:
            for i in range(len(self.masters)):
                if i != other_than and self.alive(i) and self.ready(i):
                    return i + 1  # truthy for wait_for
            return None

        return wait_for(find, timeout=timeout, interval=0.02, what="a leader") - 1

    def alive(self, i: int) -> bool:
        proc = self.masters[i]
        return proc is not None and proc.poll() is None

    def kill_master(self, i: int, sig: int = signal.SIGKILL, restart: bool = False) -> float:
        """`kill -9` master `i` (its whole process group); the moment it was sent.
        `restart`: start it again at once (same port and state dir: it stands by); else
        it stays down (under `supervise()` too) until `start_master(i)`."""
        proc = self.masters[i]
        assert proc is not None
        self._held.add(i)
        t = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=10)
        if restart:
            self.start_master(i, wait=False)
        return t

    def supervise(self) -> None:
        """Start every master that exits again, as a supervisor (systemd's
        `Restart=on-failure`) would: a master started while the database is away exits
        with one sentence (a deposed one restarts itself; exits 75 where it cannot).
        `kill_master(i, restart=False)` holds one down."""
        self._supervising.set()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        while self._supervising.is_set():
            for i, proc in enumerate(self.masters):
                if proc is None or i in self._held or proc.poll() is None:
                    continue
                self.restarts.append({"master": i, "at": time.time(), "status": proc.returncode})
                self.start_master(i, wait=False)
            time.sleep(0.05)

    def stop(self) -> None:
        self._supervising.clear()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        super().stop()

    def start_agent(
        self,
        node_id: str,
        gpus: int = 4,
        wait: bool = True,
        extra: list[str] | None = None,
        prefix: list[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """An agent given every master's address (`--master-host A,B`)."""
        argv = [*(prefix or []), str(BIN / "mgpu"), "node", "--node-id", node_id]
        argv += ["--master-host", ",".join(self.addresses)]
        argv += ["--fake-gpus", str(gpus), "--state-dir", str(self.root / f"agent-{node_id}")]
        argv += extra or []
        proc = self._spawn(argv, self.root / f"{node_id}.log")
        self.agents[node_id] = proc
        if wait:
            self.wait_node(node_id, "online", timeout=60)
        return proc

    def logs_of_masters(self, tail: int | None = 4000) -> str:
        """Every master's log (the last `tail` characters of each; None: all of it)."""
        return "\n".join(
            f"--- master{i}.log\n{self.log(f'master{i}')[-(tail or 0) :]}"
            for i in range(len(self.masters))
        )


@contextlib.contextmanager
def leader_standby_and_agents(
    root: Path, database: str, nodes: tuple[str, ...] = ("node001", "node002")
) -> Iterator[HaCluster]:
    """Master 0 leads, master 1 stands by, an agent with 2 fake GPUs on each of `nodes`;
    every process stopped at the end."""
    cluster = HaCluster(root, database, masters=2)
    try:
        cluster.start_master(0)
        assert cluster.leader(timeout=30) == 0
        cluster.start_master(1)
        assert cluster.role(1) == "standby"
        for node in nodes:
            cluster.start_agent(node, gpus=2, wait=False)
        for node in nodes:
            cluster.wait_node(node, "online", timeout=60)
        yield cluster
    finally:
        cluster.stop()


def follow_logs(
    ha: HaCluster, job_id: str, err: Path
) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """`mgpu logs -f JOB` as a user runs it (its own session, stderr to `err`): the
    process, the lines it printed so far (filled by the returned reader thread)."""
    with open(err, "wb") as err_file:
        follow = subprocess.Popen(
            [str(BIN / "mgpu"), "logs", "-f", job_id],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            env=ha.env,
            start_new_session=True,
        )
    got: list[str] = []
    assert follow.stdout is not None
    reader = threading.Thread(target=lambda: got.extend(follow.stdout or []), daemon=True)
    reader.start()
    return follow, got, reader


class Timed(threading.Thread):
    """`work()` in a thread, started at once: what it gave or raised, when it ended
    (monotonic) and how long it took."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self.ended = 0.0
        self.took = 0.0
        self.start()

    def run(self) -> None:
        began = time.monotonic()
        try:
            self.result = self.work()
        except BaseException as e:
            self.error = e
        self.ended = time.monotonic()
        self.took = self.ended - began
