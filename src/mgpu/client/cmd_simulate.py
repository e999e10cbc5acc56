"""`mgpu simulate TRACE`: replay a workload trace through the scheduler and report.

Kept apart from `cli.py` so that `mgpu queue` and friends never import the scheduler;
`cli.py` only calls `add_simulate_parser(sub)`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgpu.client.api import MgpuError

if TYPE_CHECKING:
    from mgpu.sim import Metrics, SimResult, Trace

__all__ = ["add_simulate_parser", "cmd_simulate"]

POLICIES = ("fifo", "priority", "backfill")


def add_simulate_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `simulate` subcommand to an argparse subparsers object."""
    text = "replay a workload trace (SWF or CSV) through the scheduler and report"
    p: argparse.ArgumentParser = sub.add_parser("simulate", help=text, description=text)
    p.set_defaults(fn=cmd_simulate)
    p.add_argument(
        "trace",
        metavar="TRACE",
        help="SWF (Parallel Workloads Archive) or CSV file, gzipped or not",
    )
    p.add_argument(
        "--nodes", type=int, metavar="N", help="nodes in the cluster (default: fit the trace)"
    )
    p.add_argument("--gpus-per-node", type=int, metavar="M", help="GPUs per node (default 8)")
    p.add_argument(
        "--cpus-per-node",
        type=int,
        metavar="N",
        help="CPUs per node (default: not counted; jobs then ask none)",
    )
    p.add_argument(
        "--mem-per-node",
        metavar="SIZE",
        help="memory per node, such as 512G (default: not counted)",
    )
    p.add_argument(
        "--policy", choices=POLICIES, default="backfill", help="queue policy (default backfill)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw utilisation and the wait CDF")
    p.add_argument("--limit", type=int, metavar="N", help="replay only the first N jobs")
    p.add_argument(
        "--time-limit-factor",
        type=float,
        default=1.0,
        metavar="F",
        help="unknown time limits = F x run time (default 1; 0 = the scheduler's default)",
    )
    p.add_argument(
        "--load-factor",
        type=float,
        default=1.0,
        metavar="F",
        help="make arrivals F times faster than the trace (default 1)",
    )
    p.add_argument(
        "--half-life",
        type=float,
        default=168.0,
        metavar="HOURS",
        help="fairshare usage half-life (default 168 = 7 days)",
    )
    p.add_argument("--format", choices=("swf", "csv"), help="trace format (default: detect)")
    return p


def _check(args: argparse.Namespace) -> None:
    """Reject impossible options with one sentence each."""
    positive = {
        "--nodes": args.nodes,
        "--gpus-per-node": args.gpus_per_node,
        "--cpus-per-node": args.cpus_per_node,
        "--limit": args.limit,
    }
    for name, value in positive.items():
        if value is not None and value < 1:
            raise MgpuError(f"{name} must be at least 1")
    if args.mem_per_node is not None:
        from mgpu.resources import SizeError, parse_size_mb

        try:
            args.mem_per_node = parse_size_mb(args.mem_per_node)
        except SizeError as e:
            raise MgpuError(f"--mem-per-node: {e}") from None
        if args.mem_per_node < 1:
            raise MgpuError("--mem-per-node must be more than 0")
    factor = args.time_limit_factor
    if not math.isfinite(factor) or factor < 0:
        raise MgpuError("--time-limit-factor must be a number of at least 0")
    if not math.isfinite(args.load_factor) or args.load_factor <= 0:
        raise MgpuError("--load-factor must be a positive number")
    if not math.isfinite(args.half_life) or args.half_life <= 0:
        raise MgpuError("--half-life must be a positive number of hours")
    if args.plot:
        parent = Path(args.plot).expanduser().resolve().parent
        if not parent.is_dir():
            raise MgpuError(f"cannot write the plot: directory {parent} does not exist")


def cmd_simulate(args: argparse.Namespace) -> int:
    _check(args)
    # Imported here so the rest of the CLI starts without the scheduler and simulator.
    from mgpu.sim import compute_metrics
    from mgpu.sim.simulator import describe_mapping

    trace, result = _replay(args)
    metrics = compute_metrics(result)
    shape = result.config.cluster
    mapping = describe_mapping(trace, shape, args.time_limit_factor, args.load_factor)
    if args.plot:
        _plot(result, args.plot, Path(args.trace).name)
    if args.json:
        _print_json(args, metrics, trace, mapping)
    else:
        _print_text(args, metrics, trace, mapping)
    return 0


def _replay(args: argparse.Namespace) -> tuple[Trace, SimResult]:
    """Read the trace, size the cluster and run the replay; errors as one sentence."""
    from mgpu.sim import SimConfig, TraceError, compress, default_cluster, read_trace, simulate
    from mgpu.sim.simulator import ClusterShape, SimulationError

    try:
        trace = read_trace(args.trace, args.format)
    except TraceError as e:
        raise MgpuError(str(e)) from None
    jobs = trace.jobs[: args.limit] if args.limit else trace.jobs
    if not jobs:
        raise MgpuError(f"{args.trace} has no jobs to replay")
    fitted = default_cluster(trace, args.gpus_per_node)
    shape = ClusterShape(
        args.nodes or fitted.nodes,
        fitted.gpus_per_node,
        args.cpus_per_node or 0,
        args.mem_per_node or 0,
    )
    config = SimConfig(
        cluster=shape,
        policy=args.policy,
        time_limit_factor=args.time_limit_factor,
        half_life=args.half_life * 3600.0,
    )
    try:
        return trace, simulate(compress(jobs, args.load_factor), config)
    except SimulationError as e:
        raise MgpuError(f"the scheduler made an impossible decision: {e}") from None
    except ValueError as e:  # what the trace asks that the cluster cannot offer
        raise MgpuError(str(e)) from None


def _print_json(args: argparse.Namespace, metrics: Metrics, trace: Trace, mapping: str) -> None:
    from mgpu.sim import metrics_json

    extra: dict[str, Any] = {
        "skipped": trace.skipped,
        "time_limit_factor": args.time_limit_factor,
        "load_factor": args.load_factor,
    }
    if args.plot:
        extra["plot"] = args.plot
    print(json.dumps(metrics_json(metrics, args.trace, mapping, **extra)))


def _print_text(args: argparse.Namespace, metrics: Metrics, trace: Trace, mapping: str) -> None:
    from mgpu.sim import format_text

    print(format_text(metrics, args.trace, mapping))
    if trace.skipped:
        left_out = ", ".join(f"{n} ({why})" for why, n in sorted(trace.skipped.items()))
        print(f"skipped records: {left_out}")
    if args.plot:
        print(f"plot: {args.plot}")


def _plot(result: SimResult, path: str, name: str) -> None:
    from mgpu.sim import plot

    try:
        plot([result], path, title=f"{name}: GPU utilisation ({result.config.policy})")
    except RuntimeError as e:  # matplotlib missing
        raise MgpuError(str(e)) from None
    except (OSError, ValueError) as e:
        raise MgpuError(f"cannot write the plot {path}: {e}") from None
