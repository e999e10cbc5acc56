"""Chaos: short jobs on a local cluster while the master and a node are killed -9.

500 jobs (0.2-1 s each, 1 GPU) over 4 agents x 4 fake GPUs on loopback.  While they
run, the script kills -9 the master twice (restarted at once on the same state dir)
and one node three times: its agent *and* its jobs, as when a machine dies; the node
is restarted (same agent state dir) once the master has declared it offline.  The
moments are seeded-random fractions of the jobs completed.

Each job takes a lock the kernel drops when the holder dies and records a "double" if
the lock is already held, so two copies running at once are seen by the jobs
themselves; attempts that overlap in time are counted too.  Each job prints one line
tagged with its shim's pid, so output can be checked per attempt: no line twice, and
the last attempt's line present.

Prints and writes bench/results/chaos.json: jobs submitted, completed, lost (must be
0), run twice at once (must be 0), output problems (must be 0), time to detect a dead
node (kill -> requeue of its jobs, and kill -> node seen offline) and time from
detection to the job running again.  Not a test.

    python bench/chaos.py   [BENCH_CHAOS_SEED=4 BENCH_CHAOS_JOBS=500]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from mgpu.testing import LocalCluster, wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "chaos.json"
NODES = ("node001", "node002", "node003", "node004")
GPUS = 4
HEARTBEAT, TIMEOUT, BACKOFF = 0.5, 5.0, 1.0
CONFIG = f"""
networking:
  heartbeat_interval: {HEARTBEAT}
  timeout: {TIMEOUT}
scheduling:
  retry_backoff_base: {BACKOFF}
"""


def stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def processes_with(*tags: str) -> list[int]:
    want = [t.encode() for t in tags]
    found = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if all(t in env for t in want):
            found.append(pid)
    return found


class Chaos:
    def __init__(self, root: Path, seed: int, n_jobs: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.n_jobs = n_jobs
        self.cluster = LocalCluster(root, CONFIG)
        self.tag = f"CHAOS_TAG={root}"
        self.locks = root / "locks"
        self.doubles = root / "doubles"
        self.ids: list[str] = []
        self.events: list[dict[str, Any]] = []

    # ---- processes -----------------------------------------------------------

    def start(self) -> None:
        self.locks.mkdir()
        self.cluster.start_master()
        for n in NODES:
            self.cluster.start_agent(n, gpus=GPUS, wait=False)
        for n in NODES:
            self.cluster.wait_node(n, "online")

    def stop(self) -> None:
        self.cluster.stop()
        for pid in processes_with(self.tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def kill_master(self) -> None:
        c = self.cluster
        assert c.master is not None
        t0 = time.time()
        os.killpg(c.master.pid, signal.SIGKILL)
        c.master.wait(timeout=10)
        c.start_master()
        up = time.time()
        for n in NODES:
            c.wait_node(n, "online", timeout=60)
        self.events.append(
            {
                "event": "kill -9 master",
                "at": round(t0, 3),
                "master_back_s": round(up - t0, 3),
                "all_agents_back_s": round(time.time() - t0, 3),
            }
        )

    def kill_node(self, node: str) -> None:
        """The machine dies: its agent and every job process on it."""
        c = self.cluster
        client = c.client()

        def busy() -> list[str] | None:
            (n,) = [n for n in client.nodes() if n["node_id"] == node]
            return list(n["jobs"]) or None

        with contextlib.suppress(AssertionError):
            wait_for(busy, timeout=10, what=f"{node} running jobs")
        running = busy() or []
        t_kill = time.time()
        os.killpg(c.agents[node].pid, signal.SIGKILL)
        c.agents[node].wait(timeout=10)
        for pid in processes_with(self.tag, f"MGPU_NODE_ID={node}"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        c.wait_node(node, "offline", timeout=TIMEOUT + 30)
        t_offline = time.time()
        lost_reason = f"node {node} lost"

        def rerun_times() -> tuple[list[tuple[float, float]]] | None:
            out: list[tuple[float, float]] = []
            for job_id in running:
                job = client.show(job_id)
                for k, a in enumerate(job["attempts"]):
                    if a["end_reason"] == lost_reason and a["end_time"] >= t_kill:
                        nxt = job["attempts"][k + 1] if k + 1 < len(job["attempts"]) else None
                        if nxt is None or nxt["start_time"] is None:
                            return None  # not running again yet
                        out.append((a["end_time"], nxt["start_time"]))
            return (out,)  # a tuple: true even when no job was lost

        (reruns,) = wait_for(rerun_times, timeout=120, interval=0.1, what="requeued jobs rerun")
        c.start_agent(node, gpus=GPUS)
        self.events.append(
            {
                "event": f"kill -9 {node} (agent and its jobs)",
                "at": round(t_kill, 3),
                "jobs_running_there": len(running),
                "detect_offline_seen_s": round(t_offline - t_kill, 3),
                "detect_requeue_s": [round(end - t_kill, 3) for end, _ in reruns],
                "detection_to_running_again_s": [round(s - end, 3) for end, s in reruns],
            }
        )

    # ---- the run ---------------------------------------------------------------

    def submit_all(self) -> None:
        client = self.cluster.client()
        env = {"CHAOS_TAG": str(self.root), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for _ in range(self.n_jobs):
            duration = round(self.rng.uniform(0.2, 1.0), 2)
            script = (
                f"exec 9>{self.locks}/$MGPU_JOB_ID; "
                f"flock -n 9 || echo $MGPU_JOB_ID >> {self.doubles}; "
                f"echo out-$MGPU_JOB_ID-$PPID; sleep {duration}"
            )
            self.ids.append(client.submit(script, gpus=1, env=env).id)

    def completed(self) -> int:
        jobs = self.cluster.client().queue(all=True)["jobs"]
        return sum(1 for j in jobs if j["state"] == "completed")

    def run(self) -> dict[str, Any]:
        victim = self.rng.choice(NODES)
        kinds = ["master", "master", "node", "node", "node"]
        self.rng.shuffle(kinds)
        moments = sorted(self.rng.uniform(0.05, 0.8) for _ in kinds)
        plan = list(zip(moments, kinds, strict=True))
        t0 = time.time()
        self.submit_all()
        submitted_s = time.time() - t0
        for fraction, kind in plan:
            threshold = int(fraction * self.n_jobs)
            wait_for(
                lambda threshold=threshold: self.completed() >= threshold,
                timeout=600,
                interval=0.05,
                what=f"{threshold} jobs completed",
            )
            time.sleep(self.rng.uniform(0.0, 0.5))  # a random moment, not a quiet one
            if kind == "master":
                self.kill_master()
            else:
                self.kill_node(victim)
        jobs = self.cluster.client().wait_all(self.ids, timeout=900)
        wall = time.time() - t0
        return self.analyse(jobs, wall, submitted_s, victim)

    def analyse(
        self, jobs: list[dict[str, Any]], wall: float, submitted_s: float, victim: str
    ) -> dict[str, Any]:
        client = self.cluster.client()
        completed = [j for j in jobs if j["state"] == "completed"]
        doubles = set(self.doubles.read_text().split()) if self.doubles.exists() else set()
        overlapping = set()
        output_problems = {}
        for j in jobs:
            spans = sorted(
                (a["start_time"], a["end_time"] or float("inf"))
                for a in j["attempts"]
                if a["start_time"] is not None
            )
            if any(s2 < e1 for (_, e1), (s2, _) in itertools.pairwise(spans)):
                overlapping.add(j["id"])
            lines = client.logs(j["id"]).splitlines()
            final = f"out-{j['id']}-{j['allocation'][0]['pid']}" if j["allocation"] else None
            if len(lines) != len(set(lines)) or (
                j["state"] == "completed" and lines.count(final) != 1
            ):
                output_problems[j["id"]] = lines
        node_events = [e for e in self.events if e["event"].startswith("kill -9 node")]
        detect = [min(e["detect_requeue_s"]) for e in node_events if e["detect_requeue_s"]]
        seen = [e["detect_offline_seen_s"] for e in node_events]
        again = [x for e in node_events for x in e["detection_to_running_again_s"]]
        return {
            "machine": {
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
                "platform": platform.platform(),
            },
            "cluster": f"{len(NODES)} agents x {GPUS} fake GPUs, loopback",
            "config": {
                "heartbeat_interval_s": HEARTBEAT,
                "timeout_s": TIMEOUT,
                "retry_backoff_base_s": BACKOFF,
            },
            "killed_node": victim,
            "jobs_submitted": len(self.ids),
            "jobs_completed": len(completed),
            "jobs_lost": len(self.ids) - len(completed),
            "jobs_not_completed": {j["id"]: j["state"] for j in jobs if j not in completed},
            "jobs_run_twice_at_once": len(doubles | overlapping),
            "output_problems": len(output_problems),
            "output_problem_jobs": output_problems,
            "jobs_requeued": sum(1 for j in jobs if j["retries"]),
            "time_to_detect_dead_node_s": stats(detect),
            "time_to_see_node_offline_s": stats(seen),
            "detection_to_running_again_s": stats(again),
            "submit_s": round(submitted_s, 3),
            "wall_s": round(wall, 3),
            "events": self.events,
        }


def main() -> int:
    seed = int(os.environ.get("BENCH_CHAOS_SEED", 4))
    n_jobs = int(os.environ.get("BENCH_CHAOS_JOBS", 500))
    with tempfile.TemporaryDirectory(prefix="mgpu-chaos-") as tmp:
        chaos = Chaos(Path(tmp), seed, n_jobs)
        try:
            chaos.start()
            result = chaos.run()
        finally:
            chaos.stop()
    result["seed"] = seed
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['jobs_submitted']} jobs submitted, {result['jobs_completed']} completed, "
        f"{result['jobs_lost']} lost, {result['jobs_run_twice_at_once']} run twice at once, "
        f"{result['output_problems']} with output problems "
        f"({result['jobs_requeued']} requeued) in {result['wall_s']} s"
    )
    print(f"time to detect a dead node (kill -> requeue): {result['time_to_detect_dead_node_s']}")
    print(f"time to see it offline (kill -> `nodes`): {result['time_to_see_node_offline_s']}")
    print(f"detection -> running again: {result['detection_to_running_again_s']}")
    print(f"written to {RESULTS}")
    bad = result["jobs_lost"] or result["jobs_run_twice_at_once"] or result["output_problems"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
