"""Benchmark: place a 16-node x 8-GPU gang job on a 1,000-node model with 10,000 queued jobs.

Two figures:

* ``place`` — one call of the placement function for the gang job on the free-GPU index
  of 1,000 nodes x 8 GPUs (about half the nodes partly busy, spread over 25 racks);
* ``pass`` — a whole scheduling pass (backfill policy) in which that gang job heads a
  queue of 10,000 jobs, so it is placed first and the other jobs are scheduled after it;
  timed with the decisions alone (the planner off) and with the default estimate budget.

Also a gang job that does *not* fit (every node partly busy) is placed, to show that an
impossible gang is rejected quickly.  The medians of several runs are printed and written
to ``bench/results/placement.json``.  No assertions: this reports figures.

    PYTHONPATH=src python bench/placement.py [--runs 21]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from factories import job, node
from factories import running as running_on
from mgpu.scheduler import (
    FreePool,
    SchedulerConfig,
    Snapshot,
    place,
    schedule,
)

N_NODES = 1000
GPUS = 8
QUEUED = 10_000


def build(seed: int = 7, busy_fraction: float = 0.5) -> Snapshot:
    rng = random.Random(seed)
    now = 1_000_000.0
    nodes = []
    running = []
    for i in range(N_NODES):
        nid = f"node{i:04d}"
        gpus = tuple(range(GPUS))
        busy: set[int] = set()
        if rng.random() < busy_fraction:
            busy = set(rng.sample(gpus, rng.randint(1, GPUS)))
            running.append(
                running_on(
                    f"run{i}",
                    nid,
                    sorted(busy),
                    now=now,
                    started=100,
                    time_limit=3600.0,
                    user="other",
                )
            )
        nodes.append(node(nid, set(gpus) - busy, gpus=GPUS, rack=f"rack{i // 40:02d}"))
    gang = job("gang", submit=now - 10, gpus=16 * GPUS, nodes=16, gpus_per_node=GPUS, priority=1000)
    queued = [gang] + [
        job(f"q{j}", user=f"user{j % 20}", submit=now - j, gpus=rng.choice([1, 2, 4, 8]))
        for j in range(QUEUED - 1)
    ]
    return Snapshot(now=now, nodes=nodes, pending=queued, running=running)


def timed(fn: Callable[[], object], runs: int) -> dict[str, float]:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {
        "median_ms": round(statistics.median(times) * 1000, 3),
        "min_ms": round(min(times) * 1000, 3),
        "max_ms": round(max(times) * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()

    snap = build()
    gang = snap.pending[0]
    whole = sum(1 for n in snap.nodes if len(n.free_gpus) == GPUS)
    print(f"{N_NODES} nodes x {GPUS} GPUs, {whole} wholly free; {QUEUED} queued; {args.runs} runs")

    pool = FreePool(snap.nodes)
    got = place(gang, pool, "fill_first")
    racks = sorted({snap.nodes[int(p.node_id[4:])].rack or "" for p in got or ()})
    place_figures = timed(lambda: place(gang, pool, "fill_first"), args.runs)
    print(f"  place 16x8 gang      median {place_figures['median_ms']:8.3f} ms  racks {racks}")

    cfg = SchedulerConfig(queue_policy="backfill", plan_jobs=0)
    full = Snapshot(snap.now, snap.nodes, snap.pending, snap.running, config=cfg)
    decisions = schedule(full)
    gang_started = any(s.job_id == "gang" for s in decisions.starts)
    pass_figures = timed(lambda: schedule(full), max(5, args.runs // 3))
    print(
        f"  pass, gang + {QUEUED - 1} queued median {pass_figures['median_ms']:8.3f} ms  "
        f"(gang started: {gang_started}, {len(decisions.starts)} starts)"
    )
    planned = Snapshot(snap.now, snap.nodes, snap.pending, snap.running)
    estimates = len(schedule(planned).expected_start)
    plan_figures = timed(lambda: schedule(planned), max(5, args.runs // 3))
    print(
        f"  pass with estimates  median {plan_figures['median_ms']:8.3f} ms  "
        f"({estimates} estimates within the default budget)"
    )

    crowded = build(busy_fraction=1.0)
    crowded_pool = FreePool(crowded.nodes)
    no_fit = timed(lambda: place(gang, crowded_pool, "fill_first"), args.runs)
    print(f"  place, cannot fit    median {no_fit['median_ms']:8.3f} ms")

    results = {
        "nodes": N_NODES,
        "gpus_per_node": GPUS,
        "queued": QUEUED,
        "wholly_free_nodes": whole,
        "runs": args.runs,
        "python": platform.python_version(),
        "place_gang": {**place_figures, "racks": racks},
        "schedule_pass": {**pass_figures, "gang_started": gang_started},
        "schedule_pass_with_estimates": {**plan_figures, "estimates": estimates},
        "place_gang_no_fit": no_fit,
    }
    out = Path(__file__).resolve().parent / "results" / "placement.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
