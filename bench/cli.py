"""The CLI as whole processes: how long `mgpu queue` and `mgpu show` take, start to exit.

A local cluster (master + 2 agents x 4 fake GPUs) holding a few jobs of each kind (running,
queued, ended, an array); then each command is run RUNS times as a fresh process, the
commands interleaved so that the machine's load falls on all of them alike:

- `python -c pass`: the floor (the interpreter and its site start-up, nothing of mgpu);
- `mgpu queue`, `mgpu queue --json`, `mgpu show ID`, through the console script
  `.venv/bin/mgpu` as a user runs it, and `python -m mgpu queue`;
- the master's own answer time for `GET /api/jobs` and `GET /api/jobs/ID` (an in-process
  client on a kept-alive connection), the part of each figure the client cannot trim.

Bytecode is written first (a warm-up run without PYTHONDONTWRITEBYTECODE), as `pip install`
leaves it.  Prints the medians and writes bench/results/cli.json.  Not a test.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu.testing import BIN, LocalCluster, wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "cli.json"
RUNS = int(os.environ.get("BENCH_CLI_RUNS", 30))


def populate(cluster: LocalCluster) -> str:
    """A queue worth showing: 8 running, some queued, some ended, an array; returns a job id."""
    client = cluster.client()
    ended = [client.submit(["true"], gpus=1, env={}, name=f"done{i}").id for i in range(4)]
    client.wait_all(ended, timeout=60)
    running = [client.submit(["sleep", "600"], gpus=1, env={}, name=f"run{i}") for i in range(8)]
    for i in range(6):
        client.submit(["sleep", "600"], gpus=2, env={}, name=f"wait{i}")
    client.submit(["sleep", "600"], gpus=1, env={}, array="0-19", name="sweep")
    ids = [j.id for j in running]
    wait_for(lambda: all(client.show(i)["state"] == "running" for i in ids), what="8 running jobs")
    return ids[0]


def time_process(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{argv} failed: {res.stderr.decode(errors='replace')}")
    return elapsed


def server_time(cluster: LocalCluster, job_id: str, n: int = 100) -> dict[str, float]:
    with cluster.client() as client:
        out = {}
        calls: dict[str, Callable[[], object]] = {
            "queue": client.queue,
            "show": lambda: client.show(job_id),
        }
        for name, call in calls.items():
            call()  # the connection, once
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            out[name] = round(statistics.median(times) * 1000, 2)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-cli-") as tmp:
        cluster = LocalCluster(Path(tmp))
        try:
            cluster.start_master()
            for i in (1, 2):
                cluster.start_agent(f"node{i:03d}", gpus=4)
            job_id = populate(cluster)
            mgpu = str(BIN / "mgpu")
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "mgpu queue": [mgpu, "queue"],
                "mgpu queue --json": [mgpu, "queue", "--json"],
                "mgpu show ID": [mgpu, "show", job_id],
                "python -m mgpu queue": [sys.executable, "-m", "mgpu", "queue"],
            }
            env = dict(cluster.env)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            for argv in commands.values():  # bytecode written, caches warm
                time_process(argv, env)
            times: dict[str, list[float]] = {name: [] for name in commands}
            load_before = os.getloadavg()[0]
            for _ in range(RUNS):
                for name, argv in commands.items():
                    times[name].append(time_process(argv, env))
            load_after = os.getloadavg()[0]
            answer = server_time(cluster, job_id)
            queue_bytes = len(cluster.cli("queue", "--json", check=True).stdout)
        finally:
            cluster.stop()
    medians = {name: round(statistics.median(t) * 1000, 1) for name, t in times.items()}
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "cluster": "master + 2 agents x 4 fake GPUs, loopback; 8 running, 26 queued, 4 ended",
        "runs": RUNS,
        "load_average_1min": [round(load_before, 2), round(load_after, 2)],
        "median_ms": medians,
        "min_ms": {name: round(min(t) * 1000, 1) for name, t in times.items()},
        "master_answer_ms": answer,
        "queue_json_bytes": queue_bytes,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    width = max(map(len, medians))
    print(f"whole processes, median (min) of {RUNS} runs; load average {load_before:.1f}")
    for name, ms in medians.items():
        print(f"  {name.ljust(width)}  {ms:6.1f} ms  ({result['min_ms'][name]:.1f})")
    print(f"the master's answer alone: queue {answer['queue']} ms, show {answer['show']} ms")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
