"""The accounting routes: history, reports and the utilisation series (the sums are
monitor/observe.py's, pure; a bad `--since`, `--state` or `--by` is its `BadQuery`,
answered 400 by errors.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Query

from mgpu.master.http.deps import Ctl
from mgpu.master.monitor.gpuwatch import measured_utilisation
from mgpu.master.monitor.observe import (
    MAX_ROWS,
    BadQuery,
    attempt_spans,
    finished_states,
    history_row,
    parse_since,
    report_rows,
    utilisation_series,
)
from mgpu.scheduler.types import SHARE_UNITS

__all__ = ["router"]

router = APIRouter()


@router.get("/api/history")
async def history(
    cl: Ctl,
    user: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = Query(default=1000, ge=1, le=MAX_ROWS),
) -> Any:
    start = parse_since(since, time.time())
    states = finished_states(state)
    jobs = await asyncio.to_thread(cl.finished_since, start, user, states, limit)
    return {"since": start, "jobs": [history_row(j) for j in jobs]}


@router.get("/api/report")
async def report(cl: Ctl, by: str = "user", since: str | None = None) -> Any:
    if by not in ("user", "node"):
        raise BadQuery(f"--by must be user or node, not {by!r}")
    start = parse_since(since, time.time())

    def compute() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return report_rows(cl.finished_since(start, limit=MAX_ROWS), by)

    rows, total = await asyncio.to_thread(compute)
    return {"by": by, "since": start, "rows": rows, "total": total}


@router.get("/api/utilisation")
async def utilisation(
    cl: Ctl,
    hours: float = Query(default=6.0, ge=0.01, le=24 * 30),  # > 0: buckets of 0 s
    points: int = Query(default=72, ge=2, le=2000),
) -> dict[str, Any]:
    now = time.time()
    start = now - hours * 3600
    # Running work's spans are taken here, on the loop that changes it (a few tuples a
    # job: copying the jobs took seconds with thousands running); the store is read in
    # a thread so that a long history does not hold up scheduling.
    active = [s for j in cl.jobs.values() if j.attempts for s in attempt_spans(j, now)]
    measured = list(cl.gpuwatch.series)
    total = sum(len(n.gpus) for n in cl.nodes.values())

    def compute() -> dict[str, Any]:
        done = cl.finished_since(start, limit=MAX_ROWS)
        return utilisation_series(done, start, now, points, total, measured, active)

    series = await asyncio.to_thread(compute)
    busy = sum(
        len(n.busy) + sum(sum(t.values()) for t in n.shares.values()) / SHARE_UNITS
        for n in cl.nodes.values()
    )  # a shared GPU counts the share in use
    utils = measured_utilisation(cl.nodes.values())
    series["now"] = {
        "allocated": busy,
        "allocated_pct": round(100 * busy / total, 2) if total else 0.0,
        "measured_pct": round(sum(utils) / len(utils), 2) if utils else None,
    }
    return series
