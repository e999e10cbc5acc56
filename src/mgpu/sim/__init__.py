"""Trace-driven simulation: replay a workload through the real scheduler core.

`read_trace` reads SWF or CSV traces, `simulate` replays them with a virtual clock, calling
the same `mgpu.scheduler.schedule` the master calls, and `compute_metrics` summarises a
replay (`mgpu simulate` is the command-line face of all three).
"""

from .report import Metrics, compute_metrics, format_table, format_text, metrics_json, plot
from .simulator import (
    ClusterShape,
    JobResult,
    SimConfig,
    SimResult,
    SimulationError,
    default_cluster,
    simulate,
    to_request,
)
from .traces import (
    Trace,
    TraceError,
    TraceJob,
    compress,
    read_csv,
    read_swf,
    read_trace,
    resample,
)

__all__ = [
    "ClusterShape",
    "JobResult",
    "Metrics",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "Trace",
    "TraceError",
    "TraceJob",
    "compress",
    "compute_metrics",
    "default_cluster",
    "format_table",
    "format_text",
    "metrics_json",
    "plot",
    "read_csv",
    "read_swf",
    "read_trace",
    "resample",
    "simulate",
    "to_request",
]
