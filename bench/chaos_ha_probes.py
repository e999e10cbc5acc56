"""What bench/chaos_ha.py does to the cluster and how it watches it: the cluster with one
database address per master (so one master alone can be cut off), the cut itself
(iptables), PostgreSQL paused, the leader caught holding the lease row, the users (CLI and
Python loops, a `logs -f` follower) and a `/readyz` prober.  Every record carries the real
wall-clock time of this process (never a master's, whose clock a fault may jump)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hacluster import HaCluster, get_json
from mgpu import Client
from mgpu.testing import BIN
from pgserver import PgServer

CLOCK_ENV = "MGPU_TEST_CLOCK_OFFSET_FILE"
"""The master's test hook (src/mgpu/master/runtime/testclock.py): its wall clock follows
the seconds written in this file."""
SLOW_S = 30.0
"""A user's command slower than this counts against the fault."""


def master_ip(i: int) -> str:
    """Master `i` reaches PostgreSQL at its own loopback address, 127.0.0.(2+i): iptables
    can then cut that master alone off the database."""
    return f"127.0.0.{2 + i}"


class ChaosCluster(HaCluster):
    """HaCluster with one database URL per master (its own address of the server) and its
    own clock file (the test hook)."""

    def __init__(
        self, root: Path, server: PgServer, dbname: str, masters: int, config: str, plain: bool
    ) -> None:
        self.urls = [server.url(dbname).replace("127.0.0.1", master_ip(i)) for i in range(masters)]
        super().__init__(root, self.urls[0], masters=masters, config=config)
        self.plain = plain
        """Agents and users told `http://` (a site serving plain HTTP on purpose), not left
        to guess a loopback master's transport (mgpu.masters.Transport)."""
        if plain:
            self.address = ",".join(f"http://{a}" for a in self.addresses)
            self.env["MGPU_MASTER"] = self.address
        self.clock_files = [root / f"clock-offset-{i}" for i in range(masters)]
        for f in self.clock_files:
            f.write_text("0\n")
        self._spawning = threading.Lock()

    def start_master(self, i: int = 0, wait: bool = True) -> subprocess.Popen[bytes]:  # type: ignore[override]
        with self._spawning:  # the supervisor thread starts masters too
            self.database = self.urls[i]
            self.env[CLOCK_ENV] = str(self.clock_files[i])
            return super().start_master(i, wait)

    def start_agent(self, node_id: str, gpus: int = 4, wait: bool = True) -> Any:  # type: ignore[override]
        saved = self.addresses
        if self.plain:
            self.addresses = [f"http://{a}" for a in saved]
        try:
            return super().start_agent(node_id, gpus=gpus, wait=wait)
        finally:
            self.addresses = saved

    def signal_master(self, i: int, sig: int) -> None:
        proc = self.masters[i]
        assert proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def stop_master(self, i: int) -> None:
        """SIGSTOP: held, so the supervisor leaves it alone (it is alive anyway)."""
        self._held.add(i)
        self.signal_master(i, signal.SIGSTOP)

    def continue_master(self, i: int) -> None:
        self.signal_master(i, signal.SIGCONT)
        self._held.discard(i)  # a deposed master that exits is started again

    def shift_clock(self, i: int, seconds: float) -> None:
        self.clock_files[i].write_text(f"{seconds}\n")


class Cut:
    """Master `i` cut off from PostgreSQL both ways (its packets to the server's address
    for it, and the server's back, dropped in OUTPUT, which loopback traffic crosses): no
    RST, no FIN, as a pulled cable; every other path (agents, users) stays up."""

    def __init__(self, pg_port: int, i: int) -> None:
        ip = master_ip(i)
        self.rules = [
            ["-p", "tcp", "-d", ip, "--dport", str(pg_port), "-j", "DROP"],
            ["-p", "tcp", "-s", ip, "--sport", str(pg_port), "-j", "DROP"],
        ]
        self.on = False

    def apply(self) -> None:
        for rule in self.rules:
            subprocess.run(["iptables", "-I", "OUTPUT", *rule], check=True, timeout=30)
        self.on = True

    def heal(self) -> None:
        for rule in self.rules:
            subprocess.run(
                ["iptables", "-D", "OUTPUT", *rule], check=False, timeout=30, capture_output=True
            )
        self.on = False


def available_cut() -> str | None:
    """None when iptables can add and drop a rule here; else why not."""
    rule = ["-p", "tcp", "-d", "127.0.0.9", "--dport", "9", "-j", "DROP"]
    try:
        subprocess.run(["iptables", "-I", "OUTPUT", *rule], check=True, timeout=30,
                       capture_output=True)  # fmt: skip
        subprocess.run(["iptables", "-D", "OUTPUT", *rule], check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"iptables: {e}"
    return None


def postgres_pids(server: PgServer) -> list[int]:
    """The postmaster and its children (the backends and helpers)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry.name))
    return [postmaster, *children]


def pause_postgres(server: PgServer) -> list[int]:
    """SIGSTOP the postmaster, then its children: the server hangs, as a frozen VM would."""
    pids = postgres_pids(server)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return pids


def resume_postgres(pids: list[int]) -> None:
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


class LeaseRowWatch:
    """Which master's database sessions hold the lease row (`RowShareLock` on mgpu_lease,
    its fence's `FOR KEY SHARE`: a write transaction in flight), from pg_stat_activity and
    pg_locks; a session is mapped to its master by the server-side address it connected
    to (the socket table, /proc/net/tcp)."""

    QUERY = """
        SELECT a.client_port, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'relation' AND l.relation = to_regclass('mgpu_lease')
          AND l.mode = 'RowShareLock' AND l.granted AND a.client_port IS NOT NULL
    """

    def __init__(self, server: PgServer, dbname: str) -> None:
        self.port = server.port
        self.url = server.url(dbname)
        self.conn: Any = None

    def _query(self) -> list[Any]:
        """The rows of QUERY; connects (again, after a restart of the server) as needed."""
        import psycopg

        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            self.conn.execute("SET statement_timeout = 2000")
        try:
            return list(self.conn.execute(self.QUERY).fetchall())
        except Exception:
            self.close()
            raise

    def client_ports(self, i: int) -> set[int]:
        """Local ports of master `i`'s connections to the server."""
        want = f"{_hex_ip(master_ip(i))}:{self.port:04X}"
        ports = set()
        for table in ("/proc/net/tcp",):
            with contextlib.suppress(OSError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[1] == want:
                        ports.add(int(fields[2].split(":")[1], 16))
        return ports

    def holding(self, i: int) -> set[int]:
        """Client ports of master `i`'s sessions that hold the lease row now."""
        try:
            rows = self._query()
        except Exception:
            return set()
        held = {int(port) for port, _ in rows}
        return held & self.client_ports(i) if held else set()

    def catch(
        self, i: int, act: Callable[[], None], undo: Callable[[], None] | None, timeout: float
    ) -> dict[str, Any]:
        """Apply `act` to master `i` the moment one of its sessions holds the lease row,
        and check it still does once `act` took effect; if not, `undo` and try again.
        Without `undo` (a kill) the row seen held just before counts."""
        tries = 0
        deadline = time.time() + timeout
        while time.time() < deadline:
            held = self.holding(i)
            if not held:
                time.sleep(0.003)
                continue
            act()
            tries += 1
            if undo is None:
                return {"caught": True, "tries": tries}
            time.sleep(0.05)
            if self.holding(i) & held:
                return {"caught": True, "tries": tries}
            undo()
            time.sleep(0.05)
        act()
        return {"caught": False, "tries": tries}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        self.conn = None


def _hex_ip(ip: str) -> str:
    return "".join(f"{int(b):02X}" for b in reversed(ip.split(".")))


class Calls:
    """Every user call: (who, start, seconds, error or None)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, str | None]] = []
        self._lock = threading.Lock()

    def add(self, who: str, t0: float, error: str | None) -> None:
        with self._lock:
            self.rows.append((who, round(t0, 3), round(time.time() - t0, 3), error))


class Users:
    """Users looping while the faults happen: `mgpu queue` and `mgpu submit` as whole
    processes, the Python `Client`'s queue(), and `mgpu logs -f` on one ticking job."""

    def __init__(self, cluster: ChaosCluster, script: Callable[[str], str], ids: list[str]):
        self.cluster = cluster
        self.script = script
        self.ids = ids
        self.calls = Calls()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.ticks: dict[str, float] = {}
        """A tick line ("tick N T") -> when a follower first printed it."""
        self.follow_exits: list[tuple[float, int, str]] = []
        self.follow_job = ""
        self.follower: subprocess.Popen[str] | None = None

    def start(self, follow_job: str) -> None:
        self.follow_job = follow_job
        for target in (self._cli_queue, self._cli_submit, self._client_queue, self._follow):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def _cli(self, who: str, *args: str) -> str | None:
        t0 = time.time()
        try:
            res = subprocess.run(
                [str(BIN / "mgpu"), *args], capture_output=True, text=True,
                timeout=SLOW_S * 2, env=self.cluster.env,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            self.calls.add(who, t0, f"no answer in {SLOW_S * 2:.0f} s")
            return None
        error = None
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).strip().splitlines()
            error = f"exit {res.returncode}: {lines[-1] if lines else ''}"[:300]
        self.calls.add(who, t0, error)
        return res.stdout if error is None else None

    def _cli_queue(self) -> None:
        while not self.stop.wait(1.0):
            self._cli("mgpu queue", "queue")

    def _cli_submit(self) -> None:
        while not self.stop.wait(2.0):
            out = self._cli("mgpu submit", "submit", "--gpus", "1", self.script("0.5"))
            if out and out.split():
                self.ids.append(out.split()[-1])

    def _client_queue(self) -> None:
        client = Client(self.cluster.address, connect_timeout=2.0, token=self.cluster.admin_token)
        while not self.stop.wait(0.5):
            t0 = time.time()
            try:
                client.queue()
                self.calls.add("Client.queue", t0, None)
            except Exception as e:
                self.calls.add("Client.queue", t0, f"{type(e).__name__}: {e}"[:300])

    def _follow(self) -> None:
        """`mgpu logs -f` on the ticking job; started again when it exits early."""
        while not self.stop.is_set():
            t0 = time.time()
            proc = subprocess.Popen(
                [str(BIN / "mgpu"), "logs", "-f", self.follow_job], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=self.cluster.env, start_new_session=True,
            )  # fmt: skip
            self.follower = proc
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("tick "):
                    self.ticks.setdefault(line.strip(), time.time())
            rc = proc.wait()
            err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            if self.stop.is_set():
                return
            self.follow_exits.append((round(t0, 3), rc, err[-1][:300] if err else ""))
            self.calls.add("mgpu logs -f", t0, f"exited {rc}: {err[-1] if err else ''}"[:300])
            self.stop.wait(0.5)

    def finish(self) -> None:
        self.stop.set()
        if self.follower is not None:  # it follows a job that never ends by itself
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.follower.pid, signal.SIGTERM)
        for t in self.threads:
            t.join(timeout=SLOW_S * 2 + 10)


class ReadyProbe:
    """Asks every master's /readyz every 0.1 s: the moments some master led and wrote."""

    def __init__(self, cluster: HaCluster) -> None:
        self.addresses = cluster.addresses
        self.ready: list[tuple[float, int]] = []
        """(when asked, index of a master that answered 200)."""
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True)
            for i in range(len(self.addresses))
        ]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        while not self._stop.wait(0.1):
            t0 = time.time()
            if get_json(self.addresses[i], "/readyz", timeout=1.0)[0] == 200:
                self.ready.append((t0, i))

    def first_after(self, t: float) -> float | None:
        later = [ts for ts, _ in list(self.ready) if ts >= t]
        return min(later) if later else None

    def stop(self) -> None:
        self._stop.set()


def jitter(rng: random.Random, most: float) -> None:
    """Wait a random moment, so a fault does not always land on a quiet one."""
    time.sleep(rng.uniform(0.0, most))
