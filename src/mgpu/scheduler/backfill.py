"""EASY backfill: one reservation for the first job that cannot start, and nothing may delay it.

The reservation is found on per-node free-GPU timelines: starting from the GPUs free after
this pass's starts, release every running job's GPUs at its expected end (start time plus
time limit) in time order, and try the normal placement after each release.  The first
time the job fits is its expected start, and the GPUs it would get there are *reserved*.

A lower-priority job may then start now only if it fits now and either

* fits without touching a reserved GPU (it cannot delay the reservation whatever it does), or
* ends — by its own time limit — no later than the reservation time.

Because the reservation names concrete GPUs, this is exact for pinned (`--node-gpu-ids`),
`--gpu-ids` and gang (`--nodes`) jobs too, not only for GPU counts.  Jobs without a finite
time limit never release their GPUs on the timeline, and never backfill into reserved GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .placement import FreePool, place, requested_gpus
from .types import JobRequest, Placement, Policy, RunningJob

__all__ = ["Release", "Reservation", "find_reservation", "release_events", "shadow_pool"]


@dataclass(frozen=True, slots=True)
class Release:
    """GPUs that become free at `time` (a running job's expected end)."""

    time: float
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Where and when the blocked head of the queue will start."""

    job_id: str
    time: float
    placements: tuple[Placement, ...]


def expected_end(start: float, time_limit: float | None, default_limit: float, now: float) -> float:
    """When a job's GPUs are expected back: start + limit, never earlier than `now`."""
    limit = default_limit if time_limit is None else time_limit
    return max(now, start + limit)


def release_events(
    running: Iterable[RunningJob],
    started: Iterable[tuple[float, tuple[Placement, ...]]],
    now: float,
    default_limit: float,
) -> list[Release]:
    """Every finite release, soonest first: running jobs plus `(end, placements)` started now."""
    events = [
        Release(expected_end(r.start_time, r.time_limit, default_limit, now), r.placements)
        for r in running
    ]
    events.extend(Release(max(now, end), placements) for end, placements in started)
    events = [e for e in events if math.isfinite(e.time)]
    events.sort(key=lambda e: e.time)
    return events


def find_reservation(
    job: JobRequest, pool: FreePool, events: Sequence[Release], default_policy: Policy
) -> Reservation | None:
    """The earliest time and GPUs at which `job` fits as `events` release GPUs.

    None when it never fits (GPUs held outside mgpu, jobs without a time limit, ...).
    `pool` is not changed.
    """
    need = requested_gpus(job)
    sim = pool.copy()
    for event in events:
        for p in event.placements:
            sim.release(p.node_id, p.gpu_ids)
        # Trying after every release (not only after the last one at this time) finds the
        # same time, with fewer placement attempts when many jobs end together.
        if sim.total_free < need:
            continue
        placements = place(job, sim, default_policy)
        if placements is not None:
            return Reservation(job.job_id, event.time, placements)
    return None


def shadow_pool(pool: FreePool, reservation: Reservation) -> FreePool:
    """A copy of `pool` without the reserved GPUs: what backfill may use freely."""
    shadow = pool.copy()
    shadow.take(reservation.placements)
    return shadow
