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
A fractional job's end gives back only its share; a head that is itself fractional has its
whole GPU kept from backfill (the simple, safe reading of "cannot delay it").

Admin reservations (`types.Reservation`, `mgpu reserve`) are honoured on the timeline too:
at a candidate time T, the GPUs of every reservation whose window overlaps the head's run
[T, T + limit) are withheld (a head without a time limit runs into every later window:
`reach`), and a reservation's end is a candidate time of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .placement import FreePool, place, requested_gpus
from .types import JobRequest, Placement, Policy, Reservation, RunningJob

__all__ = [
    "HeadReservation",
    "Release",
    "blocked_by",
    "find_reservation",
    "place_around",
    "reach",
    "release_events",
    "shadow_pool",
]


@dataclass(frozen=True, slots=True)
class Release:
    """GPUs that become free at `time` (a running job's expected end)."""

    time: float
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class HeadReservation:
    """Where and when the blocked head of the queue will start (EASY's reservation; not to
    be confused with an admin `types.Reservation`)."""

    job_id: str
    time: float
    placements: tuple[Placement, ...]


def expected_end(start: float, time_limit: float | None, default_limit: float, now: float) -> float:
    """When a job's GPUs are expected back: start + limit, never earlier than `now`."""
    limit = default_limit if time_limit is None else time_limit
    return max(now, start + limit)


def reach(job: JobRequest) -> float:
    """How long `job` may run once started, as far as reservation windows are concerned: its
    time limit, or forever without one.  (`default_time_limit` only estimates when such a job's
    GPUs come back; nothing stops it then, so it must never be let onto GPUs that a window
    will need.)"""
    return math.inf if job.time_limit is None else job.time_limit


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


def blocked_by(
    reservations: Sequence[Reservation], start: float, duration: float, member_of: str | None
) -> list[Reservation]:
    """The reservations a job running [start, start + duration) must keep off: every one
    whose window overlaps the run, except the job's own."""
    end = start + duration
    return [
        r
        for r in reservations
        if r.start < end and r.end > start and r.name != member_of and r.placements
    ]


def place_around(
    job: JobRequest, pool: FreePool, policy: Policy, blocks: Sequence[Reservation]
) -> tuple[Placement, ...] | None:
    """`place` with the GPUs of `blocks` withheld; `pool` is left as it was."""
    if not blocks:
        return place(job, pool, policy)
    taken = pool.withhold(p for r in blocks for p in r.placements)
    try:
        return place(job, pool, policy)
    finally:
        pool.restore(taken)


def find_reservation(
    job: JobRequest,
    pool: FreePool,
    events: Iterable[Release],
    default_policy: Policy,
    reservations: Sequence[Reservation] = (),
    duration: float = math.inf,
) -> HeadReservation | None:
    """The earliest time and GPUs at which `job` fits as `events` (soonest first) release
    GPUs; they are read only as far as needed.

    `reservations` are the admin reservations to keep off for a run of `duration` seconds
    (see the module docstring).  None when it never fits (GPUs held outside mgpu, jobs
    without a time limit, ...).  `pool` is not changed.
    """
    need = requested_gpus(job)
    sim = pool.copy()
    if reservations:
        # A reservation's end lets the head onto its GPUs: a candidate time of its own.
        ends = [Release(r.end, ()) for r in reservations if math.isfinite(r.end)]
        events = sorted([*events, *ends], key=lambda e: e.time)
    for event in events:
        sim.release_all(event.placements)
        # Trying after every release (not only after the last one at this time) finds the
        # same time, with fewer placement attempts when many jobs end together.
        if sim.total_free < need:
            continue
        blocks = (
            blocked_by(reservations, event.time, duration, job.reservation) if reservations else ()
        )
        placements = place_around(job, sim, default_policy, blocks)
        if placements is not None:
            return HeadReservation(job.job_id, event.time, placements)
    return None


def shadow_pool(pool: FreePool, reservation: HeadReservation) -> FreePool:
    """A copy of `pool` without the reserved GPUs: what backfill may use freely.

    A reserved GPU is taken out whole even when the head is fractional or the GPU is shared
    now: a backfilled share on it could outlast the jobs that make room for the head.
    """
    shadow = pool.copy()
    shadow.block(reservation.placements)
    return shadow
