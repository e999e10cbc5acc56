"""Benchmark: one scheduling pass, 50,000 pending jobs over 1,000 nodes x 8 GPUs.

About a third of the nodes are partly busy and a tenth fully busy with running jobs; the
queue mixes job shapes (1-8 GPU jobs, a few gang and pinned jobs, several users).  Each
policy is timed over several passes, the decisions alone (the planner off,
`plan_jobs=0`); then backfill with the default estimate budget (`plan_jobs`,
`plan_seconds`), with how many waiting jobs got an estimate.

Then the same cluster and queue with CPUs and memory beside GPUs (issue 34): every node
offers 64 CPUs and 512G, the running jobs hold some of them, and half of the queue asks
for CPUs and memory (per GPU, per node, `--mem=0`, a few `--exclusive`), the rest nothing.
Each policy is timed on it in the same runs, interleaved with the GPU-only pass, and the
ratio of the medians is reported.  The medians are printed and written to
``bench/results/scheduler.json``.  No assertions: this reports figures.

    PYTHONPATH=src python bench/scheduler.py [--runs 7] [--pending 50000] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from factories import job, node
from factories import running as running_on
from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.scheduler import (
    JobRequest,
    NodeView,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from mgpu.scheduler.types import QueuePolicy

GPUS_PER_NODE = 8
CPUS_PER_NODE = 64
MEM_PER_NODE = 512 * 1024
USERS = [f"user{i:02d}" for i in range(40)]
ASKS = [
    ResourceAsk(cpus_per_gpu=8, mem_per_gpu_mb=64 * 1024),
    ResourceAsk(cpus_per_gpu=4, mem_per_gpu_mb=32 * 1024),
    ResourceAsk(cpus_per_gpu=6),
    ResourceAsk(cpus_per_node=16, mem_per_node_mb=128 * 1024),
    ResourceAsk(cpus_per_node=32, mem_per_cpu_mb=4096),
    ResourceAsk(mem_per_node_mb=0),
]


def _ask(rng: random.Random) -> ResourceAsk:
    """Half the queue asks nothing; of the rest, one in fifty asks for whole nodes.  Every
    ask fits a node (the master refuses one that never could at submit)."""
    roll = rng.random()
    if roll < 0.5:
        return NO_ASK
    if roll < 0.51:
        return ResourceAsk(exclusive=True)
    return rng.choice(ASKS)


def build(
    n_nodes: int, n_pending: int, seed: int = 1, idle: bool = False, mixed: bool = False
) -> Snapshot:
    """The model; `idle` leaves every GPU free (the pass then starts thousands of jobs);
    `mixed`: nodes with CPUs and memory, running jobs holding some, half the queue asking
    for them (the GPUs, jobs and everything else drawn exactly as without)."""
    asks = random.Random(seed + 1)  # apart: the GPU-only model stays the same draw
    rng = random.Random(seed)
    now = 1_000_000.0
    nodes: list[NodeView] = []
    running: list[RunningJob] = []
    for i in range(n_nodes):
        nid = f"node{i:04d}"
        all_gpus = tuple(range(GPUS_PER_NODE))
        roll = 1.0 if idle else rng.random()
        busy = (
            set(all_gpus)
            if roll < 0.1
            else set(rng.sample(all_gpus, rng.randint(1, 7)))
            if roll < 0.45
            else set()
        )
        held_cpus = held_mem = 0
        if mixed and busy:  # the running job holds up to its GPUs' share, or more
            held_cpus = min(CPUS_PER_NODE, len(busy) * asks.choice([0, 4, 8, 12]))
            held_mem = min(MEM_PER_NODE, len(busy) * asks.choice([0, 32, 64, 96]) * 1024)
        if busy:
            running.append(
                running_on(
                    f"run{i}",
                    nid,
                    sorted(busy),
                    now=now,
                    user=rng.choice(USERS),
                    started=rng.uniform(0, 20_000),
                    time_limit=rng.choice([3600.0, 4 * 3600.0, 24 * 3600.0]),
                    priority=rng.randint(-100, 100),  # the user's --priority
                    preemptible=rng.random() < 0.2,
                    cpus=held_cpus,
                    mem_mb=held_mem,
                )
            )
        free = set(all_gpus) - busy
        room: dict[str, int] = {}
        if mixed:
            room = {
                "cpus": CPUS_PER_NODE,
                "free_cpus": CPUS_PER_NODE - held_cpus,
                "mem_mb": MEM_PER_NODE,
                "free_mem_mb": MEM_PER_NODE - held_mem,
            }
        nodes.append(
            node(nid, free, gpus=GPUS_PER_NODE, gpu_type="a100", rack=f"rack{i // 40:02d}", **room)
        )
    pending: list[JobRequest] = []
    for j in range(n_pending):
        roll = rng.random()
        common: dict[str, Any] = {
            "job_id": f"job{j:06d}",
            "user": rng.choice(USERS),
            "submit": now - (n_pending - j) * 0.5,
            "time_limit": rng.choice([600.0, 3600.0, 4 * 3600.0, None]),
            "priority": rng.choice([0, 0, 0, 10, 100]),
        }
        if mixed:
            common["ask"] = _ask(asks)
        if roll < 0.02:
            pending.append(job(**common, gpus=32, nodes=4, gpus_per_node=8))
        elif roll < 0.03:
            nid = f"node{rng.randrange(n_nodes):04d}"
            pending.append(job(**common, gpus=2, node_gpu_ids=((nid, (0, 1)),)))
        else:
            gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
            pending.append(job(**common, gpus=gpus))
    return Snapshot(now=now, nodes=nodes, pending=pending, running=running)


def _configured(snapshot: Snapshot, policy: QueuePolicy, estimates: bool) -> Snapshot:
    config = SchedulerConfig(queue_policy=policy)
    if not estimates:
        config = replace(config, plan_jobs=0)
    return Snapshot(
        now=snapshot.now,
        nodes=snapshot.nodes,
        pending=snapshot.pending,
        running=snapshot.running,
        config=config,
    )


def time_pass(
    snapshot: Snapshot, policy: QueuePolicy, runs: int, estimates: bool = False
) -> dict[str, float | int]:
    return time_passes([snapshot], policy, runs, estimates)[0]


def time_passes(
    snapshots: list[Snapshot], policy: QueuePolicy, runs: int, estimates: bool = False
) -> list[dict[str, float | int]]:
    """Each snapshot's pass timed `runs` times, the snapshots taking turns in every run (so
    that a change in the machine's load weighs on each alike)."""
    snaps = [_configured(s, policy, estimates) for s in snapshots]
    times: list[list[float]] = [[] for _ in snaps]
    cpu: list[list[float]] = [[] for _ in snaps]
    decisions = [schedule(snap) for snap in snaps]  # warm-up
    for _ in range(runs):
        for k, snap in enumerate(snaps):
            t0, c0 = time.perf_counter(), time.thread_time()
            decisions[k] = schedule(snap)
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.thread_time() - c0)
    return [
        {
            "median_ms": round(statistics.median(times[k]) * 1000, 2),
            "median_cpu_ms": round(statistics.median(cpu[k]) * 1000, 2),
            "min_ms": round(min(times[k]) * 1000, 2),
            "max_ms": round(max(times[k]) * 1000, 2),
            "starts": len(decisions[k].starts),
            "reasons": len(decisions[k].reasons),
            "preempt": len(decisions[k].preempt),
            "estimates": len(decisions[k].expected_start),
        }
        for k in range(len(snaps))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--pending", type=int, default=50_000)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    snapshot = build(args.nodes, args.pending)
    free = sum(len(n.free_gpus) for n in snapshot.nodes)
    print(
        f"{args.pending} pending, {args.nodes} nodes x {GPUS_PER_NODE} GPUs "
        f"({free} free, {len(snapshot.running)} running jobs), {args.runs} runs, "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    results: dict[str, object] = {
        "pending": args.pending,
        "nodes": args.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "free_gpus": free,
        "running_jobs": len(snapshot.running),
        "runs": args.runs,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "policies": {},
    }
    policies: dict[str, object] = {}
    for policy in ("fifo", "priority", "backfill"):
        figures = time_pass(snapshot, policy, args.runs)  # type: ignore[arg-type]
        policies[policy] = figures
        print(
            f"  {policy:9s} median {figures['median_ms']:8.2f} ms  "
            f"(min {figures['min_ms']}, max {figures['max_ms']}; "
            f"CPU median {figures['median_cpu_ms']})  "
            f"starts {figures['starts']}, preempt {figures['preempt']}"
        )
    results["policies"] = policies
    figures = time_pass(snapshot, "backfill", args.runs, estimates=True)
    results["backfill_with_estimates"] = {
        **figures,
        "plan_jobs": SchedulerConfig().plan_jobs,
        "plan_seconds": SchedulerConfig().plan_seconds,
    }
    print(
        f"  backfill + estimates: median {figures['median_ms']:8.2f} ms  "
        f"(min {figures['min_ms']}, max {figures['max_ms']}; "
        f"CPU median {figures['median_cpu_ms']})  estimates {figures['estimates']}"
    )
    idle = build(args.nodes, args.pending, idle=True)
    figures = time_pass(idle, "backfill", args.runs)
    results["idle_cluster_backfill"] = figures
    print(
        f"  idle cluster, backfill: median {figures['median_ms']:8.2f} ms  "
        f"(min {figures['min_ms']}, max {figures['max_ms']})  starts {figures['starts']}"
    )
    results["cpus_and_memory"] = _mixed(args, snapshot)
    out = Path(__file__).resolve().parent / "results" / "scheduler.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)


def _mixed(args: argparse.Namespace, gpu_only: Snapshot) -> dict[str, object]:
    """The same cluster and queue with CPUs and memory beside GPUs, timed against the
    GPU-only pass in the same runs."""
    mixed = build(args.nodes, args.pending, mixed=True)
    asking = sum(1 for j in mixed.pending if j.asks)
    print(
        f"with CPUs and memory ({CPUS_PER_NODE} CPUs, {MEM_PER_NODE // 1024}G per node; "
        f"{asking} of {args.pending} jobs ask for them), interleaved with the GPU-only pass, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    out: dict[str, object] = {
        "cpus_per_node": CPUS_PER_NODE,
        "mem_per_node_mb": MEM_PER_NODE,
        "asking_jobs": asking,
        "load_average_1m": os.getloadavg()[0],
    }
    # The ratio is of CPU times: on a shared machine the wall time also counts the others.
    rows: list[tuple[str, QueuePolicy, bool]] = [
        ("fifo", "fifo", False),
        ("priority", "priority", False),
        ("backfill", "backfill", False),
        ("backfill_with_estimates", "backfill", True),
    ]
    for name, policy, estimates in rows:
        plain, figures = time_passes([gpu_only, mixed], policy, args.runs, estimates)
        ratio = round(float(figures["median_cpu_ms"]) / float(plain["median_cpu_ms"]), 2)
        out[name] = {
            **figures,
            "gpu_only_median_ms": plain["median_ms"],
            "gpu_only_median_cpu_ms": plain["median_cpu_ms"],
            "cpu_ratio": ratio,
        }
        print(
            f"  {name:23s} CPU median {figures['median_cpu_ms']:7.2f} ms "
            f"(GPU-only {plain['median_cpu_ms']} ms, x{ratio}); wall median "
            f"{figures['median_ms']} ms (GPU-only {plain['median_ms']}); starts "
            f"{figures['starts']} (GPU-only {plain['starts']}), estimates {figures['estimates']}"
        )
    return out


if __name__ == "__main__":
    main()
