"""Submit-to-running latency and end-to-end throughput on an idle local cluster.

4 agents x 4 fake GPUs on this machine, driven through the Python client:

(a) latency: 200 jobs submitted one at a time, each waited for; the figure is the
    job's start_time (when the agent had started the process) minus its
    submit_time, both stamped on this machine's clock;
(b) throughput: 1000 `true` jobs, wall time from the first submit to the last
    completion; three rounds, the median quoted (this VM's timings wander by ±15 %).
    Three ways: "serial", one client thread submitting one job after another (each
    submit a round trip, so the client itself sets a floor); "threaded", 8 client
    threads at once (as many users would; submits then share the master's commits);
    "array", one 1000-task job array (Slurm's high-throughput advice);
(c) the floor: a bare `subprocess.run(["true"])` in the same run;
(d) CPU time a job during (b), by process: the master, the agents (with their spawners),
    the jobs' own processes (shims and `true`, reaped by the agents or spawners) and this
    client; with the load average, since this 2-core VM is shared.

BENCH_USER=nobody runs (b) as that account (a root agent then starts the jobs through its
spawner, as for any user's jobs on a real node; the default runs them as root).

Prints the figures and writes bench/results/latency.json.  Not a test.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from mgpu import Client
from mgpu.testing import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "latency.json"
ROUNDS = int(os.environ.get("BENCH_THROUGHPUT_ROUNDS", 3))
THREADS = 8
MODES = ("serial", "threaded", "array")
JOB: dict[str, object] = {"gpus": 1, "env": {}, "cwd": "/"}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def floor_subprocess(n: int = 200) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_latency(client: Client, n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        job = client.submit(["true"], gpus=1, env={})
        done = client.wait(job.id, timeout=60)
        assert done["state"] == "completed", done
        latencies.append(done["start_time"] - done["submit_time"])
    return latencies


def cpu_by_role(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of the master, the agents (and their spawners), the jobs' own
    processes (children the agents and spawners reaped) and this process."""
    out = {"master": 0.0, "agents": 0.0, "jobs": 0.0, "client": 0.0}
    assert cluster.master is not None
    procs = [("master", psutil.Process(cluster.master.pid))]
    for agent in cluster.agents.values():
        proc = psutil.Process(agent.pid)
        procs += [("agents", proc)] + [("agents", child) for child in proc.children()]
    for role, proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        out[role] += t.user + t.system
        out["jobs"] += t.children_user + t.children_system
    me = psutil.Process().cpu_times()
    out["client"] = me.user + me.system
    return out


def submit_serial(client: Client, n: int) -> list[str]:
    return [client.submit(["true"], **JOB).id for _ in range(n)]


def submit_threaded(make_client: Callable[[], Client], n: int) -> list[str]:
    """`n` jobs from THREADS threads, each with its own client (connection)."""
    ids: list[list[str]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def submit(k: int) -> None:
        try:
            with make_client() as client:
                for _ in range(n // THREADS + (k < n % THREADS)):
                    ids[k].append(client.submit(["true"], **JOB).id)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=submit, args=(k,)) for k in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return [i for chunk in ids for i in chunk]


def submit_array(client: Client, n: int) -> list[str]:
    job = client.submit(["true"], array=f"0-{n - 1}", **JOB)
    assert job.task_ids is not None and len(job.task_ids) == n, job
    return list(job.task_ids)


def bench_throughput(
    cluster: LocalCluster, client: Client, submit: Callable[[], list[str]], n: int
) -> tuple[float, dict[str, float]]:
    """Wall seconds for the `n` jobs `submit` queues, and CPU ms a job by role (and the
    load average)."""
    load = os.getloadavg()[0]
    before = cpu_by_role(cluster)
    t0 = time.perf_counter()
    ids = submit()
    for done in client.wait_all(ids, timeout=300):
        assert done["state"] == "completed", done
    wall = time.perf_counter() - t0
    after = cpu_by_role(cluster)
    cpu = {role: round((after[role] - before[role]) * 1000 / n, 2) for role in after}
    cpu["total"] = round(sum(cpu.values()), 2)
    cpu["load"] = round(max(load, os.getloadavg()[0]), 2)
    return wall, cpu


def median_rounds(rounds: list[tuple[float, dict[str, float]]], n: int) -> dict[str, object]:
    walls = [w for w, _ in rounds]
    wall = statistics.median(walls)
    cpu = {role: round(statistics.median(c[role] for _, c in rounds), 2) for role in rounds[0][1]}
    return {
        "wall_s": round(wall, 3),
        "rounds_wall_s": [round(w, 3) for w in walls],
        "jobs_per_s": round(n / wall, 1),
        "cpu_ms_per_job": cpu,
        "rounds_cpu_ms_per_job": [c for _, c in rounds],
    }


def main() -> None:
    n_latency = int(os.environ.get("BENCH_LATENCY_JOBS", 200))
    n_throughput = int(os.environ.get("BENCH_THROUGHPUT_JOBS", 1000))
    modes = os.environ.get("BENCH_MODES", ",".join(MODES)).split(",")
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-") as tmp:
        cluster = LocalCluster(Path(tmp))
        try:
            cluster.start_master()
            for i in range(1, 5):
                cluster.start_agent(f"node{i:03d}", gpus=4)
            with cluster.client() as client:
                bench_latency(client, 20)  # warm-up
                latencies = bench_latency(client, n_latency)
                user = os.environ.get("BENCH_USER")
                token = client.create_token(user)["token"] if user else client.token

                def make_client() -> Client:
                    return Client(cluster.address, token=token)

                runner = make_client()
                submits: dict[str, Callable[[], list[str]]] = {
                    "serial": lambda: submit_serial(runner, n_throughput),
                    "threaded": lambda: submit_threaded(make_client, n_throughput),
                    "array": lambda: submit_array(runner, n_throughput),
                }
                throughput = {}
                for mode in modes:
                    rounds = [
                        bench_throughput(cluster, runner, submits[mode], n_throughput)
                        for _ in range(ROUNDS)
                    ]
                    throughput[mode] = median_rounds(rounds, n_throughput)
        finally:
            cluster.stop()
    floor = floor_subprocess()
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "cluster": "4 agents x 4 fake GPUs, loopback",
        "throughput_user": os.environ.get("BENCH_USER") or "root",
        "latency_jobs": n_latency,
        "submit_to_running_ms": {
            "p50": round(statistics.median(latencies) * 1000, 2),
            "p99": round(percentile(latencies, 99) * 1000, 2),
            "mean": round(statistics.fmean(latencies) * 1000, 2),
        },
        "throughput_jobs": n_throughput,
        "throughput_threads": THREADS,
        "throughput": throughput,
        "floor_subprocess_run_true_ms": round(floor * 1000, 3),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    lat = result["submit_to_running_ms"]
    print(
        f"submit->running latency over {n_latency} jobs: p50 {lat['p50']} ms, p99 {lat['p99']} ms"
    )
    for mode, got in throughput.items():
        cpu = got["cpu_ms_per_job"]
        assert isinstance(cpu, dict)
        print(
            f"throughput, {mode}: {n_throughput} jobs in {got['wall_s']:.2f} s = "
            f"{got['jobs_per_s']} jobs/s end to end (median of {ROUNDS}: "
            + ", ".join(f"{w:.2f}" for w in got["rounds_wall_s"])  # type: ignore[attr-defined]
            + " s); CPU a job: "
            + ", ".join(f"{role} {ms} ms" for role, ms in cpu.items() if role != "load")
            + f" (load average up to {cpu['load']})"
        )
    print(f"floor: subprocess.run(['true']) median {result['floor_subprocess_run_true_ms']} ms")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
