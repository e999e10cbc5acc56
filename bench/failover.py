"""Failover: two masters on PostgreSQL while 1,000 short jobs flow, the leader killed -9.

A PostgreSQL server is started as tests/pgserver.py starts it (`initdb` in a temp dir, as
an unprivileged account; here with `synchronous_commit=on` and `fsync=on`, as a production
server runs), two masters on one database of it (`--database`, `--cluster-secret-file`),
and four agents x 4 fake GPUs on loopback, each given both masters' addresses
(`--master-host A,B`); the client is given both too.  Jobs are submitted from a thread
that keeps about 48 of them ahead of those that started, so submissions cross every
failover.  Each job appends "ID TIME" to one file when it starts, then sleeps 0.1-0.5 s.

At seeded-random moments (fractions of the jobs started, then 0-0.5 s more):

- the leader is killed with `kill -9` three times; the killed master is started again at
  once (same port and state dir) and stands by;
- then the standby is killed -9 (and started again);
- then PostgreSQL itself is restarted (`pg_ctl stop -m immediate`, then start).

A supervisor starts again any master that exits on its own (one started while PostgreSQL
is down exits with one sentence), as systemd would.

Measured, printed and written to bench/results/failover.json:

- failover time per kill: kill -> the first job started (the job's own timestamp) by the
  new leader.  Starts in the first second after the kill are not counted: they are launches
  the dead leader sent before it died (no standby can lead before the lease's TTL, 2.5 s);
  also kill -> the standby's /readyz answering 200 ("leads");
- jobs lost (acknowledged, never completed), run twice (more than one start line), failed
  by the failovers (ended in any state but completed), requeued (more than one attempt),
  nodes wrongly marked down (no agent is ever stopped: a node a master declares lost, or
  one seen offline for longer than the heartbeat timeout by a thread that polls the nodes
  every 0.25 s through the client; the stretches a node is seen offline while its agent
  reconnects to the new leader are recorded too) -- all must be 0;
- submits the client gave up on during a failover (a POST whose connection broke: the
  client cannot know whether the master did it), and the jobs those created anyway;
- throughput (jobs/s, first submit to last end) of 300 jobs that only print their id, on
  this PostgreSQL cluster and on one master with SQLite, the same agents and jobs; run
  `BENCH_FAILOVER_TPUT_RUNS` times on each (alternating), the median quoted with the load
  average at each run (the machine may be shared), and the median of each PostgreSQL
  run's share of the SQLite run before it, after a warm-up of 100 jobs on each
  that is not counted (the first runs after a start were the slowest, on both stores).
  Each run also says where the CPU went, in ms per job: the masters', PostgreSQL's own
  processes', the agents' with their jobs', and the whole machine's (all on one machine
  here: what PostgreSQL spends, the jobs do not get).  `BENCH_FAILOVER_ONLY=throughput`
  measures that alone (no kills), written to bench/results/failover-throughput.json;
  `BENCH_FAILOVER_SUBMITTERS=K` has K clients submit at once instead of one (written to
  failover-throughput-K-submitters.json).  `BENCH_FAILOVER_PG_PARENT=/dev/shm` puts
  PostgreSQL's data in that directory instead of /tmp: a diagnostic only (on tmpfs a
  commit's WAL flush costs nothing, and nothing is durable), which shows how much of the
  difference is the flush (written to failover-throughput-pg-on-<dir>.json).
  `BENCH_FAILOVER_SQLITE_SYNC=FULL` runs the SQLite master with `synchronous=FULL`, every
  commit waiting for the disk as PostgreSQL's durable one does (by default SQLite's commit
  does not wait; a power loss may drop the last ones): a diagnostic too, which compares
  the two stores at the same durability (written to failover-throughput-sqlite-full.json).

Not a test (tests/e2e/test_failover.py is).  Needs PostgreSQL's server binaries
(Debian's `postgresql`; scripts/install-system-deps.sh installs them).

    python bench/failover.py   [BENCH_FAILOVER_SEED=7 BENCH_FAILOVER_JOBS=1000
                                BENCH_FAILOVER_TPUT_JOBS=300 BENCH_FAILOVER_TPUT_RUNS=3
                                BENCH_FAILOVER_ONLY=throughput BENCH_FAILOVER_SUBMITTERS=1]
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil

# tests/pgserver.py (the server the tests start) and tests/hacluster.py (the masters)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chaos import stats  # bench/: the same figures of a list of times

import pgserver
from hacluster import HaCluster
from mgpu import Client
from mgpu.master.store.sqlite import SYNCHRONOUS_ENV
from mgpu.testing import LocalCluster, wait_for
from pgserver import PgServer

RESULTS = Path(__file__).resolve().parent / "results" / "failover.json"
TPUT_RESULTS = RESULTS.with_name("failover-throughput.json")
"""Where `BENCH_FAILOVER_ONLY=throughput` writes its pair of medians."""
NODES = ("node001", "node002", "node003", "node004")
GPUS = 4
AHEAD = 48
"""Jobs the submitter keeps queued beyond those that started."""
IN_FLIGHT_S = 1.0
"""Starts this soon after a kill are the dead leader's last launches, not the new one's."""
HEARTBEAT, TIMEOUT = 0.5, 5.0
CONFIG = f"""
networking:
  heartbeat_interval: {HEARTBEAT}
  timeout: {TIMEOUT}
"""
PG_SETTINGS = {"synchronous_commit": "on", "fsync": "on", "full_page_writes": "on"}


def start_agents(cluster: LocalCluster) -> None:
    for n in NODES:
        cluster.start_agent(n, gpus=GPUS, wait=False)
    for n in NODES:
        cluster.wait_node(n, "online", timeout=60)


WARM_UP_JOBS = 100
"""Jobs run on each cluster before the measured runs, not counted."""


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes and of their children they waited for (an agent's
    jobs), in seconds; a process gone meanwhile counts for nothing."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def cpu_groups(cluster: LocalCluster, server: PgServer | None) -> dict[str, float]:
    """CPU seconds so far of the cluster's masters, agents (with their jobs), and the
    PostgreSQL server's processes (None: this cluster has none), and of the machine."""
    masters = [p.pid for p in getattr(cluster, "masters", [cluster.master]) if p is not None]
    machine = psutil.cpu_times()
    groups = {
        "masters": cpu_seconds(masters),
        **{f"master{i}": cpu_seconds([pid]) for i, pid in enumerate(masters)},
        "agents_and_jobs": cpu_seconds([p.pid for p in cluster.agents.values()]),
        "machine": machine.user + machine.system + machine.nice + machine.irq + machine.softirq,
    }
    if server is not None:
        groups["postgresql"] = cpu_seconds(server.processes())
    return groups


SUBMITTERS = int(os.environ.get("BENCH_FAILOVER_SUBMITTERS", 1))
"""Clients (threads, one connection each) that submit the throughput runs' jobs at once."""
PG_PARENT = os.environ.get("BENCH_FAILOVER_PG_PARENT", "/tmp")
"""Where PostgreSQL's data directory is made (other than /tmp: a diagnostic, see above)."""
SQLITE_SYNC = os.environ.get("BENCH_FAILOVER_SQLITE_SYNC", "NORMAL").upper()
"""The SQLite master's `synchronous` (FULL: a diagnostic, see above)."""


def submit_echoes(cluster: LocalCluster, n: int, submitters: int) -> list[str]:
    """`n` one-GPU jobs that print their id, submitted one after another by each of
    `submitters` clients at once: their ids."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    shares = [n // submitters + (i < n % submitters) for i in range(submitters)]
    ids: list[list[str]] = [[] for _ in shares]

    def submit(i: int) -> None:
        client = cluster.client()
        ids[i] = [client.submit("echo $MGPU_JOB_ID", gpus=1, env=env).id for _ in range(shares[i])]

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(1, submitters)]
    for t in threads:
        t.start()
    submit(0)
    for t in threads:
        t.join()
    return [job_id for part in ids for job_id in part]


def throughput(cluster: LocalCluster, n: int, server: PgServer | None = None) -> dict[str, Any]:
    """`n` one-GPU jobs that print their id: jobs/s from the first submit to the last end,
    and the CPU each group of processes spent per job meanwhile (`cpu_groups`)."""
    client = cluster.client()
    cpu_before = cpu_groups(cluster, server)
    t0 = time.time()
    ids = submit_echoes(cluster, n, SUBMITTERS)
    submitted = time.time() - t0
    if len(ids) < n:
        raise RuntimeError(f"{n - len(ids)} of {n} submits failed")
    jobs = client.wait_all(ids, timeout=600)
    cpu_after = cpu_groups(cluster, server)
    ends = [j["end_time"] for j in jobs if j.get("end_time")]
    wall = (max(ends) if ends else time.time()) - t0
    return {
        "cpu_ms_per_job": {
            k: round((cpu_after[k] - cpu_before[k]) * 1000 / n, 2) for k in cpu_before
        },
        "jobs": n,
        "submitters": SUBMITTERS,
        "completed": sum(1 for j in jobs if j["state"] == "completed"),
        "submit_s": round(submitted, 3),
        "wall_s": round(wall, 3),
        "jobs_per_s": round(n / wall, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


class NodeWatch:
    """Polls the nodes through the client every 0.25 s; keeps, per node, each stretch of
    time it was seen in a state other than online (first and last poll that saw it so)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.stretches: dict[str, list[dict[str, Any]]] = {}
        self._open: dict[str, dict[str, Any]] = {}
        self.polls = 0
        self.failed_polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                nodes = self.client.nodes()
            except Exception:
                self.failed_polls += 1
                continue
            self.polls += 1
            now = round(time.time(), 3)
            for n in nodes:
                node = n["node_id"]
                if n["state"] == "online" and n.get("connected", True):
                    self._open.pop(node, None)
                    continue
                stretch = self._open.get(node)
                if stretch is None:
                    stretch = {"from": now, "to": now, "states": []}
                    self._open[node] = stretch
                    self.stretches.setdefault(node, []).append(stretch)
                stretch["to"] = now
                if n["state"] not in stretch["states"]:
                    stretch["states"].append(n["state"])

    def longest(self) -> float:
        spans = [s["to"] - s["from"] for v in self.stretches.values() for s in v]
        return round(max(spans, default=0.0), 3)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def declared_lost(logs: str) -> list[str]:
    """The nodes a master declared lost (its log's "node X lost: silent for N s")."""
    return sorted(set(re.findall(r"node (\S+) lost: silent", logs)))


class Failover:
    def __init__(self, root: Path, server: PgServer, seed: int, n_jobs: int) -> None:
        self.root = root
        self.server = server
        self.rng = random.Random(seed)
        self.n_jobs = n_jobs
        self.cluster = HaCluster(root, server.create_database("mgpu"), masters=2, config=CONFIG)
        self.runs = root / "runs"
        self.ids: list[str] = []
        self.submit_errors: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._submitting = threading.Event()

    def start(self) -> None:
        c = self.cluster
        c.supervise()
        c.start_master(0)
        c.leader(timeout=60)
        c.start_master(1)
        start_agents(c)

    # ---- jobs ------------------------------------------------------------------

    def started(self) -> list[tuple[str, float]]:
        """(job id, start time) of every start line so far."""
        try:
            text = self.runs.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                with contextlib.suppress(ValueError):
                    out.append((parts[0], float(parts[1])))
        return out

    def reached(self, n: int) -> bool:
        return len(self.started()) >= n

    def submit_all(self) -> None:
        client = self.cluster.client()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        rng = random.Random(self.rng.random())
        while len(self.ids) < self.n_jobs and self._submitting.is_set():
            if len(self.ids) - len(self.started()) >= AHEAD:
                time.sleep(0.02)
                continue
            duration = round(rng.uniform(0.1, 0.5), 2)
            script = f'echo "$MGPU_JOB_ID $(date +%s.%N)" >> {self.runs}; sleep {duration}'
            try:
                self.ids.append(client.submit(script, gpus=1, env=env).id)
            except Exception as e:  # the client gave up looking for a leader: say so, go on
                self.submit_errors.append(f"{time.time():.3f} {e}")
                time.sleep(0.5)

    # ---- the kills ---------------------------------------------------------------

    def first_start_after(self, t: float, timeout: float = 120) -> float:
        def find() -> float | None:
            later = [ts for _, ts in self.started() if ts >= t]
            return min(later) if later else None

        return wait_for(find, timeout=timeout, interval=0.02, what="a job started")

    def kill_leader(self, k: int) -> None:
        c = self.cluster
        old = c.leader(timeout=60)
        t_kill = c.kill_master(old)
        new = c.leader(timeout=60, other_than=old)
        t_lead = time.time()
        c.start_master(old, wait=False)  # back at once: the new standby
        first = self.first_start_after(t_kill + IN_FLIGHT_S)
        self.events.append(
            {
                "event": f"kill -9 leader ({k})",
                "killed": f"master{old}",
                "new_leader": f"master{new}",
                "at": round(t_kill, 3),
                "jobs_started_before": len(self.started()),
                "leads_s": round(t_lead - t_kill, 3),
                "failover_s": round(first - t_kill, 3),
            }
        )

    def kill_standby(self) -> None:
        c = self.cluster
        leader = c.leader(timeout=60)
        standby = 1 - leader
        wait_for(lambda: c.role(standby) == "standby", timeout=60, what="the standby up")
        t_kill = c.kill_master(standby)
        first = self.first_start_after(t_kill + IN_FLIGHT_S)
        still = c.leader(timeout=60)
        c.start_master(standby, wait=False)
        self.events.append(
            {
                "event": "kill -9 standby",
                "killed": f"master{standby}",
                "at": round(t_kill, 3),
                "leader_unchanged": still == leader,
                "next_start_s": round(first - t_kill, 3),
            }
        )

    def restart_database(self) -> None:
        restarts_before = len(self.cluster.restarts)
        t0 = time.time()
        self.server.kill()
        t_down = time.time()
        self.server.start()
        t_up = time.time()
        leader = self.cluster.leader(timeout=120)
        first = self.first_start_after(t_up)
        self.events.append(
            {
                "event": "PostgreSQL restarted (immediate stop, start)",
                "at": round(t0, 3),
                "down_s": round(t_up - t_down, 3),
                "leader_after": f"master{leader}",
                "masters_restarted_by_supervisor": self.cluster.restarts[restarts_before:],
                "kill_to_first_start_s": round(first - t0, 3),
                "back_to_first_start_s": round(first - t_up, 3),
            }
        )

    def run(self) -> dict[str, Any]:
        plan = sorted(self.rng.uniform(0.08, 0.6) for _ in range(3))
        plan += [self.rng.uniform(0.65, 0.72), self.rng.uniform(0.78, 0.85)]
        actions: list[Callable[[], None]] = [partial(self.kill_leader, k) for k in (1, 2, 3)]
        actions += [self.kill_standby, self.restart_database]
        watch = NodeWatch(self.cluster.client())
        self._submitting.set()
        submitter = threading.Thread(target=self.submit_all, daemon=True)
        t0 = time.time()
        submitter.start()
        try:
            for fraction, action in zip(plan, actions, strict=True):
                threshold = int(fraction * self.n_jobs)
                wait_for(
                    partial(self.reached, threshold),
                    timeout=300,
                    interval=0.05,
                    what=f"{threshold} jobs started",
                )
                time.sleep(self.rng.uniform(0.0, 0.5))  # a random moment, not a quiet one
                action()
            submitter.join(timeout=900)
        finally:
            self._submitting.clear()
        jobs = self.cluster.client().wait_all(self.ids, timeout=900)
        watch.stop()
        return self.analyse(jobs, t0, watch)

    def analyse(self, jobs: list[dict[str, Any]], t0: float, watch: NodeWatch) -> dict[str, Any]:
        starts = Counter(job_id for job_id, _ in self.started())
        acked = set(self.ids)
        completed = [j for j in jobs if j["state"] == "completed"]
        ended_otherwise = {j["id"]: j["state"] for j in jobs if j["state"] not in ("completed",)}
        failed = {i: s for i, s in ended_otherwise.items() if s not in ("queued", "running")}
        kills = [e for e in self.events if e["event"].startswith("kill -9 leader")]
        ends = [j["end_time"] for j in completed if j.get("end_time")]
        wall = (max(ends) if ends else time.time()) - t0
        lost = declared_lost(self.cluster.logs_of_masters(tail=None))
        long_down = sorted(
            node
            for node, spans in watch.stretches.items()
            if any(s["to"] - s["from"] > TIMEOUT for s in spans)
        )
        return {
            "jobs_submitted": len(self.ids),
            "jobs_completed": len(completed),
            "jobs_lost": len(acked) - len(completed) - len(failed),
            "jobs_never_started": sorted(acked - set(starts)),
            "jobs_run_twice": sorted(i for i, n in starts.items() if n > 1),
            "jobs_failed_by_failover": failed,
            "jobs_requeued": {
                j["id"]: [
                    {k: a.get(k) for k in ("start_time", "end_time", "end_reason")}
                    for a in j["attempts"]
                ]
                for j in jobs
                if len(j.get("attempts") or []) > 1
            },
            "jobs_started_unacknowledged": sorted(set(starts) - acked),
            "submit_errors": self.submit_errors,
            "nodes_wrongly_marked_down": sorted(set(lost) | set(long_down)),
            "nodes_declared_lost": lost,
            "nodes_shown_offline_longer_than_timeout": long_down,
            "nodes_shown_offline_s_longest": watch.longest(),
            "nodes_shown_offline": watch.stretches,
            "node_polls": watch.polls,
            "node_polls_failed": watch.failed_polls,
            "failover_s": [e["failover_s"] for e in kills],
            "failover_s_stats": stats([e["failover_s"] for e in kills]),
            "leads_s": [e["leads_s"] for e in kills],
            "wall_s": round(wall, 3),
            "jobs_per_s_through_the_failovers": round(len(completed) / wall, 2),
            "masters_restarted_by_supervisor": self.cluster.restarts,
            "events": self.events,
        }

    def stop(self) -> None:
        self._submitting.clear()
        self.cluster.stop()


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median jobs/s, with every run's figure and load beside it."""
    ordered = sorted(runs, key=lambda r: r["jobs_per_s"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "runs_jobs_per_s": [r["jobs_per_s"] for r in runs],
        "runs_cpu_ms_per_job": [r["cpu_ms_per_job"] for r in runs],
        "runs_load_average": [r["load_average"] for r in runs],
    }


def main() -> int:
    seed = int(os.environ.get("BENCH_FAILOVER_SEED", 7))
    n_jobs = int(os.environ.get("BENCH_FAILOVER_JOBS", 1000))
    n_tput = int(os.environ.get("BENCH_FAILOVER_TPUT_JOBS", 300))
    n_runs = max(1, int(os.environ.get("BENCH_FAILOVER_TPUT_RUNS", 3)))
    only_throughput = os.environ.get("BENCH_FAILOVER_ONLY") == "throughput"
    if SQLITE_SYNC not in ("NORMAL", "FULL"):
        print(f"BENCH_FAILOVER_SQLITE_SYNC is NORMAL or FULL, not {SQLITE_SYNC}")
        return 2
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        print("PostgreSQL is not installed (scripts/install-system-deps.sh installs it)")
        return 2
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "cluster": f"2 masters, {len(NODES)} agents x {GPUS} fake GPUs, loopback",
        "config": {"heartbeat_interval_s": HEARTBEAT, "timeout_s": TIMEOUT, "ha": "defaults"},
        "postgresql": {"bin": str(bin_dir), "settings": PG_SETTINGS, "data_under": PG_PARENT},
        "sqlite": {"synchronous": SQLITE_SYNC},
        "seed": seed,
    }
    runs_sqlite: list[dict[str, Any]] = []
    runs_pg: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mgpu-failover-") as tmp:
        root = Path(tmp)
        (root / "sqlite").mkdir()
        sqlite = LocalCluster(root / "sqlite", CONFIG)
        if SQLITE_SYNC != "NORMAL":
            sqlite.env[SYNCHRONOUS_ENV] = SQLITE_SYNC
        server = PgServer(bin_dir, settings=PG_SETTINGS, parent=PG_PARENT).start()
        try:
            sqlite.start_master()
            start_agents(sqlite)
            (root / "pg").mkdir()
            bench = Failover(root / "pg", server, seed, n_jobs)
            try:
                bench.start()
                throughput(sqlite, WARM_UP_JOBS)  # started processes settle, caches fill
                throughput(bench.cluster, WARM_UP_JOBS)
                for _ in range(n_runs):  # alternating: both see the same load, by and large
                    runs_sqlite.append(throughput(sqlite, n_tput))
                    runs_pg.append(throughput(bench.cluster, n_tput, server))
                sqlite.stop()
                if not only_throughput:
                    result.update(bench.run())
            finally:
                bench.stop()
        finally:
            sqlite.stop()
            server.stop()
    tput_sqlite, tput_pg = median_run(runs_sqlite), median_run(runs_pg)
    share = round(tput_pg["jobs_per_s"] / tput_sqlite["jobs_per_s"], 2)
    # Each PostgreSQL run against the SQLite run just before it (the same minute's load).
    paired = zip(runs_pg, runs_sqlite, strict=True)
    pairs = sorted(p["jobs_per_s"] / q["jobs_per_s"] for p, q in paired)
    share_of_pairs = round(pairs[(len(pairs) - 1) // 2], 2)
    print(
        f"throughput (median of {n_runs}): PostgreSQL, two masters {tput_pg['jobs_per_s']} "
        f"jobs/s; SQLite, one master {tput_sqlite['jobs_per_s']} jobs/s ({share:.0%}; "
        f"median of the pairs' shares {share_of_pairs:.0%}); "
        f"runs {tput_pg['runs_jobs_per_s']} / {tput_sqlite['runs_jobs_per_s']}"
    )
    print(
        f"CPU ms a job (median run): PostgreSQL {tput_pg['cpu_ms_per_job']}; "
        f"SQLite {tput_sqlite['cpu_ms_per_job']}"
    )
    if only_throughput:
        alone = {
            **{k: result[k] for k in ("machine", "postgresql", "sqlite")},
            "jobs_a_run": n_tput,
            "postgresql_two_masters": tput_pg,
            "sqlite_one_master": tput_sqlite,
            "postgresql_share_of_sqlite": share,
            "postgresql_share_of_sqlite_median_of_pairs": share_of_pairs,
        }
        out = TPUT_RESULTS
        if SUBMITTERS > 1:
            out = out.with_name(f"{out.stem}-{SUBMITTERS}-submitters.json")
        if PG_PARENT != "/tmp":
            out = out.with_name(f"{out.stem}-pg-on-{Path(PG_PARENT).name}.json")
        if SQLITE_SYNC != "NORMAL":
            out = out.with_name(f"{out.stem}-sqlite-{SQLITE_SYNC.lower()}.json")
        out.write_text(json.dumps(alone, indent=2) + "\n")
        print(f"written to {out}")
        return 0
    result["throughput"] = {
        "sqlite_one_master": tput_sqlite,
        "postgresql_two_masters": tput_pg,
        "postgresql_share_of_sqlite": share,
        "postgresql_share_of_sqlite_median_of_pairs": share_of_pairs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['jobs_submitted']} jobs submitted, {result['jobs_completed']} completed, "
        f"{result['jobs_lost']} lost, {len(result['jobs_run_twice'])} run twice, "
        f"{len(result['jobs_failed_by_failover'])} failed by the failovers, "
        f"{len(result['nodes_wrongly_marked_down'])} nodes wrongly marked down "
        f"({len(result['jobs_requeued'])} requeued) in {result['wall_s']} s"
    )
    for e in result["events"]:
        figures = {k: v for k, v in e.items() if k.endswith("_s") or k == "leader_unchanged"}
        print(f"  {e['event']}: {figures}")
    print(f"failover (kill -> first job started by the new leader): {result['failover_s']} s")
    print(
        f"nodes declared lost: {result['nodes_declared_lost']}; shown offline while their "
        f"agent reconnected: at most {result['nodes_shown_offline_s_longest']} s; submits "
        f"refused through a failover: {len(result['submit_errors'])} (jobs those created "
        f"anyway: {result['jobs_started_unacknowledged']})"
    )
    print(
        f"throughput: PostgreSQL, two masters {tput_pg['jobs_per_s']} jobs/s; "
        f"SQLite, one master {tput_sqlite['jobs_per_s']} jobs/s"
    )
    print(f"written to {RESULTS}")
    bad = (
        result["jobs_lost"]
        or result["jobs_run_twice"]
        or result["jobs_failed_by_failover"]
        or result["nodes_wrongly_marked_down"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
