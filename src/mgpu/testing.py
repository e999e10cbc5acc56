"""Real masters and agents as processes on loopback, for tests and benchmarks.

Every process is started in its own session and stopped by process group, by
pid, never by name.  Waiting is on observable conditions with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from mgpu import Client

BIN = Path(sys.executable).parent
# Headless Chromium on a machine with no network beyond loopback: without the
# background-networking flags it keeps trying (and failing) to reach Google's hosts.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T = TypeVar("T")
# Chromium reports each thing the page's Content-Security-Policy blocked as a console
# error containing this.
CSP_VIOLATION = "Content Security Policy"


def page_errors(page: Any) -> list[str]:
    """A list that fills, from now on, with a Playwright page's uncaught errors and the
    Content-Security-Policy violations it reports: the dashboard's own work must cause
    neither (a test asserts the list stays empty)."""
    errors: list[str] = []

    def on_console(message: Any) -> None:
        if CSP_VIOLATION in message.text:
            errors.append(message.text)

    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", on_console)
    return errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    condition: Callable[[], T | None], timeout: float = 45.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds.
    The default bound is generous: CI runs the suite beside a cold Kubernetes build."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # the thing may not be up yet
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}: {last_error}")


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def kill_leftover_jobs(root: Path) -> None:
    """Jobs run in their own sessions and outlive their agent by design (it re-adopts
    them); a test that is done must not leave them behind.  Every agent keeps a run
    record per running job in its spool dir: kill those process groups (checking the
    start time, so a reused pid is never hit)."""
    import json

    from mgpu.agent.launcher import RunRecord, same_process

    for record in root.glob("**/spool/*.run"):
        try:
            rec = RunRecord(**json.loads(record.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if same_process(rec):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pid, signal.SIGKILL)
        for path in (rec.cgroup, rec.devices):
            if not path:
                continue
            from mgpu.agent import cgroups

            cgroups.kill(path)  # whatever is in the run's cgroups, which then go
            deadline = time.monotonic() + 5
            while cgroups.populated(path) and time.monotonic() < deadline:
                time.sleep(0.01)
            if cgroups.release(path):
                cgroups.release(os.path.dirname(path))


class LocalCluster:
    """A master and agents on 127.0.0.1 with fake GPUs."""

    def __init__(self, root: Path, config: str | None = None, database: str | None = None) -> None:
        self.root = root
        self.database = database
        """The master's `--database` (None: SQLite in its state dir)."""
        self.port = free_port()
        self.state_dir = root / "master"
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = root / "cluster.yaml"
            self.config_path.write_text(config)
        self.master: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "MGPU_MASTER": self.address}
        self.env.pop("MGPU_STATE_DIR", None)
        if database is not None:  # a master of a database needs the cluster's secret
            self.env.setdefault("MGPU_CLUSTER_SECRET", "a test cluster's secret, 40 bytes long")
        self._saved_env: dict[str, str | None] = {}
        self.admin_token = ""
        self.join_token = ""

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
            )
        self._procs.append(proc)
        return proc

    def start_master(self, wait: bool = True) -> subprocess.Popen[bytes]:
        argv = [str(BIN / "mgpu"), "master", "--port", str(self.port)]
        argv += ["--state-dir", str(self.state_dir)]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        if self.database is not None:
            argv += ["--database", self.database]
        self.master = self._spawn(argv, self.root / "master.log")
        if wait:
            wait_for(self._load_tokens, what="the master's tokens")
            with self.client() as client:
                wait_for(lambda: client.nodes() is not None, timeout=60, what="the master")
        return self.master

    def _load_tokens(self) -> bool:
        """Use the master's admin token for clients and its join token for agents.

        Set in this process's environment too, so a plain `Client(address)` in a test
        authenticates as the cluster's owner, as it would on the master's machine."""
        try:
            admin = (self.state_dir / "admin-token").read_text().strip()
            join = (self.state_dir / "join-token").read_text().strip()
        except OSError:
            return False
        if not admin or not join:
            return False
        if "MGPU_TOKEN" not in self._saved_env:
            self._saved_env["MGPU_TOKEN"] = os.environ.get("MGPU_TOKEN")
        self.env["MGPU_TOKEN"] = os.environ["MGPU_TOKEN"] = admin
        self.env["MGPU_JOIN_TOKEN"] = join
        self.admin_token = admin
        self.join_token = join
        return True

    def start_agent(
        self,
        node_id: str,
        gpus: int = 4,
        wait: bool = True,
        extra: list[str] | None = None,
        prefix: list[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """`prefix`: a command the agent is started through (as `nohup` would be)."""
        argv = [*(prefix or []), str(BIN / "mgpu"), "node", "--node-id", node_id]
        argv += ["--master-port", str(self.port)]
        argv += ["--fake-gpus", str(gpus), "--state-dir", str(self.root / f"agent-{node_id}")]
        argv += extra or []
        proc = self._spawn(argv, self.root / f"{node_id}.log")
        self.agents[node_id] = proc
        if wait:
            self.wait_node(node_id, "online")
        return proc

    def wait_node(self, node_id: str, state: str, timeout: float = 60.0) -> dict[str, Any]:
        """Poll the node list until `node_id` is in `state` (and connected, for online).
        One client polls, on one kept-alive connection: a client a poll would leave its
        closed connections to the master's per-address cap until the master sees them go,
        and a starting agent can take long on a loaded machine (CI builds Kubernetes)."""
        with self.client() as client:

            def check() -> dict[str, Any] | None:
                for n in client.nodes():
                    matches = n["node_id"] == node_id and n["state"] == state
                    if matches and (state != "online" or n["connected"]):
                        return n
                return None

            try:
                return wait_for(check, timeout=timeout, interval=0.05, what=f"{node_id} {state}")
            except AssertionError as e:  # say what the agent did, not only that it did not
                raise AssertionError(f"{e}\n{self._agent_story(node_id)}") from None

    def _agent_story(self, node_id: str) -> str:
        proc = self.agents.get(node_id)
        rc = None if proc is None else proc.poll()
        how = "not started here" if proc is None else "running" if rc is None else f"exited {rc}"
        tail = self.log(node_id).splitlines()[-15:]
        return f"agent {node_id}: {how}; its log ends:\n" + "\n".join(tail)

    def client(self) -> Client:
        return Client(self.address, connect_timeout=2.0, token=self.admin_token or None)

    def cli(
        self, *args: str, timeout: float = 60, input: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(BIN / "mgpu"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            input=input,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"mgpu {' '.join(args)} failed: {res.stderr}")
        return res

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in reversed(self._procs):
            kill_group(proc)
        kill_leftover_jobs(self.root)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()


@contextlib.contextmanager
def local_cluster(
    root: Path,
    agents: int = 2,
    gpus: int = 4,
    config: str | None = None,
    database: str | None = None,
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root, config, database)
    try:
        cluster.start_master()
        names = [f"node{i:03d}" for i in range(1, agents + 1)]
        for name in names:  # started together, then waited for: each takes ~0.5 s to start
            cluster.start_agent(name, gpus=gpus, wait=False)
        for name in names:
            cluster.wait_node(name, "online")
        yield cluster
    finally:
        cluster.stop()


_PROBE = """
import http.client, os, sys, time
page = os.sysconf("SC_PAGE_SIZE")
host, port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], open(sys.argv[4], "w")
conn = None
while True:
    t0 = time.monotonic()
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=600)
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    except OSError:
        conn = None
    t1 = time.monotonic()
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * page
    except OSError:
        break
    out.write(f"{t0} {t1 - t0} {rss}\\n")
    out.flush()
    time.sleep(max(0.0, 0.01 - (t1 - t0)))
"""


class LoopProbe:
    """How long a master's event loop could not answer: `/healthz` asked every ~10 ms, and
    the master's resident memory read, by a child process (so that the caller's own busy
    threads cannot delay a sample).  Times are `time.monotonic()`, as in the caller."""

    def __init__(self, address: str, pid: int, path: Path) -> None:
        host, port = address.rsplit(":", 1)
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, host, port, str(pid), str(path)],
            start_new_session=True,
        )

    def samples(self) -> list[tuple[float, float, int]]:
        """(sent at, latency, master RSS after) of every sample so far."""
        out: list[tuple[float, float, int]] = []
        try:
            text = self.path.read_text()
        except FileNotFoundError:  # the probe is still starting
            return out
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3:
                out.append((float(parts[0]), float(parts[1]), int(parts[2])))
        return out

    def settle(self, quiet: float = 0.5, slow: float = 0.05, timeout: float = 120) -> None:
        """Wait until every answer for `quiet` seconds came within `slow` seconds, so that
        what came before (a scheduling pass, a write) is not charged to what comes next."""
        since = time.monotonic()
        deadline = since + timeout
        while time.monotonic() < deadline:
            time.sleep(0.05)
            recent = [(s, d) for s, d, _ in self.samples() if s >= since]
            if any(d > slow for _, d in recent):
                since = max(s + d for s, d in recent)
                continue
            answered = max((s + d for s, d in recent), default=0.0)
            now = time.monotonic()
            if now - since >= quiet and now - answered < 2 * slow:  # and none is hanging now
                return

    def window(self, t0: float, t1: float) -> tuple[list[float], list[int]]:
        """Latencies of the samples in flight at any time in [t0, t1] (call settle() before
        t0, so the one in flight then is not an earlier stall), and the RSS readings."""
        samples = self.samples()
        rows = [(s, d, r) for s, d, r in samples if s <= t1 and s + d >= t0]
        if not rows:  # over between two samples: the next one tells
            rows = [x for x in samples if x[0] >= t1][:1]
        return [d for _, d, _ in rows], [r for _, _, r in rows]

    def stop(self) -> None:
        kill_group(self.proc)
