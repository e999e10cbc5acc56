"""Observing the cluster: accounting (history, report), the utilisation series and what
the dashboard's page and files are served with.

The routes are the edge's (master/http/observe.py, dashboard.py, public.py); they read the
controller through the small `Observed` protocol.  The accounting functions are pure (jobs
in, rows out) so that they are easy to test.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from mgpu.master.monitor.gpuwatch import GpuWatch
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job, JobState

WEB_DIR = Path(__file__).resolve().parents[2] / "web"

PAGE_HEADERS = {
    # The page acts with the token it holds (cancel, logs): no other site may frame it
    # and trick a click (clickjacking), in old browsers (X-Frame-Options) or new.
    "X-Frame-Options": "DENY",
    # Nothing but the master's own files: its scripts (no inline script, no on...=
    # handler, no eval), its style sheet (no style="..."), its favicon, fetches to it.
    # The page shows other users' text with the admin's token at hand: an escape missed
    # in app.js must still run nothing.  No plugins, no <base> to repoint the page's
    # relative URLs, forms only to the master.
    "Content-Security-Policy": "; ".join(
        (
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        )
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a `/?token=...` link never leaves in a Referer
}
"""Headers of the dashboard's page and its files."""
STATIC = {
    "app.js": "text/javascript",
    "heatmap.js": "text/javascript",
    "resume.js": "text/javascript",
    "style.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
"""The page's files under WEB_DIR (`/web/NAME`), with their media types."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
MAX_ROWS = 100000


class BadQuery(ValueError):
    """A query parameter the user typed wrong; the message is one sentence."""


class Observed(Protocol):
    """What the accounting and utilisation routes read of the controller."""

    @property
    def jobs(self) -> Mapping[str, Job]: ...

    @property
    def nodes(self) -> Mapping[str, NodeRecord]: ...

    @property
    def gpuwatch(self) -> GpuWatch: ...

    def finished_since(
        self, since: float, user: str | None = None, states: set[str] | None = None, limit: int = 0
    ) -> list[Job]:
        """Jobs ended at or after `since`, newest first; safe to call from a thread."""
        ...


def parse_since(text: str | None, now: float, default: str = "7d") -> float:
    """`7d`, `12h`, `30m`, `2w`, `90s`, a date (`2025-01-31`, ISO time) or epoch seconds."""
    raw = (text or default).strip()
    m = _DURATION.match(raw)
    if m is not None:
        value, unit = float(m.group(1)), m.group(2)
        if not unit:
            if value >= 1e9:  # an epoch timestamp
                return value
            unit = "d"
        return now - value * _UNITS[unit]
    try:
        return datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise BadQuery(
            f"--since {raw!r} is not a duration (7d, 12h, 30m) or a date (2025-01-31)"
        ) from None


# ---- accounting -------------------------------------------------------------


def attempt_spans(
    job: Job, now: float | None = None
) -> list[tuple[float, float, dict[str, float]]]:
    """(start, end, GPUs per node) of every attempt that started; a running one ends `now`.
    A fractional job (`--gpu-share F`) counts F of its GPU."""
    share = job.gpu_fraction
    spans = []
    for a in job.attempts:
        if a.start_time is None:
            continue
        end = a.end_time or job.end_time or now
        if end is None:
            continue
        per_node = {n: len(g) * share for n, g in a.gpu_ids.items()}
        spans.append((a.start_time, max(a.start_time, end), per_node))
    return spans


def gpu_hours(job: Job, now: float | None = None) -> float:
    return (
        sum(
            sum(per_node.values()) * (end - start)
            for start, end, per_node in attempt_spans(job, now)
        )
        / 3600
    )


def wait_time(job: Job) -> float | None:
    """Submit to the first start, or None if the job never started."""
    starts = [a.start_time for a in job.attempts if a.start_time is not None]
    return max(0.0, starts[0] - job.submit_time) if starts else None


def history_row(job: Job) -> dict[str, Any]:
    nodes: list[str] = []
    for a in job.attempts:
        nodes += [n for n in a.nodes if n not in nodes]
    runtime = None
    if job.start_time is not None and job.end_time is not None:
        runtime = max(0.0, job.end_time - job.start_time)
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "state": job.state.value,
        "gpus": job.gpus,
        "nodes": nodes,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "wait": wait_time(job),
        "runtime": runtime,
        "gpu_hours": round(gpu_hours(job), 6),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "retries": job.retries,
        "gpu_memory_peak_mb": job.gpu_memory_peak_mb,
        "gpu_util_mean": None if job.gpu_util_mean is None else round(job.gpu_util_mean, 1),
    }


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (p90 of 10 values is the 9th smallest)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def _summary(key: str, jobs: list[Job], hours: float) -> dict[str, Any]:
    waits = [w for w in (wait_time(j) for j in jobs) if w is not None]
    completed = sum(1 for j in jobs if j.state == JobState.COMPLETED)
    failed = sum(1 for j in jobs if j.state in (JobState.FAILED, JobState.TIMEOUT))
    return {
        "key": key,
        "jobs": len(jobs),
        "completed": completed,
        "failed": failed,
        "cancelled": sum(1 for j in jobs if j.state == JobState.CANCELLED),
        "gpu_hours": round(hours, 6),
        "success_rate": round(completed / len(jobs), 4) if jobs else None,
        "mean_wait": round(sum(waits) / len(waits), 3) if waits else None,
        "p90_wait": None if not waits else round(percentile(waits, 90) or 0.0, 3),
    }


def report_rows(jobs: Iterable[Job], by: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows per user or per node, and the total row.  A job counts on every node it ran on,
    its GPU-hours split by the GPUs it held on each."""
    groups: dict[str, list[Job]] = {}
    hours: dict[str, float] = {}
    all_jobs = list(jobs)
    for job in all_jobs:
        if by == "user":
            groups.setdefault(job.user, []).append(job)
            hours[job.user] = hours.get(job.user, 0.0) + gpu_hours(job)
            continue
        touched: list[str] = []
        for start, end, per_node in attempt_spans(job):
            for node, n in per_node.items():
                hours[node] = hours.get(node, 0.0) + n * (end - start) / 3600
                if node not in touched:
                    touched.append(node)
        for node in touched:
            groups.setdefault(node, []).append(job)
    rows = [_summary(k, groups[k], hours.get(k, 0.0)) for k in sorted(groups)]
    total = _summary("total", all_jobs, sum(gpu_hours(j) for j in all_jobs))
    return rows, total


def utilisation_series(
    jobs: Iterable[Job],
    start: float,
    end: float,
    points: int,
    total_gpus: int,
    measured: Iterable[tuple[float, float]] = (),
    spans: Iterable[tuple[float, float, dict[str, float]]] = (),
) -> dict[str, Any]:
    """Allocated GPUs over [start, end] in `points` equal buckets (mean over each bucket),
    from every attempt's start and end (of `jobs`, and `spans` taken already), and the
    measured utilisation where known."""
    step = (end - start) / points
    alloc = [0.0] * points  # GPU-seconds per bucket
    full = [0.0] * (points + 1)  # difference array of GPUs holding a whole bucket
    every = itertools.chain(spans, (span for job in jobs for span in attempt_spans(job, end)))
    for s, e, per_node in every:
        gpus = sum(per_node.values())
        s, e = max(s, start), min(e, end)
        if gpus == 0 or e <= s:
            continue
        first, last = int((s - start) // step), min(points - 1, int((e - start) // step))
        if first == last:
            alloc[first] += gpus * (e - s)
            continue
        alloc[first] += gpus * (start + (first + 1) * step - s)
        alloc[last] += gpus * (e - (start + last * step))
        full[first + 1] += gpus
        full[last] -= gpus
    sums = [0.0] * points
    counts = [0] * points
    for t, util in measured:
        if start <= t < end:
            i = min(points - 1, int((t - start) // step))
            sums[i] += util
            counts[i] += 1
    out = []
    running = 0.0
    for i in range(points):
        running += full[i]
        held = alloc[i] / step + running
        out.append(
            {
                "t": start + (i + 0.5) * step,
                "allocated": round(held, 3),
                "allocated_pct": round(100 * held / total_gpus, 2) if total_gpus else 0.0,
                "measured_pct": round(sums[i] / counts[i], 2) if counts[i] else None,
            }
        )
    return {"start": start, "end": end, "step": step, "total_gpus": total_gpus, "points": out}


def finished_states(text: str | None) -> set[str]:
    """`--state`'s ended states (`completed,failed`); none: every one."""
    if not text:
        return set()
    states = {s.strip().lower() for s in text.split(",") if s.strip()}
    known = {s.value for s in JobState if s.terminal}
    unknown = sorted(states - known)
    if unknown:
        raise BadQuery(f"--state {unknown[0]!r} is not one of {', '.join(sorted(known))}")
    return states
