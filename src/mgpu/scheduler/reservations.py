"""Admin reservations (`mgpu reserve`): GPUs set aside for a window, and the words about them.

A reservation (`types.Reservation`) names whole GPUs on nodes, chosen when it is made, and a
window [start, end).  The core keeps every other job off those GPUs if the job could still
run when the window opens (`backfill.blocked_by`: a job whose time limit ends it by `start`
may use them before); inside the window only the reservation's own jobs
(`JobRequest.reservation`) run there, and only there.

This module holds what the master needs around that:

* `pick_reservation_gpus` chooses the GPUs of a new reservation: N GPUs [on a node list]
  free for its whole window, given the running jobs' expected ends and the other
  reservations; it refuses with one sentence (`ReservationError`) when they are not there,
  naming a reservation that holds them;
* `could_fit_reservation` says at submit whether a `--reservation` job could ever run on the
  reservation's GPUs;
* the sentences of the reasons (`member_reason`, `kept_out_note`), built here so that the
  master, `mgpu show` and the simulator all word them alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from mgpu.durations import format_duration

from .backfill import expected_end
from .placement import FreePool, _place_split, could_ever_fit, place
from .types import JobRequest, NodeView, Placement, Reservation, RunningJob

__all__ = [
    "RESERVATION_PREFIX",
    "ReservationError",
    "could_fit_reservation",
    "kept_out_note",
    "member_reason",
    "pick_reservation_gpus",
    "reservation_gpus",
    "reservation_views",
]

RESERVATION_PREFIX = "reservation:"
"""How `Decisions.waiting_on` names a reservation (job ids never contain a colon)."""


class ReservationError(ValueError):
    """A reservation that cannot be made; the message is one sentence for the admin."""


def _plural_gpus(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def reservation_gpus(reservation: Reservation) -> dict[str, set[int]]:
    """The reservation's GPUs by node."""
    by_node: dict[str, set[int]] = {}
    for p in reservation.placements:
        by_node.setdefault(p.node_id, set()).update(p.gpu_ids)
    return by_node


def reservation_views(
    reservation: Reservation, nodes: Iterable[NodeView] | Mapping[str, NodeView]
) -> list[NodeView]:
    """The reservation's nodes cut down to its GPUs (free and shared state kept): the cluster
    its own jobs see."""
    views = nodes if isinstance(nodes, Mapping) else {n.node_id: n for n in nodes}
    out = []
    for nid, gpus in reservation_gpus(reservation).items():
        view = views.get(nid)
        if view is None:
            continue
        out.append(
            replace(
                view,
                gpu_indices=tuple(g for g in view.gpu_indices if g in gpus),
                free_gpus=frozenset(g for g in view.free_gpus if g in gpus),
                shared={g: u for g, u in view.shared.items() if g in gpus},
            )
        )
    return out


def could_fit_reservation(
    request: JobRequest, reservation: Reservation, nodes: Iterable[NodeView]
) -> str | None:
    """None if `request` could run on the reservation's GPUs once they are idle, else why
    not (one sentence), for the master to refuse at submit."""
    why = could_ever_fit(request, reservation_views(reservation, nodes))
    if why is None:
        return None
    return f"reservation {reservation.name} ({_plural_gpus(reservation.gpus)}) cannot run it: {why}"


def member_reason(name: str, reservation: Reservation | None, now: float) -> str | None:
    """Why a job of reservation `name` cannot start now whatever is free, or None when the
    window is open (then it waits for the reservation's GPUs like any job)."""
    if reservation is None:
        return f"reservation {name} does not exist or has ended"
    if now < reservation.start:
        return f"waiting for reservation {name}, which starts in " + format_duration(
            reservation.start - now
        )
    return None


def kept_out_note(reservation: Reservation, now: float) -> str:
    """The part of a reason that names the reservation keeping a job off GPUs it could use."""
    held = _plural_gpus(reservation.gpus)
    if reservation.start <= now:
        return (
            f"reservation {reservation.name} holds {held} "
            f"for another {format_duration(reservation.end - now)}"
        )
    when = format_duration(reservation.start - now)
    return f"reservation {reservation.name} takes {held} in {when}"


def pick_reservation_gpus(
    name: str,
    gpus: int,
    start: float,
    end: float,
    nodes: Sequence[NodeView],
    running: Sequence[RunningJob],
    reservations: Sequence[Reservation],
    now: float,
    default_time_limit: float,
    nodelist: frozenset[str] | None = None,
    ignore_jobs: bool = False,
) -> tuple[Placement, ...]:
    """The GPUs of a new reservation `name`: `gpus` whole GPUs [on `nodelist`] free for all of
    [start, end).

    A GPU qualifies if its node is up, it is not used outside mgpu, no running job may hold
    it past `start` (by its time limit; a job without one always may: `default_time_limit`
    does not end it), and no other reservation holds it in an overlapping window.  With
    `ignore_jobs` (Slurm's IGNORE_JOBS) running jobs do not count: the master stops those
    still on the GPUs when the window opens.  One node is preferred (the busiest that has
    them, as fill_first places a job), else the fewest nodes.  Raises `ReservationError`
    with one sentence otherwise (a window in the past, too few GPUs, naming the running jobs
    or the overlapping reservation that hold the GPUs asked for).
    """
    if gpus < 1:
        raise ReservationError("a reservation needs at least 1 GPU")
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise ReservationError("a reservation must end after it starts")
    if end <= now:
        raise ReservationError("the reservation's window is already over")
    if start < now:
        raise ReservationError("a reservation cannot start in the past")
    if any(r.name == name for r in reservations):
        raise ReservationError(f"reservation {name} already exists")
    views = {n.node_id: n for n in nodes}
    for nid in sorted(nodelist or ()):
        if nid not in views:
            raise ReservationError(f"node {nid} is not in the cluster")
    wanted = [v for v in nodes if nodelist is None or v.node_id in nodelist]
    held_until: dict[tuple[str, int], float] = {}
    late: dict[tuple[str, int], set[str]] = {}  # GPUs held past `start`, by which jobs
    for r in running:
        until = expected_end(r.start_time, r.time_limit, math.inf, now)
        for p in r.placements:
            for g in p.gpu_ids:
                key = (p.node_id, g)
                held_until[key] = max(held_until.get(key, until), until)
                if until > start:
                    late.setdefault(key, set()).add(r.job_id)
    overlapping = [r for r in reservations if r.start < end and r.end > start]
    taken: dict[tuple[str, int], str] = {
        (p.node_id, g): r.name for r in overlapping for p in r.placements for g in p.gpu_ids
    }
    usable: list[NodeView] = []
    for view in wanted:
        if not view.schedulable:
            continue
        ok = frozenset(
            g
            for g in view.gpu_indices
            if (view.node_id, g) not in taken
            and (
                g in view.free_gpus
                if (view.node_id, g) not in held_until
                else ignore_jobs or held_until[(view.node_id, g)] <= start
            )
        )
        usable.append(replace(view, free_gpus=ok, shared={}))
    pool = FreePool(usable)
    request = JobRequest(job_id=f"reservation {name}", user="", submit_time=now, gpus=gpus)
    placements = place(request, pool, "fill_first") if gpus <= pool.total_free else None
    if placements is None and gpus <= pool.total_free:
        placements = _place_split(request, pool, gpus, pool.eligible(request), "spread")
    if placements is not None:
        return placements
    raise ReservationError(_too_few(gpus, pool.total_free, wanted, nodelist, taken, late))


def _too_few(
    gpus: int,
    free: int,
    wanted: Sequence[NodeView],
    nodelist: frozenset[str] | None,
    taken: Mapping[tuple[str, int], str],
    late: Mapping[tuple[str, int], set[str]],
) -> str:
    where = "" if nodelist is None else f" on {', '.join(sorted(nodelist))}"
    asked = {v.node_id for v in wanted}
    sentence = f"only {free} of the {gpus} GPUs asked for are free{where} for that window"
    held: dict[str, int] = {}
    for (nid, _), owner in taken.items():
        if nid in asked:
            held[owner] = held.get(owner, 0) + 1
    if len(held) == 1:
        ((owner, n),) = held.items()
        sentence += f" (reservation {owner} already holds {_plural_gpus(n)} there then)"
    elif held:
        names = ", ".join(sorted(held))
        n = sum(held.values())
        sentence += f" (reservations {names} already hold {_plural_gpus(n)} there then)"
    jobs = sorted({j for (nid, _), ids in late.items() if nid in asked for j in ids}, key=_order)
    if jobs:
        listed = ", ".join(jobs[:5]) + (", ..." if len(jobs) > 5 else "")
        sentence += (
            f": {'job' if len(jobs) == 1 else 'jobs'} {listed} may still run then "
            "(--force reserves their GPUs anyway and stops them when the window opens)"
        )
    return sentence


def _order(job_id: str) -> tuple[int, str]:
    head = job_id.split("_", 1)[0]
    return (int(head) if head.isdigit() else 0, job_id)
