"""An estimated start for every waiting job: the queue projected on per-node GPU timelines.

After a pass has decided what starts now, the planner projects the rest of the queue, the
way conservative backfill plans it: every running job (and every job started by this pass)
holds its GPUs until its time limit; then the waiting jobs, in the pass's order, are put one
by one at the earliest time at which GPUs they can use stay free for their whole time limit,
and hold them from then on.  A later job may be put into a hole before an earlier one's
start if it ends in time, as backfill would start it; under the `fifo` and `priority`
policies no job is put before the one ahead of it.  The blocked head keeps the reservation
EASY backfill gave it, so its estimate is the one the decisions protect.

The timelines are per node: a list of breakpoints and, between them, each GPU's use (share
units, so fractional jobs stack on a GPU up to a whole one) and who holds it.  Admin
reservations are windows on their GPUs: no other job may overlap them, and the
reservation's own jobs go only there and start only inside the window.  A job's earliest
start on a node can only be now or a time at which something on that node ends (moving a
start to a later time without crossing an end only lengthens what must stay free), so the
search walks the times at which GPUs come free, soonest first, and looks only at the nodes
freeing then.

A job that asks for CPUs or memory fits a node at a time only where, beside its GPUs, the
most CPUs and memory held at once during its run leave room for its own (`--exclusive`:
nothing held there at all, and it takes every GPU); running jobs hold theirs until they end.

What each job waits for is read off the timeline: whoever uses the GPUs it gets between now
and its estimated start (jobs running or planned ahead of it, reservations), plus the job
ahead of it when the policy forbids passing it.

Cost is bounded by `SchedulerConfig.plan_jobs` (jobs per pass) and `plan_seconds` (wall
time, checked inside long searches too); jobs beyond either get no estimate.  This is the
only place the core reads a clock, and it changes no decision.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mgpu.resources import ResourceAsk

from .placement import FreePool, gpus_per_node, requested_gpus, shape_key
from .reservations import reservation_gpus
from .room import need_on
from .timeline import Line, Staircase, mask_positions
from .types import SHARE_UNITS, JobRequest, NodeView, Placement, Policy, Reservation

__all__ = ["WAITING_ON_MAX", "PlanTimeout", "Planned", "Planner"]


_CHECK_EVERY = 64
"""Node checks between two looks at the clock inside one search."""

WAITING_ON_MAX = 16
"""At most this many entries in a job's `waiting_on` (the last before its start): enough to
say what a job waits for, without a wide job's hundred predecessors in every pass."""


class PlanTimeout(Exception):
    """The planning budget ran out (inside a search)."""


@dataclass(frozen=True, slots=True)
class Planned:
    start: float
    placements: tuple[Placement, ...]


class Planner:
    """The timelines of one pass; `earliest` finds a job's start, `commit` books it."""

    def __init__(
        self,
        now: float,
        pool: FreePool,
        nodes: Sequence[NodeView],
        intervals: Iterable[tuple[str, float, tuple[Placement, ...]]],
        reservations: Sequence[Reservation],
        policy: Policy,
        deadline: float | None,
    ) -> None:
        """`pool` is the pass's final free pool (it is copied); `intervals` are the jobs that
        hold GPUs from now: (job id, expected end, placements)."""
        self.now = now
        self.policy = policy
        self.deadline = deadline
        self.checks = 0
        self.pool = pool.copy()
        self.views = {n.node_id: n for n in nodes if pool.is_up(n.node_id)}
        self.reservations = {r.name: r for r in reservations}
        self.lines: dict[str, Line] = {}
        self.pending: dict[str, list[tuple[str, float, Placement]]] = {}
        self.event_times: list[float] = []
        self.event_nodes: dict[float, dict[str, None]] = {}  # ordered: the plan is repeatable
        self.blocks: dict[str, list[tuple[float, float, tuple[int, ...], str]]] = {}
        for r in reservations:
            for nid, gpus in reservation_gpus(r).items():
                if nid in self.views:
                    self.blocks.setdefault(nid, []).append((r.start, r.end, tuple(gpus), r.name))
                    self._event(r.end, nid)
        # GPUs not free in the views but free from now on (overdue jobs, victims).
        self.freed: dict[str, set[int]] = {}
        for job_id, end, placements in intervals:
            if end <= now:  # overdue: it ends any moment, its GPUs count as free now
                self.release_now(placements)
                continue
            for p in placements:
                if p.node_id in self.views:
                    self.pending.setdefault(p.node_id, []).append((job_id, end, p))
                    self._event(end, p.node_id)
        self._res_masks: dict[str, dict[str, int]] = {}
        # Per request shape, starts found so far: booking only ever adds use, so a later
        # job of that shape running at least as long cannot start sooner (`Staircase`).
        self.known: dict[tuple[object, ...], Staircase] = {}

    # -- timelines

    def _event(self, t: float, nid: str) -> None:
        if not math.isfinite(t):
            return
        nodes = self.event_nodes.get(t)
        if nodes is None:
            nodes = self.event_nodes[t] = {}
            insort(self.event_times, t)
        nodes[nid] = None

    def line(self, nid: str) -> Line:
        found = self.lines.get(nid)
        if found is not None:
            return found
        view = self.views[nid]
        gpus = tuple(view.gpu_indices)
        pos = {g: i for i, g in enumerate(gpus)}
        held = self.pending.pop(nid, [])
        # A GPU neither free, nor held by a job we know of, is used outside mgpu; so are
        # CPUs and memory held now but by none of them.
        known = set(view.free_gpus) | self.freed.get(nid, set())
        cpus = view.cpus - self.pool.free_cpus(nid)
        mem = view.mem_mb - self.pool.free_mem(nid)
        for _, _, hold in held:
            known.update(hold.gpu_ids)
            cpus, mem = cpus - hold.cpus, mem - hold.mem_mb
        mask, used = 0, [0] * len(gpus)
        for g, p in pos.items():
            if g not in known:
                mask |= 1 << p
                used[p] = SHARE_UNITS
        blocks = [
            (bs, be, sum(1 << pos[g] for g in ids if g in pos), name)
            for bs, be, ids, name in self.blocks.get(nid, ())
        ]
        line = Line(self.now, gpus, (mask, tuple(used), max(0, cpus), max(0, mem)), blocks)
        for job_id, end, hold in held:
            positions = [pos[g] for g in hold.gpu_ids if g in pos]
            units = hold.share or SHARE_UNITS
            end = max(end, self.now)
            line.add(self.now, end, positions, units, job_id, hold.cpus, hold.mem_mb)
        self.lines[nid] = line
        return line

    def commit(self, job_id: str, planned: Planned, duration: float) -> None:
        """Book `planned` for `job_id` for `duration` seconds."""
        t, end = planned.start, planned.start + duration
        for p in planned.placements:
            line = self.line(p.node_id)
            positions = [line.pos[g] for g in p.gpu_ids]
            line.add(t, end, positions, p.share or SHARE_UNITS, job_id, p.cpus, p.mem_mb)
            self._event(end, p.node_id)
        if t <= self.now:
            self.pool.take(planned.placements)

    def release_now(self, placements: Iterable[Placement]) -> None:
        """GPUs held now that are to be free now (overdue jobs, preemption victims); before
        any `earliest` or `commit`."""
        for p in placements:
            self.pool.release(p.node_id, p.gpu_ids, p.share, p.cpus, p.mem_mb, p.whole)
            self.freed.setdefault(p.node_id, set()).update(p.gpu_ids)

    def waiting_on(self, planned: Planned, own: str | None) -> list[str]:
        """Who uses the GPUs of `planned` until its start (running jobs, jobs planned ahead
        of it, reservations), in the order they let go of them; at most `WAITING_ON_MAX`,
        the last ones."""
        if planned.start <= self.now:
            return []
        ends: dict[str, float] = {}
        for p in planned.placements:
            line = self.line(p.node_id)
            got = line.until(planned.start, [line.pos[g] for g in p.gpu_ids], own, WAITING_ON_MAX)
            for who, until in got.items():
                ends[who] = max(until, ends.get(who, until))
        ordered = sorted(ends, key=lambda who: (ends[who], who))
        return ordered[-WAITING_ON_MAX:]

    # -- the search

    def _tick(self, n: int = 1) -> None:
        self.checks += n
        if self.deadline is not None and self.checks >= _CHECK_EVERY:
            self.checks = 0
            if time.perf_counter() > self.deadline:
                raise PlanTimeout

    def earliest(self, job: JobRequest, duration: float, floor: float) -> Planned | None:
        """The earliest start at or after `floor`, and where; None if none follows from the
        timelines (a GPU never freed, a node down, an unknown reservation)."""
        key = shape_key(job)
        stairs = self.known.get(key)
        if stairs is None:
            stairs = self.known[key] = Staircase(self.now)
        known = stairs.floor(duration)
        if not math.isfinite(known):
            return None
        found = self._earliest(job, duration, floor, known)
        if floor <= known:  # else [known, floor) was not searched: nothing more is proven
            stairs.add(duration, math.inf if found is None else found.start)
        return found

    def _earliest(
        self, job: JobRequest, duration: float, floor: float, known: float
    ) -> Planned | None:
        res: Reservation | None = None
        if job.reservation is not None:
            res = self.reservations.get(job.reservation)
            if res is None:
                return None
            floor = max(floor, res.start)
            if floor >= res.end:
                return None
        if job.node_gpu_ids is not None:
            return self._pinned(job, duration, max(floor, known), res)
        eligible = self.pool.eligible(job)
        members = eligible.nodes  # None = every node that is up
        if res is not None:
            mine = self._res_mask(res)
            members = frozenset(n for n in mine if members is None or n in members)
        if members is not None and not members:
            return None
        if job.nodes is not None:
            per = gpus_per_node(job)
            if per is None or job.nodes <= 0:
                return None
            return self._across(job, duration, max(floor, known), res, members, per)
        split = job.gpu_ids is None and not job.gpu_share and job.distributed
        if split and job.gpus > eligible.max_total:
            return self._across(job, duration, max(floor, known), res, members, None)
        return self._one_node(job, duration, floor, res, members, known)

    def _res_mask(self, res: Reservation) -> dict[str, int]:
        """The reservation's GPUs as a bitmask per node (of the nodes that are up)."""
        found = self._res_masks.get(res.name)
        if found is None:
            found = {}
            for nid, gpus in reservation_gpus(res).items():
                if nid in self.views:
                    pos = self.line(nid).pos
                    found[nid] = sum(1 << pos[g] for g in gpus if g in pos)
            self._res_masks[res.name] = found
        return found

    def _allowed(self, line: Line, nid: str, res: Reservation | None) -> int:
        if res is None:
            return (1 << len(line.gpus)) - 1
        return self._res_mask(res).get(nid, 0)

    def _times_after(
        self, floor: float, nodes: frozenset[str] | None, res: Reservation | None
    ) -> Iterable[tuple[float, Iterable[str]]]:
        """Candidate times after `floor`, soonest first, with the nodes freeing something
        then (`nodes` None = every node)."""
        if nodes is not None and (res is not None or len(nodes) <= 4):
            # A few nodes: their own breakpoints.
            times: set[float] = set()
            for nid in sorted(nodes):
                line = self.line(nid)
                times.update(t for t in line.times if t > floor)
                for bs, be, _, _ in line.blocks:
                    times.update(x for x in (bs, be) if x > floor)
            limit = res.end if res is not None else math.inf
            ordered = sorted(nodes)
            for t in sorted(times):
                if t >= limit:
                    return
                yield t, ordered
            return
        k = bisect_right(self.event_times, floor)
        while k < len(self.event_times):
            t = self.event_times[k]
            at = self.event_nodes[t]
            yield t, (at if nodes is None else [n for n in at if n in nodes])
            k += 1

    def _one_node(
        self,
        job: JobRequest,
        duration: float,
        floor: float,
        res: Reservation | None,
        members: frozenset[str] | None,
        known: float,
    ) -> Planned | None:
        """One node: `--gpus N`, `--gpu-ids`, or a share of one GPU.

        `known`: no start before it is possible.  When it is later than `floor`, only the
        nodes freeing something at `known` can fit then (a node's fit can only begin when
        something on it ends), so the search starts there, at those nodes.
        """
        own = job.reservation
        ask = job.ask if job.asks else None
        fits: Callable[[str, float], tuple[tuple[object, ...], Placement] | None]
        if job.gpu_share:
            if ask is not None and ask.exclusive:
                return None
            fits = self._share_fit(job.gpu_share, duration, res, own, ask)
        elif job.gpu_ids is not None:
            fits = self._ids_fit(frozenset(job.gpu_ids), duration, res, own, ask)
        else:
            fits = self._count_fit(requested_gpus(job), duration, res, own, ask)
        best: Placement | None
        if known > floor:
            floor = known
            best = self._first(self.event_nodes.get(floor, {}), members, fits, floor)
        elif floor <= self.now and res is None:
            # Now: only nodes with room in the pool (or GPUs just released) can fit; they
            # come best first for the policy, so the first that stays free long enough wins.
            best = self._first(self._room_now(job), members, fits)
        else:
            best = self._best(self.views if members is None else members, floor, fits)
        if best is not None:
            return Planned(floor, (best,))
        for t, at in self._times_after(floor, members, res):
            # The first node found: many may free up at once, and weighing them all by the
            # policy costs more than the estimate gains.
            best = self._first(at, None, fits, t)
            if best is not None:
                return Planned(t, (best,))
        return None

    def _room_now(self, job: JobRequest) -> Iterable[str]:
        """Nodes with room now, best first for the policy."""
        pool = self.pool
        if job.gpu_share:
            # Shared GPUs first when packing, free ones first when spreading.
            shared = sorted(pool.shared_nodes(), key=lambda n: (pool.free_count(n), n))
            free = pool.iter_nodes(1, self.policy)
            return [*shared, *free] if self.policy == "fill_first" else [*free, *shared]
        need = len(set(job.gpu_ids)) if job.gpu_ids is not None else requested_gpus(job)
        return pool.iter_nodes(need, self.policy)

    def _first(
        self,
        nodes: Iterable[str],
        members: frozenset[str] | None,
        fits: Callable[[str, float], tuple[tuple[object, ...], Placement] | None],
        t: float | None = None,
    ) -> Placement | None:
        """The first of `nodes` (among `members`) where it fits at `t` (default now)."""
        at = self.now if t is None else t
        for nid in nodes:
            if members is not None and nid not in members:
                continue
            self._tick()
            got = fits(nid, at)
            if got is not None:
                return got[1]
        return None

    def _best(
        self,
        nodes: Iterable[str],
        t: float,
        fits: Callable[[str, float], tuple[tuple[object, ...], Placement] | None],
    ) -> Placement | None:
        best: tuple[tuple[object, ...], Placement] | None = None
        for nid in nodes:
            self._tick()
            got = fits(nid, t)
            if got is not None and (best is None or got[0] < best[0]):
                best = got
        return None if best is None else best[1]

    def _sign(self) -> int:
        return 1 if self.policy == "fill_first" else -1

    def _room(
        self, line: Line, nid: str, t: float, end: float, gpus: int, ask: ResourceAsk
    ) -> tuple[int, int] | None:
        """(CPUs, MiB) `ask` holds on `nid` with `gpus` GPUs there, if they stay free for
        all of [t, end) (`--exclusive`: if nothing else is held there then), else None."""
        view = self.views[nid]
        cpus, mem = need_on(ask, gpus, view)
        held_cpus, held_mem = line.room_peak(t, end)
        if ask.exclusive:
            return (cpus, mem) if not (held_cpus or held_mem) else None
        if (cpus and held_cpus + cpus > view.cpus) or (mem and held_mem + mem > view.mem_mb):
            return None
        return cpus, mem

    def _count_fit(
        self,
        need: int,
        duration: float,
        res: Reservation | None,
        own: str | None,
        ask: ResourceAsk | None = None,
    ) -> Callable[[str, float], tuple[tuple[object, ...], Placement] | None]:
        sign = self._sign()

        def fits(nid: str, t: float) -> tuple[tuple[object, ...], Placement] | None:
            line = self.line(nid)
            n = len(line.gpus) if ask is not None and ask.exclusive else need
            free = line.free_for(t, t + duration, own, self._allowed(line, nid, res), n)
            if not free:
                return None
            ids = tuple(line.gpus[p] for p in mask_positions(free, n))
            if ask is None:
                return (sign * free.bit_count(), nid), Placement(nid, ids)
            room = self._room(line, nid, t, t + duration, n, ask)
            if room is None or (ask.exclusive and len(ids) < need):
                return None
            return (sign * free.bit_count(), nid), Placement(nid, ids, 0, *room, ask.exclusive)

        return fits

    def _ids_fit(
        self,
        ids: frozenset[int],
        duration: float,
        res: Reservation | None,
        own: str | None,
        ask: ResourceAsk | None = None,
    ) -> Callable[[str, float], tuple[tuple[object, ...], Placement] | None]:
        sign = self._sign()

        def fits(nid: str, t: float) -> tuple[tuple[object, ...], Placement] | None:
            line = self.line(nid)
            if not ids <= line.pos.keys():
                return None
            held = ids if ask is None or not ask.exclusive else frozenset(line.gpus)
            wanted = sum(1 << line.pos[g] for g in held)
            free = line.free_for(t, t + duration, own, self._allowed(line, nid, res) & wanted, 1)
            if free != wanted:
                return None
            if ask is None:
                return (sign * free.bit_count(), nid), Placement(nid, tuple(sorted(ids)))
            room = self._room(line, nid, t, t + duration, len(held), ask)
            if room is None:
                return None
            placed = Placement(nid, tuple(sorted(held)), 0, *room, ask.exclusive)
            return (sign * free.bit_count(), nid), placed

        return fits

    def _share_fit(
        self,
        share: int,
        duration: float,
        res: Reservation | None,
        own: str | None,
        ask: ResourceAsk | None = None,
    ) -> Callable[[str, float], tuple[tuple[object, ...], Placement] | None]:
        sign = self._sign()

        def fits(nid: str, t: float) -> tuple[tuple[object, ...], Placement] | None:
            line = self.line(nid)
            allowed = self._allowed(line, nid, res)
            room = (0, 0)
            if ask is not None:
                found = self._room(line, nid, t, t + duration, 1, ask)
                if found is None:
                    return None
                room = found
            peak = line.peak(t, t + duration, own)
            best: tuple[int, int] | None = None
            for p, used in enumerate(peak):
                if allowed >> p & 1 and used + share <= SHARE_UNITS:
                    # fill_first: the fullest GPU that fits; spread: the emptiest.
                    key = (-sign * used, p)
                    if best is None or key < best:
                        best = key
            if best is None:
                return None
            return (best[0], nid), Placement(nid, (line.gpus[best[1]],), share, *room)

        return fits

    def _across(
        self,
        job: JobRequest,
        duration: float,
        floor: float,
        res: Reservation | None,
        members: frozenset[str] | None,
        per: int | None,
    ) -> Planned | None:
        """Several nodes: a gang of `job.nodes` x `per` GPUs, or (`per` None) a split
        `--distributed` job over the fewest nodes.

        Incremental over the candidate times: `room` keeps the nodes that count (at least
        `per` GPUs free for the whole run; any for a split).  A node can only gain room at a
        time it frees something, so each time re-checks the nodes freeing then and the ones
        already counted (which may lose room as the run moves later); until the job fits,
        fewer than its nodes (or its GPUs) are counted.
        """
        own = job.reservation
        need = requested_gpus(job)
        least = 1 if per is None else per
        room: dict[str, int] = {}  # node -> bitmask of GPUs free for the run
        total = 0

        def enough() -> bool:
            return len(room) >= job.nodes if per is not None and job.nodes else total >= need

        def check(nids: Iterable[str], t: float, early: bool = False) -> None:
            """Re-count `nids` at `t`; `early`: they come best first, stop once it fits."""
            nonlocal total
            for nid in nids:
                if members is not None and nid not in members:
                    continue
                self._tick()
                line = self.line(nid)
                free = line.free_for(t, t + duration, own, self._allowed(line, nid, res), least)
                if free and job.asks:
                    free = self._with_room(job, line, nid, t, t + duration, free, per)
                total -= room.pop(nid, 0).bit_count()
                if free:
                    room[nid] = free
                    total += free.bit_count()
                    if early and enough():
                        return

        def placed() -> tuple[Placement, ...] | None:
            if per is not None:
                assert job.nodes is not None
                if len(room) < job.nodes:
                    return None
                sign = self._sign()
                order = sorted(room, key=lambda n: (sign * room[n].bit_count(), n))
                return tuple(
                    self._across_at(job, nid, room[nid], per) for nid in order[: job.nodes]
                )
            if total < need:
                return None
            placements = []
            left = need
            for nid in sorted(room, key=lambda n: (-room[n].bit_count(), n)):
                take = min(room[nid].bit_count(), left)
                placements.append(self._across_at(job, nid, room[nid], take))
                left -= take
                if not left:
                    break
            return tuple(placements)

        if floor <= self.now and res is None:
            # Nodes with room now, best first (most free first for a split: fewest nodes).
            policy: Policy = self.policy if per is not None else "spread"
            check(self.pool.iter_nodes(least, policy), floor, early=True)
        else:
            check(self.views if members is None else members, floor)
        got = placed()
        if got is not None:
            return Planned(floor, got)
        for t, at in self._times_after(floor, members, res):
            check([*at, *(n for n in room if n not in at)], t)
            got = placed()
            if got is not None:
                return Planned(t, got)
        return None

    def _with_room(
        self,
        job: JobRequest,
        line: Line,
        nid: str,
        t: float,
        end: float,
        free: int,
        per: int | None,
    ) -> int:
        """Of the GPUs `free` on `nid` for [t, end), those a job asking for CPUs and memory
        may count there: all or none for a gang (`per` each; `--exclusive`: every GPU), the
        most its room allows for a split; 0 when none."""
        ask = job.ask
        every = (1 << len(line.gpus)) - 1
        if ask.exclusive:
            idle = free == every and self._room(line, nid, t, end, len(line.gpus), ask)
            return free if idle else 0
        if per is not None:
            return free if self._room(line, nid, t, end, per, ask) is not None else 0
        for gpus in range(free.bit_count(), 0, -1):
            if self._room(line, nid, t, end, gpus, ask) is not None:
                return sum(1 << p for p in mask_positions(free, gpus))
        return 0

    def _across_at(self, job: JobRequest, nid: str, free: int, n: int) -> Placement:
        """`n` of the GPUs `free` on `nid` (all of them for `--exclusive`), with the CPUs and
        memory the job holds there."""
        if not job.asks:
            return Placement(nid, self._ids(nid, free, n))
        if job.ask.exclusive:
            n = free.bit_count()
        cpus, mem = need_on(job.ask, n, self.views[nid])
        return Placement(nid, self._ids(nid, free, n), 0, cpus, mem, job.ask.exclusive)

    def _ids(self, nid: str, free: int, n: int) -> tuple[int, ...]:
        gpus = self.line(nid).gpus
        return tuple(gpus[p] for p in mask_positions(free, n))

    def _pinned(
        self, job: JobRequest, duration: float, floor: float, res: Reservation | None
    ) -> Planned | None:
        assert job.node_gpu_ids is not None
        wanted: dict[str, set[int]] = {}
        for nid, ids in job.node_gpu_ids:
            wanted.setdefault(nid, set()).update(ids)
        if not wanted or any(nid not in self.views for nid in wanted):
            return None
        own = job.reservation
        if job.asks and job.ask.exclusive:
            wanted = {nid: set(self.views[nid].gpu_indices) for nid in wanted}

        def attempt(t: float) -> bool:
            for nid, ids in wanted.items():
                self._tick()
                line = self.line(nid)
                if not ids <= line.pos.keys():
                    return False
                mask = sum(1 << line.pos[g] for g in ids)
                free = line.free_for(t, t + duration, own, self._allowed(line, nid, res) & mask, 1)
                if free != mask:
                    return False
                if job.asks and self._room(line, nid, t, t + duration, len(ids), job.ask) is None:
                    return False
            return True

        whole = job.asks and job.ask.exclusive
        placements = tuple(
            Placement(
                nid, tuple(sorted(ids)), 0, *need_on(job.ask, len(ids), self.views[nid]), whole
            )
            for nid, ids in wanted.items()
        )
        if attempt(floor):
            return Planned(floor, placements)
        for t, _ in self._times_after(floor, frozenset(wanted), res):
            if attempt(t):
                return Planned(t, placements)
        return None
