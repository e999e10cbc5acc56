"""The planner's walk over the waiting queue (`plan.py` holds the timelines and searches):
each job in the pass's order gets the earliest start the timelines allow, and is booked
there for its time limit, within the pass's budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from .plan import Planner, PlanTimeout
from .reservations import RESERVATION_PREFIX
from .types import JobRequest

__all__ = ["plan_queue"]


def plan_queue(
    planner: Planner,
    jobs: Iterable[JobRequest],
    duration: Callable[[JobRequest], float],
    ordered: bool,
    max_jobs: int,
    floor: float,
    ahead: str | None = None,
) -> tuple[dict[str, float], dict[str, tuple[str, ...]]]:
    """Estimate `jobs` (in order) on `planner`; `ordered`: no job starts before the one ahead
    of it (fifo/priority), nor before `floor` (the start of `ahead`, the blocked head).
    Stops after `max_jobs` or when the planner's time runs out."""
    starts: dict[str, float] = {}
    waits: dict[str, tuple[str, ...]] = {}
    for count, job in enumerate(jobs):
        if count >= max_jobs:
            break
        if planner.deadline is not None and time.perf_counter() > planner.deadline:
            break
        own_floor = floor if ordered and job.reservation is None else planner.now
        d = duration(job)
        try:
            planned = planner.earliest(job, d, own_floor)
        except PlanTimeout:
            break
        if planned is None:
            continue
        planner.commit(job.job_id, planned, d)
        starts[job.job_id] = planned.start
        on = planner.waiting_on(planned, job.reservation)
        if ordered and ahead is not None and planned.start == own_floor > planner.now:
            on.insert(0, ahead)
        if job.reservation is not None and planned.start > planner.now:
            res = planner.reservations.get(job.reservation)
            if res is not None and planned.start == res.start:
                on.append(RESERVATION_PREFIX + res.name)
        waits[job.job_id] = tuple(dict.fromkeys(on))
        if ordered and job.reservation is None and planned.start >= floor:
            floor, ahead = planned.start, job.job_id
    return starts, waits
