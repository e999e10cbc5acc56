"""Fault matrix: two masters on PostgreSQL meet every fault a head node meets, while jobs
flow and users loop (issue 32's evidence).

The cluster is bench/failover.py's (tests/pgserver.py's PostgreSQL with durable settings,
tests/hacluster.py's masters under a supervisor, 4 agents x 4 fake GPUs on loopback, the
same heartbeat and timeout), with one change: each master reaches PostgreSQL at its own
loopback address (127.0.0.2, 127.0.0.3), so iptables can cut one master alone off the
database.  While it runs:

- a submitter keeps 24 short jobs (0.3-1.5 s) queued ahead and a long one (20-40 s) every
  10 s; each job appends "ID start T" and "ID end T" to one file (the machine's clock);
- users loop: `mgpu queue` every 1 s and `mgpu submit` every 2 s (whole processes), the
  Python `Client.queue()` every 0.5 s, and `mgpu logs -f` on a job printing "tick N T"
  every 0.2 s (started again whenever it exits early);
- a chatty job prints 400 lines every 0.5 s: the leader's output flushes of more than 64
  records go through COPY, a transaction of several round trips (the worst moment below);
- a prober asks both masters' `/readyz` every 0.1 s; a watcher polls the nodes every
  0.25 s (bench/failover.py's NodeWatch).

Faults, one after the other, each once the cluster has settled (a leader, both masters
up, every node online) and at a random moment or at the worst one: the leader caught
while one of its sessions holds the lease row (pg_locks' RowShareLock on mgpu_lease,
mapped to the master by the address its connection reached):

    kill-idle / kill-busy   SIGKILL of the leader outside / inside a write transaction
    stop-N                  SIGSTOP of the leader for N s, then SIGCONT
    cut-N                   the leader cut off from PostgreSQL for N s (iptables DROP)
    pg-fast / pg-immediate  `pg_ctl stop -m fast|immediate`, started again at once
    pg-down-5               `pg_ctl stop -m fast`, 5 s down, started again
    pg-pause-N              SIGSTOP of the postmaster and every backend for N s
    both-killed             SIGKILL of both masters, both started again
    clock-120               the leader's wall clock +120 s for 20 s, then back (a test
                            hook: that master's `time.time` only, never the machine's)

For each: time to a working leader (some master's /readyz 200, which writes) after the
fault (after the database is back for pg-*), the longest stretch without a job starting,
and, attributed to the fault from its start to the next one's: jobs lost, run twice,
failed, restarted; nodes declared lost or shown not online; user calls slower than 30 s
or failing; `logs -f` exits and its longest lag (a tick's printing time to the follower
seeing it).  Printed as a table and written to bench/results/chaos_ha.json, with the load
averages.  Not a test.  Needs PostgreSQL's server binaries and iptables (root).

    python bench/chaos_ha.py --quick       # each fault once, shorter stops (minutes)
    python bench/chaos_ha.py [--repeat 3 --worst 2 --seed 7]   # the full matrix
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import chaos_ha_report as report
from chaos_ha_probes import (
    SLOW_S,
    ChaosCluster,
    Cut,
    LeaseRowWatch,
    ReadyProbe,
    Users,
    available_cut,
    jitter,
    pause_postgres,
    resume_postgres,
)  # fmt: skip
from failover import CONFIG, NODES, PG_SETTINGS, NodeWatch, start_agents

import pgserver
from mgpu.testing import wait_for
from pgserver import PgServer

RESULTS = Path(__file__).resolve().parent / "results"
AHEAD = 24
CHATTER_LINES = 400
"""Lines the chatty job prints every 0.5 s: its flushes exceed ONE_QUERY_ROWS (64)."""
CATCH_S = 60.0
"""How long a worst-moment fault waits for the leader to be caught holding the lease row."""


@dataclass
class Fault:
    kind: str
    seconds: float = 0.0
    worst: bool = False

    @property
    def name(self) -> str:
        base = self.kind + (f"-{self.seconds:g}" if self.seconds else "")
        return base + (" (worst)" if self.worst else "")


def matrix(quick: bool, repeat: int, worst: int) -> list[Fault]:
    """The faults in order: each once at its worst moment (--quick, stops shortened), or
    `repeat` times at random moments and `worst` times at the worst one."""
    if quick:
        return [
            Fault("kill-idle"), Fault("kill-busy", worst=True),
            Fault("stop", 3, True), Fault("stop", 12, True), Fault("stop", 20, True),
            Fault("cut", 10, True), Fault("cut", 20, True),
            Fault("pg-fast"), Fault("pg-immediate"), Fault("pg-down", 5),
            Fault("pg-pause", 10), Fault("pg-pause", 15),
            Fault("both-killed"), Fault("clock", 120),
        ]  # fmt: skip
    out = [Fault("kill-idle") for _ in range(repeat)]
    out += [Fault("kill-busy", worst=True) for _ in range(worst)]
    for kind, seconds in (("stop", 3), ("stop", 12), ("stop", 60), ("cut", 10), ("cut", 60)):
        out += [Fault(kind, seconds) for _ in range(repeat)]
        out += [Fault(kind, seconds, True) for _ in range(worst)]
    for kind, seconds in (("pg-fast", 0), ("pg-immediate", 0), ("pg-down", 5)):
        out += [Fault(kind, seconds) for _ in range(repeat)]
    out += [Fault("pg-pause", s) for s in (10, 30) for _ in range(repeat)]
    out += [Fault("both-killed") for _ in range(repeat)]
    out += [Fault("clock", 120) for _ in range(repeat)]
    return out


class ChaosHa:
    def __init__(self, root: Path, server: PgServer, seed: int, plain: bool) -> None:
        self.root = root
        self.server = server
        self.rng = random.Random(seed)
        server.create_database("mgpu")
        self.cluster = ChaosCluster(root, server, "mgpu", 2, CONFIG, plain)
        self.rows = LeaseRowWatch(server, "mgpu")
        self.runs = root / "runs"
        self.ids: list[str] = []
        self.acked_at: dict[str, float] = {}
        self.submit_errors: list[tuple[float, str]] = []
        self.records: list[dict[str, Any]] = []
        self.lost_counts: list[int] = []
        self._flowing = threading.Event()

    # ---- jobs ----------------------------------------------------------------------

    def script(self, seconds: str) -> str:
        line = f'"$MGPU_JOB_ID %s $(date +%%s.%%N)" >> {self.runs}'
        return f"echo {line % 'start'}; sleep {seconds}; echo {line % 'end'}"

    def lines(self) -> list[tuple[str, str, float]]:
        """(job id, "start" | "end", time) of every line so far."""
        try:
            text = self.runs.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3:
                with contextlib.suppress(ValueError):
                    out.append((parts[0], parts[1], float(parts[2])))
        return out

    def _submit(self, client: Any, seconds: str) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        t0 = time.time()
        try:
            job = client.submit(self.script(seconds), gpus=1, env=env).id
        except Exception as e:  # counted against the fault; the flow goes on
            self.submit_errors.append((round(t0, 3), f"{type(e).__name__}: {e}"[:300]))
            self.users.calls.add("Client.submit", t0, f"{type(e).__name__}: {e}"[:300])
            time.sleep(0.5)
            return
        self.users.calls.add("Client.submit", t0, None)
        self.ids.append(job)
        self.acked_at[job] = time.time()

    def flow(self) -> None:
        client = self.cluster.client()
        rng = random.Random(self.rng.random())
        next_long = time.time()
        while self._flowing.is_set():
            if time.time() >= next_long:
                self._submit(client, f"{rng.uniform(20, 40):.1f}")
                next_long = time.time() + 10
            started = sum(1 for _, kind, _ in self.lines() if kind == "start")
            if len(self.ids) - started >= AHEAD:
                time.sleep(0.05)
                continue
            self._submit(client, f"{rng.uniform(0.3, 1.5):.2f}")

    # ---- set-up and settling -------------------------------------------------------

    def start(self) -> None:
        c = self.cluster
        c.supervise()
        c.start_master(0)
        c.leader(timeout=60)
        c.start_master(1)
        start_agents(c)
        client = c.client()
        ticker = f'echo "$MGPU_JOB_ID start $(date +%s.%N)" >> {self.runs}; i=0; '
        ticker += 'while true; do i=$((i+1)); echo "tick $i $(date +%s.%N)"; sleep 0.2; done'
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.follow_job = client.submit(ticker, gpus=0, env=env).id
        # A chatty job: bursts of more records than one query takes, so the leader's output
        # flushes go through COPY, a transaction of several round trips that holds the
        # lease row between them: the worst moment, which one-statement writes rarely show.
        chatter = f"while true; do seq -f 'chatter %g' {CHATTER_LINES}; sleep 0.5; done"
        self.chatter_job = client.submit(chatter, gpus=0, env=env).id
        self.users = Users(c, self.script, self.ids)
        self.users.start(self.follow_job)
        self.probe = ReadyProbe(c)
        self.nodes = NodeWatch(client)
        self._flowing.set()
        threading.Thread(target=self.flow, daemon=True).start()

    def settle(self, quiet: float) -> dict[str, Any]:
        """Until a master leads, both answer and every node is online; then `quiet` s."""
        c = self.cluster
        t0 = time.time()
        try:
            c.leader(timeout=300)
            wait_for(
                lambda: sorted(filter(None, (c.role(i) for i in range(2))))
                == ["leader", "standby"],
                timeout=300, interval=0.2, what="a leader and a standby",
            )  # fmt: skip
            for n in NODES:
                c.wait_node(n, "online", timeout=300)
        except Exception as e:
            return {"settled": False, "why": str(e)[:200], "after_s": round(time.time() - t0, 1)}
        time.sleep(quiet)
        return {"settled": True, "after_s": round(time.time() - t0, 1)}

    # ---- the faults ----------------------------------------------------------------

    def inject(self, fault: Fault) -> dict[str, Any]:
        """Do `fault`; its record: when it began, the reference the leader's time is
        measured from, when it was over, and how it was caught."""
        c, server = self.cluster, self.server
        leader = c.leader(timeout=60)
        if not fault.worst:
            jitter(self.rng, 2.0)
            leader = c.leader(timeout=60)
        rec: dict[str, Any] = {"fault": fault.name, "leader": f"master{leader}"}
        act: Any
        undo: Any = None
        if fault.kind in ("kill-idle", "kill-busy"):

            def act() -> None:
                rec["t0"] = c.kill_master(leader)

            if fault.kind == "kill-idle":
                wait_for(lambda: not self.rows.holding(leader), timeout=30, interval=0.003)
                act()
            else:
                rec.update(self.rows.catch(leader, act, None, CATCH_S))
            c.start_master(leader, wait=False)  # back at once: the new standby
            rec["ref"] = rec["t0"]
        elif fault.kind in ("stop", "cut"):
            cut = Cut(server.port, leader)

            def act() -> None:
                rec["t0"] = time.time()
                cut.apply() if fault.kind == "cut" else c.stop_master(leader)

            def undo() -> None:
                cut.heal() if fault.kind == "cut" else c.continue_master(leader)

            if fault.worst:
                rec.update(self.rows.catch(leader, act, undo, CATCH_S))
            else:
                act()
            rec["ref"] = rec["t0"]
            time.sleep(fault.seconds)
            undo()
            rec["over"] = time.time()
        elif fault.kind.startswith("pg-"):
            rec["t0"] = time.time()
            if fault.kind == "pg-pause":
                pids = pause_postgres(server)
                time.sleep(fault.seconds)
                resume_postgres(pids)
            else:
                mode = "immediate" if fault.kind == "pg-immediate" else "fast"
                server._pg_ctl("stop", "-m", mode, "-w", "-t", "60", check=False)
                time.sleep(fault.seconds)
                server.start()
            rec["ref"] = rec["over"] = time.time()
        elif fault.kind == "both-killed":
            rec["t0"] = c.kill_master(leader)
            c.kill_master(1 - leader)
            for i in (leader, 1 - leader):
                c.start_master(i, wait=False)
            rec["ref"] = rec["t0"]
        elif fault.kind == "clock":
            rec["t0"] = rec["ref"] = time.time()
            c.shift_clock(leader, fault.seconds)
            time.sleep(20)
            c.shift_clock(leader, 0)
            rec["over"] = time.time()
        rec.setdefault("over", rec["t0"])
        return rec

    def run(self, faults: list[Fault], quiet: float) -> None:
        rec = self.settle(quiet)
        self.t_start = time.time()
        for k, fault in enumerate(faults):
            self.lost_counts.append(self.declared_lost())
            load = [round(x, 2) for x in os.getloadavg()]
            print(f"[{k + 1}/{len(faults)}] {fault.name} (load {load})", flush=True)
            rec = self.inject(fault)
            rec["load_average"] = load
            rec.update(self.settle(quiet))
            rec["ready"] = self.probe.first_after(rec["ref"])
            self.records.append(rec)
        self.t_end = time.time()
        self.lost_counts.append(self.declared_lost())

    def declared_lost(self) -> int:
        """ "node X lost: silent" lines in both masters' logs so far."""
        return self.cluster.logs_of_masters(tail=None).count(" lost: silent for ")

    def results(self) -> dict[str, Any]:
        """Stop the flow, wait for every job, and each fault's figures."""
        self._flowing.clear()
        time.sleep(1.0)  # a submit in flight lands
        self.users.finish()
        client = self.cluster.client()
        ids = [i for i in dict.fromkeys(self.ids) if i != self.follow_job]
        jobs = client.wait_all(ids, timeout=600)
        ticks_all = [
            ln for ln in client.logs(self.follow_job).splitlines() if ln.startswith("tick ")
        ]
        client.cancel(self.follow_job)
        client.cancel(self.chatter_job)
        self.probe.stop()
        self.nodes.stop()
        lines = self.lines()
        verdicts = report.classify_jobs(jobs, lines, self.acked_at, self.t_end)
        follow_starts = [t for jid, kind, t in lines if jid == self.follow_job and kind == "start"]
        report.per_fault(
            self.records, self.t_end, verdicts, lines, self.nodes.stretches,
            self.users.calls.rows, self.users.ticks, ticks_all, self.users.follow_exits,
            self.lost_counts, SLOW_S,
        )  # fmt: skip
        acked = set(ids)
        started = {jid for jid, kind, _ in lines if kind == "start"}
        return {
            "jobs_submitted": len(ids),
            "jobs_completed": sum(1 for j in jobs if j["state"] == "completed"),
            "jobs_started_unacknowledged": sorted(started - acked - {self.follow_job}),
            "follow_job_restarts": len(follow_starts) - 1,
            "verdicts_before_the_first_fault": {
                k: [jid for jid, t in v if t < self.records[0]["t0"]] for k, v in verdicts.items()
            },
            "jobs_with_a_verdict": report.job_details(jobs, verdicts),
            "table": report.summary(self.records),
            "user_errors": report.error_examples(self.records),
            "faults": self.records,
        }

    def stop(self) -> None:
        self._flowing.clear()
        with contextlib.suppress(AttributeError):
            self.users.finish()
            self.probe.stop()
            self.nodes.stop()
        self.rows.close()
        self.cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="each fault once, shorter stops")
    ap.add_argument("--repeat", type=int, default=3, help="random-moment runs of each fault")
    ap.add_argument("--worst", type=int, default=2, help="worst-moment runs of each fault")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", help="comma-separated fault kinds (e.g. stop,cut)")
    ap.add_argument(
        "--told-http",
        action="store_true",
        help="agents and users given http:// addresses (else they guess each loopback "
        "master's transport, as by default)",
    )
    ap.add_argument("--keep-logs", help="copy the masters' and agents' logs to this dir")
    ap.add_argument("--out", help="the JSON file (default bench/results/chaos_ha[-quick].json)")
    args = ap.parse_args()
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        print("PostgreSQL is not installed (scripts/install-system-deps.sh installs it)")
        return 2
    why = available_cut()
    if why:
        print(f"cannot cut a master off the database here ({why}); run as root")
        return 2
    faults = matrix(args.quick, args.repeat, args.worst)
    if args.only:
        kinds = set(args.only.split(","))
        faults = [f for f in faults if f.kind in kinds]
    name = "chaos_ha" + ("-quick" if args.quick else "") + ("-http" if args.told_http else "")
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "cluster": f"2 masters, {len(NODES)} agents x 4 fake GPUs, loopback",
        "postgresql": {"bin": str(bin_dir), "settings": PG_SETTINGS},
        "mode": "quick" if args.quick else f"full (repeat {args.repeat}, worst {args.worst})",
        "addresses": "told http://" if args.told_http else "bare (transport guessed)",
        "seed": args.seed,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    settings = {**PG_SETTINGS, "listen_addresses": "127.0.0.1,127.0.0.2,127.0.0.3"}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mgpu-chaos-ha-") as tmp:
        server = PgServer(bin_dir, settings=settings).start()
        bench = None
        try:
            bench = ChaosHa(Path(tmp), server, args.seed, args.told_http)
            bench.start()
            bench.run(faults, quiet=3.0 if args.quick else 5.0)
            result.update(bench.results())
        finally:
            if bench is not None and args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.keep_logs)
                shutil.copy(server.dir / "log", Path(args.keep_logs) / "postgresql.log")
            if bench is not None:
                for cut_ip in (0, 1):  # never leave a rule behind
                    Cut(server.port, cut_ip).heal()
                with contextlib.suppress(Exception):
                    for i in range(2):
                        bench.cluster.continue_master(i)
                bench.stop()
            server.stop()
    result["wall_s"] = round(time.time() - started, 1)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report.table(result["table"]))
    print(
        f"{result['jobs_submitted']} jobs, {result['jobs_completed']} completed; "
        f"the logs -f job restarted {result['follow_job_restarts']} times; "
        f"load {result['load_average_at_start']} -> {result['load_average_at_end']}"
    )
    for fault, errors in result["user_errors"].items():
        print(f"  {fault}: " + "; ".join(errors))
    print(f"written to {out}")
    bad = any(
        r["lost"] or r["run_twice"] or r["failed"] or r["restarted"] or r["nodes_declared_lost"]
        for r in result["table"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
