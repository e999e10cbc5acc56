"""Benchmark: the cost of one scheduling pass against the number of running jobs.

Builds the master's controller in process (tests/controller/harness.py: the real `Cluster`
on an in-memory store, fake agents) with 1,000 nodes x 8 GPUs, every GPU held by running
jobs (8,000 one-GPU jobs, or 100 jobs of 10 nodes x 8 GPUs), of a few users with mixed
time limits, a quarter of them preemptible; then 0, 100, 5,000 or 100,000 jobs queued
(1-4 GPUs, mixed limits).  It times the pass the loop runs at an event (`tick`: a full
pass on the loop for a short queue, a quick pass over the head of a long one) and the core
of a full pass (`decide`: eligibility, priorities, reasons, estimates), as medians of
wall (perf_counter) and CPU (process_time) time.  The queued jobs' `--priority` is below the
running ones' (-1,000 against 1,000), so the blocked head waits; the "preempting" cases
with 5,000 queued put it above (1,000 against 0), so the head preempts (the pass then
weighs every preemptible running job).  `--profile` prints where a pass's time goes
(cProfile).  Prints the figures and writes ``bench/results/pass_running.json``.

    .venv/bin/python bench/pass_running.py [--runs 9] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "controller"))

from harness import Harness, _run

from mgpu.master.control import loop as loopmod
from mgpu.model import JobState

RESULTS = Path(__file__).resolve().parent / "results" / "pass_running.json"
NODES = 1000
GPUS = 8
USERS = ["alice", "bob", "carol", "dave"]
LIMITS = ["1:00:00", "4:00:00", "1-00:00:00", "30:00"]
ARRAY = 10_000


def _specs(count: int, priority: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """`count` jobs as arrays, (tasks, fields) each: as many per user, limits mixed."""
    out = []
    for u, user in enumerate(USERS):
        mine = count // len(USERS) + (u < count % len(USERS))
        for t, limit in enumerate(LIMITS):
            n = mine // len(LIMITS) + (t < mine % len(LIMITS))
            kind = {"user": user, "time": limit, "preemptible": t == u, "priority": priority}
            out += [(min(ARRAY, n - k), kind) for k in range(0, n, ARRAY)]
    return out


def submit(h: Harness, count: int, shape: dict[str, Any], priority: int = 0) -> None:
    for n, kind in _specs(count, priority):
        fields = {**shape, **kind}
        user = fields.pop("user")
        if n == 1:
            h.submit("true", user=user, **fields)
        else:
            h.submit("true", user=user, array=f"0-{n - 1}", **fields)


def build(running: int, queued: int, preempt: bool = False) -> Harness:
    """The master with every GPU held by `running` jobs and `queued` jobs waiting."""
    h = Harness(Path(tempfile.mkdtemp(prefix="mgpu-pass-")))
    for i in range(NODES):
        h.agent(f"node{i:04d}", gpus=GPUS)
    loop = h.cl.loop
    loop.limits.long_queue = 10**9  # one full pass starts them all
    each = NODES * GPUS // running
    shape: dict[str, Any] = (
        {"gpus": each} if each <= GPUS else {"nodes": each // GPUS, "gpus_per_node": GPUS}
    )
    submit(h, running, shape, 0 if preempt else 1000)
    h.tick()
    jobs = [j for j in h.cl.state.jobs.values() if j.state is JobState.RUNNING]
    assert len(jobs) == running, (len(jobs), running)
    # Started in a random order: each user's start times spread alike, so users' usage (and
    # fairshare) stays near equal and the head preempts only when `preempt` says so.
    random.Random(1).shuffle(jobs)
    for k, job in enumerate(jobs):
        if k % 50 == 0:
            h.advance(7.0)  # start times spread over a while
        first = h.agents[job.allocation[0].node_id]
        if first.port_requests():
            first.port(job.id)
        for slot in job.allocation:
            if slot.phase.value == "sent":
                h.agents[slot.node_id].started(job.id)
    assert all(j.start_time is not None for j in jobs)
    loop.limits.long_queue = loopmod.LONG_QUEUE
    h.advance(60.0)
    for node in h.cl.state.nodes.values():  # heard from (the fake agents send no heartbeats)
        node.heard_now(h.clock)
    for n in range(0, queued, 4 * ARRAY):
        for gpus in (1, 2, 4, 1):
            left = min(ARRAY, queued - n)
            if left > 0:
                submit(h, left, {"gpus": gpus}, 1000 if preempt else -1000)
                n += ARRAY
    if loop.long:
        _run(loop.full_pass(offload=False))
    h.tick()
    for agent in h.agents.values():
        agent.link.take()
    return h


def timed(fn: Callable[[], object], runs: int) -> dict[str, float]:
    walls, cpus = [], []
    fn()  # warm-up (caches)
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "median_ms": round(statistics.median(walls) * 1000, 2),
        "median_cpu_ms": round(statistics.median(cpus) * 1000, 2),
        "min_ms": round(min(walls) * 1000, 2),
    }


def event_pass(h: Harness, preempt: bool, estimates: bool | None = None) -> Callable[[], object]:
    """The pass the loop runs at an event (its plan; applied unless it preempts): for a short
    queue, with estimates when `tick` would make them (few running), or as `estimates` says."""
    loop = h.cl.loop
    if estimates is None:
        estimates = len(loop.running.refresh(h.clock.now)) <= loop.limits.estimate_running

    def run() -> object:
        plan = loop.quick_plan() if loop.long else loop.plan(estimates)
        if plan.decisions is not None:
            assert not plan.decisions.starts, "the cluster is full: nothing may start"
            assert bool(plan.decisions.preempt) == preempt, plan.decisions.preempt
        if not preempt:
            loop.apply(plan)
        return plan

    return run


def full_core(h: Harness) -> Callable[[], object]:
    """A full pass's core on inputs gathered once (what runs in the worker thread)."""
    loop = h.cl.loop
    now = h.clock.now
    queued = loop.queued_requests(now, list(h.cl.state.jobs.values()))
    inputs = loop.inputs(now, queued, thread=True)
    return lambda: loopmod.decide(inputs)


def profile(fn: Callable[[], object], title: str, runs: int = 20) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        fn()
    prof.disable()
    print(f"\n--- profile: {title} ({runs} passes, cumulative) ---")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--running", type=int, nargs="*", default=[100, 8000])
    parser.add_argument("--queued", type=int, nargs="*", default=[0, 100, 5000, 100_000])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"{NODES} nodes x {GPUS} GPUs, every GPU in use; load average {load[0]:.2f}")
    rows: list[dict[str, Any]] = []
    cases = [(r, q, False) for q in args.queued for r in args.running]
    cases += [(r, 5000, True) for r in args.running if 5000 in args.queued]
    for running, queued, preempt in cases:
        h = build(running, queued, preempt)
        gc.collect()
        gc.freeze()  # as the master does (gcpause.py): the state is not scanned each pass
        loop = h.cl.loop
        row: dict[str, Any] = {
            "running": running,
            "queued": queued,
            "preempting_head": preempt,
            "pass": "quick" if loop.long else "full on the loop",
            "event_pass": timed(event_pass(h, preempt), args.runs),
        }
        if queued and not loop.long:  # the pass every FULL_INTERVAL that makes the estimates
            row["estimating_pass"] = timed(event_pass(h, preempt, True), args.runs)
        if queued:
            row["full_core"] = timed(full_core(h), max(3, args.runs // 3))
        rows.append(row)
        label = f"{running:5d} running, {queued:6d} queued{' (preempting)' if preempt else ''}"
        ev = row["event_pass"]
        core = row.get("full_core")
        print(
            f"{label}: {row['pass']} pass {ev['median_ms']:7.2f} ms "
            f"(cpu {ev['median_cpu_ms']:.2f})"
            + (f"; full core {core['median_ms']:.1f} ms" if core else "")
            + (
                f"; with estimates {row['estimating_pass']['median_cpu_ms']:.1f} ms cpu"
                if "estimating_pass" in row
                else ""
            )
        )
        if args.profile and running >= 8000 and queued in (100, 100_000) and not preempt:
            profile(event_pass(h, preempt), label)
        gc.unfreeze()
        h.close()
        del h
        gc.collect()
    result = {
        "nodes": NODES,
        "gpus_per_node": GPUS,
        "runs": args.runs,
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "cases": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average after {os.getloadavg()[0]:.2f}; written to {RESULTS}")


if __name__ == "__main__":
    main()
