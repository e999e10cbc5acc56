"""What a replay measured: metrics, and their text, JSON and plot forms.

Definitions (times in seconds, over the jobs that finished):

* wait = start − submit (of the attempt that finished, for a requeued job);
* completion time = end − submit;
* bounded slowdown = max(1, (wait + run) / max(run, 10 s)), averaged;
* GPU utilisation = busy GPU-seconds / (cluster GPUs × makespan), where
  makespan = last end − first submit;
* scheduler cost = wall time of each `schedule()` call (mean, p99) and how many there were;
* estimates (replays with `SimConfig.estimates`, `estimate_metrics`): over the finished
  jobs that waited in the queue (did not start in the pass of their submission), the share
  that got an `expected_start` in that pass, and the error = actual start − estimate of
  those: median and p90 of its size, its median (negative: started sooner than estimated).

Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mgpu.durations import format_duration

from .simulator import SimResult

_span = partial(format_duration, style="exact")
"""Durations in the reports: two units always, enough to compare policies."""

__all__ = [
    "SLOWDOWN_BOUND",
    "EstimateMetrics",
    "Metrics",
    "compute_metrics",
    "estimate_metrics",
    "format_estimates",
    "format_table",
    "format_text",
    "metrics_json",
    "percentile",
    "plot",
    "utilisation_series",
    "wait_cdf",
]

SLOWDOWN_BOUND = 10.0
"""Seconds: runs shorter than this count as this long in the bounded slowdown."""


@dataclass(frozen=True, slots=True)
class Metrics:
    policy: str
    nodes: int
    gpus_per_node: int
    gpus: int
    jobs: int
    finished: int
    never_started: int
    timeouts: int
    preemptions: int
    capped: int
    wait_avg: float
    wait_median: float
    wait_p99: float
    completion_avg: float
    bounded_slowdown_avg: float
    utilisation: float
    makespan: float
    busy_gpu_seconds: float
    passes: int
    pass_ms_mean: float
    pass_ms_p99: float
    wall_seconds: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def compute_metrics(result: SimResult) -> Metrics:
    done = [j for j in result.jobs if j.finished]
    waits = [j.start - j.submit for j in done]
    slowdowns = [
        max(1.0, (w + j.run) / max(j.run, SLOWDOWN_BOUND)) for w, j in zip(waits, done, strict=True)
    ]
    first = min((j.submit for j in result.jobs), default=0.0)
    last = max((j.end for j in done), default=first)
    makespan = last - first
    shape = result.config.cluster
    capacity = shape.gpus * makespan
    ms = [s * 1000.0 for s in result.pass_seconds]
    return Metrics(
        policy=result.config.policy,
        nodes=shape.nodes,
        gpus_per_node=shape.gpus_per_node,
        gpus=shape.gpus,
        jobs=len(result.jobs),
        finished=len(done),
        never_started=len(result.jobs) - len(done),
        timeouts=sum(j.timed_out for j in done),
        preemptions=result.preemptions,
        capped=result.capped,
        wait_avg=_mean(waits),
        wait_median=percentile(waits, 50),
        wait_p99=percentile(waits, 99),
        completion_avg=_mean([j.end - j.submit for j in done]),
        bounded_slowdown_avg=_mean(slowdowns),
        utilisation=result.busy_gpu_seconds / capacity if capacity > 0 else 0.0,
        makespan=makespan,
        busy_gpu_seconds=result.busy_gpu_seconds,
        passes=len(ms),
        pass_ms_mean=_mean(ms) if ms else 0.0,
        pass_ms_p99=percentile(ms, 99) if ms else 0.0,
        wall_seconds=result.wall_seconds,
    )


@dataclass(frozen=True, slots=True)
class EstimateMetrics:
    queued: int
    """Finished jobs that did not start in the pass of their submission."""
    estimated: int
    """Of those, the ones that got an estimate in that pass."""
    error_median: float
    """Median of |actual start − estimate|, seconds."""
    error_p90: float
    signed_median: float
    """Median of actual start − estimate (negative: it started sooner than estimated)."""
    exact: int
    """Estimates within a second of the actual start."""
    wait_median: float
    """Median wait of the estimated jobs, for scale."""

    @property
    def share(self) -> float:
        return self.estimated / self.queued if self.queued else math.nan


def estimate_metrics(result: SimResult) -> EstimateMetrics:
    """How close the estimates at submit came to the real starts (see the module docstring)."""
    queued = [j for j in result.jobs if j.finished and j.queued]
    had = [j for j in queued if not math.isnan(j.estimate)]
    errors = [j.start - j.estimate for j in had]
    sizes = [abs(e) for e in errors]
    return EstimateMetrics(
        queued=len(queued),
        estimated=len(had),
        error_median=percentile(sizes, 50),
        error_p90=percentile(sizes, 90),
        signed_median=percentile(errors, 50),
        exact=sum(1 for e in sizes if e < 1.0),
        wait_median=percentile([j.start - j.submit for j in had], 50),
    )


def format_estimates(e: EstimateMetrics) -> str:
    """One line on the estimates at submit."""
    if not e.queued:
        return "no job waited in the queue: nothing to estimate"
    if not e.estimated:
        return f"{e.queued} jobs waited; none got an estimate at submit"
    return (
        f"{e.estimated} of {e.queued} waiting jobs ({e.share:.0%}) got an estimate at submit; "
        f"|actual - estimate|: median {_span(e.error_median)}, "
        f"p90 {_span(e.error_p90)}; {e.exact / e.estimated:.0%} exact; "
        f"median actual - estimate {_signed(e.signed_median)} "
        f"(their median wait {_span(e.wait_median)})"
    )


def _signed(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return ("-" if seconds < 0 else "+") + _span(abs(seconds))


# --------------------------------------------------------------------------- text and JSON


def format_text(m: Metrics, source: str, mapping: str) -> str:
    """The human report of one replay."""
    rows = [
        ("trace", source),
        ("mapping", mapping),
        ("policy", m.policy),
        ("jobs", _jobs_line(m)),
        (
            "wait",
            f"avg {_span(m.wait_avg)}  median {_span(m.wait_median)}  p99 {_span(m.wait_p99)}",
        ),
        ("completion time", f"avg {_span(m.completion_avg)}"),
        ("bounded slowdown", f"avg {m.bounded_slowdown_avg:.2f} (runs < 10s count as 10s)"),
        ("GPU utilisation", f"{m.utilisation:.1%}"),
        ("makespan", f"{_span(m.makespan)} ({m.makespan:.0f}s)"),
        (
            "scheduler",
            f"{m.passes} passes, {m.pass_ms_mean:.3f} ms mean, {m.pass_ms_p99:.3f} ms p99 "
            f"(replay took {m.wall_seconds:.1f}s)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)


def _jobs_line(m: Metrics) -> str:
    parts = [f"{m.jobs} replayed"]
    if m.never_started:
        parts.append(f"{m.never_started} never started")
    if m.timeouts:
        parts.append(f"{m.timeouts} killed at their time limit")
    if m.capped:
        parts.append(f"{m.capped} cut down to the cluster's {m.gpus} GPUs")
    if m.preemptions:
        parts.append(f"{m.preemptions} preemptions")
    return ", ".join(parts)


def metrics_json(m: Metrics, source: str, mapping: str, **extra: Any) -> dict[str, Any]:
    """One JSON-ready object; NaN (no finished job) becomes null."""
    out: dict[str, Any] = {"trace": source, "mapping": mapping, **extra}
    for key, value in asdict(m).items():
        out[key] = None if isinstance(value, float) and math.isnan(value) else value
    return out


def format_table(rows: Sequence[Metrics]) -> str:
    """A Markdown table comparing replays of one trace (one row per policy)."""
    head = (
        "| policy | wait avg | wait median | wait p99 | utilisation | bounded slowdown "
        "| makespan | passes | pass mean / p99 |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]
    for m in rows:
        lines.append(
            f"| {m.policy} | {_span(m.wait_avg)} | {_span(m.wait_median)} "
            f"| {_span(m.wait_p99)} | {m.utilisation:.1%} | {m.bounded_slowdown_avg:.2f} "
            f"| {_span(m.makespan)} | {m.passes} "
            f"| {m.pass_ms_mean:.2f} / {m.pass_ms_p99:.2f} ms |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- plot


def utilisation_series(result: SimResult, bins: int = 150) -> tuple[list[float], list[float]]:
    """Mean GPU utilisation in `bins` equal slices of the makespan: (slice mid-times, 0..1)."""
    times, busy = result.times, result.busy
    if not times:
        return [], []
    start = times[0]
    end = max(times[-1], start + 1.0)
    width = (end - start) / bins
    acc = [0.0] * bins
    for i, t in enumerate(times[:-1]):
        _spread(acc, start, width, t, times[i + 1], busy[i])
    total = result.config.cluster.gpus
    mids = [start + (k + 0.5) * width for k in range(bins)]
    return mids, [a / (width * total) for a in acc]


def _spread(
    acc: list[float], origin: float, width: float, a: float, b: float, level: float
) -> None:
    """Add `level` GPU-seconds per second over [a, b) to the bins it covers."""
    if level == 0 or b <= a:
        return
    k = int((a - origin) // width)
    while a < b and k < len(acc):
        edge = origin + (k + 1) * width
        acc[k] += level * (min(b, edge) - a)
        a = edge
        k += 1


def wait_cdf(result: SimResult) -> tuple[list[float], list[float]]:
    """Sorted waits and the fraction of jobs that waited at most that long."""
    waits = sorted(j.start - j.submit for j in result.jobs if j.finished)
    n = len(waits)
    return waits, [(i + 1) / n for i in range(n)]


def plot(results: Sequence[SimResult], path: str | Path, title: str = "") -> None:
    """Utilisation over time and the wait CDF, one line per replay, into a PNG.

    matplotlib is an optional dependency, imported here only.
    """
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib (pip install 'matplotlib>=3.8')") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, (ax_u, ax_w) = plt.subplots(2, 1, figsize=(9, 7), constrained_layout=True)
    for result in results:
        label = result.config.policy
        mids, util = utilisation_series(result)
        origin = result.times[0] if result.times else 0.0
        ax_u.plot([(t - origin) / 86400 for t in mids], util, label=label, lw=1)
        waits, frac = wait_cdf(result)
        ax_w.step([max(w, 1.0) for w in waits], frac, where="post", label=label, lw=1.2)
    ax_u.set(xlabel="days since the first submission", ylabel="GPU utilisation", ylim=(0, 1.02))
    ax_u.set_title(title or "GPU utilisation over time")
    ax_w.set(xscale="log", xlabel="wait (s, log scale; < 1 s shown at 1 s)", ylabel="jobs ≤ wait")
    ax_w.set_title("wait time CDF")
    for ax in (ax_u, ax_w):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
