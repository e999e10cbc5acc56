"""Benchmark: trace replay through the scheduler core (`mgpu simulate`'s engine).

1. (`policies`) The full NASA iPSC/860 log (18,239 jobs; 1 GPU per processor on 16 nodes x
   8 GPUs) with each queue policy, at its logged load and with arrivals compressed
   (`--load`).
2. (`synthetic`) A synthetic 100,000-job trace (the NASA jobs resampled with a fixed seed,
   so the same offered load, five times as long) with backfill — the target is <= 60 s.
3. (`estimates`) The NASA log with backfill and the planner on (`SimConfig.estimates`):
   how far each waiting job's `expected_start` at submit was from its real start.
4. (`sharing`) A synthetic lab workload of small jobs (`sim/experiments.py`) on 4 x 4
   GPUs, with its GPU shares packed vs rounded up to whole GPUs: wait and utilisation.

Prints wall time and jobs/s per replay and the Markdown tables, writes (merges into)
``bench/results/simulator.json``; ``--docs FILE`` rewrites the tables after the
``<!-- table: load xF -->``, ``<!-- bench -->``, ``<!-- table: estimates -->`` and
``<!-- table: sharing -->`` markers of FILE (docs/scheduling.md), and ``--plot`` draws FIFO
vs backfill on the most compressed NASA replay.  No assertions: this reports figures.

    PYTHONPATH=src python bench/simulator.py [--sections policies,synthetic,estimates,sharing]
        [--load 1,2] [--synthetic 100000] [--estimates-load 1,2] [--sharing-load 0.7,0.9]
        [--docs docs/scheduling.md] [--plot docs/img/nasa-backfill-vs-fifo.png]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from mgpu.durations import format_duration
from mgpu.scheduler.types import QueuePolicy
from mgpu.sim import (
    ClusterShape,
    SimConfig,
    SimResult,
    compress,
    compute_metrics,
    format_table,
    metrics_json,
    plot,
    read_trace,
    resample,
    simulate,
)
from mgpu.sim.experiments import (
    default_shape,
    format_sharing,
    sharing_experiment,
    small_jobs_trace,
)
from mgpu.sim.report import EstimateMetrics, estimate_metrics, format_estimates
from mgpu.sim.simulator import describe_mapping

ROOT = Path(__file__).resolve().parent.parent
NASA = ROOT / "tests" / "data" / "traces" / "NASA-iPSC-1993-3.1-cln.swf.gz"
RESULTS = ROOT / "bench" / "results" / "simulator.json"
POLICIES: tuple[QueuePolicy, ...] = ("fifo", "priority", "backfill")
SHAPE = ClusterShape(16, 8)


def replay(jobs: list[Any], policy: QueuePolicy, label: str) -> tuple[SimResult, dict[str, Any]]:
    result = simulate(jobs, SimConfig(SHAPE, policy))
    m = compute_metrics(result)
    rate = len(jobs) / m.wall_seconds
    print(
        f"  {label:<34} {policy:<9} {m.wall_seconds:7.1f} s  {rate:8.0f} jobs/s  "
        f"{m.passes} passes, {m.pass_ms_mean:.2f} ms mean / {m.pass_ms_p99:.2f} ms p99",
        flush=True,
    )
    return result, {"jobs_per_second": round(rate, 1), **metrics_json(m, label, "")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", default="1,2", help="NASA arrival compressions (default 1,2)")
    ap.add_argument("--synthetic", type=int, default=100_000, help="synthetic jobs (0 = skip)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", help="PNG: FIFO vs backfill at the highest --load")
    ap.add_argument("--docs", help="Markdown file whose marked tables to rewrite")
    ap.add_argument(
        "--sections",
        default="policies,synthetic,estimates,sharing",
        help="which parts to run (default all)",
    )
    ap.add_argument("--estimates-load", default="1,2", help="NASA compressions for estimates")
    ap.add_argument("--sharing-load", default="0.7,0.9", help="small-jobs loads for sharing")
    ap.add_argument("--sharing-jobs", type=int, default=5000)
    args = ap.parse_args()
    sections = set(args.sections.split(","))

    trace = read_trace(NASA)
    out: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    out.update(
        {
            "trace": NASA.name,
            "cluster": {"nodes": SHAPE.nodes, "gpus_per_node": SHAPE.gpus_per_node},
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
    )
    out.setdefault("nasa", {})
    tables: dict[str, str] = {}
    loads = [float(x) for x in args.load.split(",") if x] if "policies" in sections else []
    kept: dict[str, SimResult] = {}
    for load in loads:
        jobs = compress(trace.jobs, load)
        mapping = describe_mapping(trace, SHAPE, 1.0, load)
        print(f"NASA, {len(jobs)} jobs: {mapping}", flush=True)
        rows = []
        runs: dict[str, Any] = {}
        for policy in POLICIES:
            result, figures = replay(jobs, policy, f"NASA x{load:g}")
            figures["mapping"] = mapping
            runs[policy] = figures
            rows.append(compute_metrics(result))
            if load == max(loads) and policy in ("fifo", "backfill"):
                kept[policy] = result
        out["nasa"][f"load_x{load:g}"] = runs
        tables[f"table: load x{load:g}"] = format_table(rows)

    if args.synthetic and "synthetic" in sections:
        syn = resample(trace, args.synthetic, seed=args.seed)
        print(f"synthetic: {syn.source}", flush=True)
        _, figures = replay(syn.jobs, "backfill", f"synthetic {args.synthetic} jobs")
        figures["seed"] = args.seed
        out["synthetic"] = figures

    if "estimates" in sections:
        rows = []
        for load in [float(x) for x in args.estimates_load.split(",") if x]:
            jobs = compress(trace.jobs, load)
            result = simulate(jobs, SimConfig(SHAPE, "backfill", estimates=True))
            e = estimate_metrics(result)
            m = compute_metrics(result)
            print(f"  estimates, NASA x{load:g} ({m.wall_seconds:.0f} s): {format_estimates(e)}")
            rows.append((load, e))
            out.setdefault("estimates", {})[f"load_x{load:g}"] = {
                "queued": e.queued,
                "estimated": e.estimated,
                "error_median_s": e.error_median,
                "error_p90_s": e.error_p90,
                "signed_median_s": e.signed_median,
                "exact": e.exact,
                "wait_median_s": e.wait_median,
                "wall_seconds": round(m.wall_seconds, 1),
                "pass_ms_mean": round(m.pass_ms_mean, 2),
            }
        tables["table: estimates"] = estimates_table(rows)

    if "sharing" in sections:
        shape = default_shape()
        parts = []
        for load in [float(x) for x in args.sharing_load.split(",") if x]:
            jobs = small_jobs_trace(args.sharing_jobs, shape.gpus, load=load, seed=args.seed)
            sharing = sharing_experiment(jobs, SimConfig(shape, "backfill"))
            table = format_sharing(sharing)
            print(f"  sharing, {len(jobs)} small jobs at load {load:g}:\n{table}", flush=True)
            head, rule, *body = table.splitlines()
            if not parts:
                parts += [head.replace("| replay |", "| load | replay |"), "| --- " + rule]
            parts += [f"| {load:.0%} " + line for line in body]
            out.setdefault("sharing", {})[f"load_{load:g}"] = [asdict(r) for r in sharing]
        tables["table: sharing"] = "\n".join(parts)

    if out.get("nasa") and "policies" in sections:
        tables["bench"] = speed_table(out)
    for marker, table in tables.items():
        print(f"\n<!-- {marker} -->\n{table}")
    print()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if args.plot and kept:
        title = f"NASA iPSC/860 on 16 x 8 GPUs, arrivals x{max(loads):g}: FIFO vs backfill"
        plot([kept["fifo"], kept["backfill"]], args.plot, title=title)
        print(f"wrote {args.plot}")
    if args.docs:
        rewrite_tables(Path(args.docs), tables)
        print(f"updated {args.docs}")
    return 0


def speed_table(out: dict[str, Any]) -> str:
    """Wall time and throughput of every replay, as a Markdown table."""
    lines = [
        "| replay | policy | jobs | wall | jobs/s | passes | pass mean / p99 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    runs = [(k, r) for k, by in out["nasa"].items() for r in by.values()]
    if "synthetic" in out:
        runs.append(("synthetic", out["synthetic"]))
    for key, r in runs:
        name = f"NASA, arrivals {key.removeprefix('load_')}" if key != "synthetic" else key
        lines.append(
            f"| {name} | {r['policy']} | {r['jobs']} | {r['wall_seconds']:.1f} s "
            f"| {r['jobs_per_second']:.0f} | {r['passes']} "
            f"| {r['pass_ms_mean']:.2f} / {r['pass_ms_p99']:.2f} ms |"
        )
    return "\n".join(lines)


def estimates_table(rows: list[tuple[float, EstimateMetrics]]) -> str:
    """The estimates at submit against the real starts, one row per arrival compression."""
    d = partial(format_duration, style="exact")
    lines = [
        "| arrivals | jobs that waited | with an estimate | exact (< 1 s) "
        "| abs. error median | abs. error p90 | median actual − estimate | their median wait |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for load, e in rows:
        signed = d(abs(e.signed_median))
        signed = signed if e.signed_median >= 0 else f"−{signed}"
        exact = e.exact / e.estimated if e.estimated else 0.0
        lines.append(
            f"| x{load:g} | {e.queued} | {e.share:.1%} | {exact:.0%} "
            f"| {d(e.error_median)} | {d(e.error_p90)} | {signed} | {d(e.wait_median)} |"
        )
    return "\n".join(lines)


def rewrite_tables(path: Path, tables: dict[str, str]) -> None:
    """Replace the table right after each `<!-- marker -->` line of `path`."""
    lines = path.read_text().splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        marker = lines[i].strip().removeprefix("<!--").removesuffix("-->").strip()
        i += 1
        if marker in tables and lines[i - 1].strip().startswith("<!--"):
            while i < len(lines) and lines[i].startswith("|"):
                i += 1  # drop the old table
            out.extend(tables[marker].splitlines())
    path.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
