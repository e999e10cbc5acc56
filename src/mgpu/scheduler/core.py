"""One scheduling pass: `schedule(snapshot) -> Decisions`.

Queue policies (`config.queue_policy`):

* ``fifo`` — submit order; the first job that cannot start blocks every job behind it
  (head-of-line blocking, like Slurm's sched/builtin without backfill).
* ``priority`` — multifactor priority order (`priority.py`), otherwise as ``fifo``.
* ``backfill`` — multifactor order plus EASY backfill (`backfill.py`): the first job that
  cannot start gets a reservation, and lower-priority jobs start only if they cannot
  delay it; at most `config.backfill_depth` jobs behind it are examined.

Whatever the policy, two kinds of job never block the queue: a job held by a per-user
limit (`max_gpus_per_user`, `max_running_jobs_per_user`), and a job that could not run
even on an idle cluster of the nodes that are up now (its pinned node is down, say).
Both simply wait with their reason.

With `config.preemption`, when the first blocked job could start by stopping preemptible
running jobs of strictly lower priority, those are returned in `Decisions.preempt`; the
job itself starts on a later pass, once their GPUs are released, and until then the GPUs
it will get are protected from backfill.  The running jobs' priorities are computed here,
as of `Snapshot.now` and by the pending jobs' formula (`running_priorities`), so the master
and the simulator weigh the same victims the same way.

Admin reservations (`Snapshot.reservations`): a job that could still run when a window
opens is kept off its GPUs (a job without a time limit always could: nothing ends it at
`default_time_limit`, which only estimates when its GPUs come back; its reason names the
reservation when that is what keeps it waiting), and a reservation's own jobs
(`JobRequest.reservation`) run only inside its window, only on its GPUs.  They are scanned
first, on a pool of those GPUs alone: they never block the rest of the queue, nor are
blocked by it.

Every pending job gets a `priorities`/`factors` entry; every one that does not start gets
a `reasons` entry: a limit, "waiting for 2 GPUs" and the like when it does not fit now,
or "priority" when it would fit but higher-priority work comes first.  After the
decisions, the planner (`plan.py`) gives waiting jobs an `expected_start` and says what
they wait for (`waiting_on`), within `config.plan_jobs` / `config.plan_seconds`.

Cost: placements are attempted only for jobs that start plus the scan window; every other
job is answered from per-pass caches keyed by request shape, so a pass over 50,000 jobs
is dominated by computing their priorities.  The estimates cost what their budget allows.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from mgpu.model import WaitCode

from .backfill import (
    HeadReservation,
    blocked_by,
    expected_end,
    find_reservation,
    place_around,
    reach,
    shadow_pool,
)
from .placement import (
    FreePool,
    could_ever_fit,
    place,
    requested_gpus,
    shape_key,
    wait_reason,
)
from .plan import Planned, Planner
from .planqueue import plan_queue
from .preemption import plan_preemption
from .priority import (
    FactorMap,
    compute_priorities,
    running_priorities,
    running_priority_floor,
    weighted_fairshare,
)
from .reservations import kept_out_note, member_reason, reservation_views
from .running import running_stats
from .shares import format_share
from .types import (
    SHARE_UNITS,
    Decisions,
    JobRequest,
    Placement,
    Reservation,
    Snapshot,
    Start,
    WaitReason,
    code_of,
)

__all__ = ["PRIORITY_REASON", "schedule"]

PRIORITY_REASON = WaitReason("priority", WaitCode.PRIORITY)
"""The reason of a job that would fit now but waits behind higher-priority work."""

_ShapeKey = tuple[object, ...]


_shape_key = shape_key  # everything about a request that decides where it fits


def schedule(snapshot: Snapshot, pool: FreePool | None = None) -> Decisions:
    """Decide which pending jobs start now, where, and why the others wait.

    `pool`: `snapshot.nodes` as a free pool, when the caller keeps one up to date a node at
    a time (master/state/nodeindex.py); the pass works on a copy of it rather than index every
    node's view anew.  It must agree with `snapshot.nodes`."""
    with _cyclic_gc_paused():
        return _Pass(snapshot, pool).run()


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the pass.

    A pass over a long queue allocates tens of thousands of short-lived objects, which
    makes CPython run full collections over everything the caller holds (every job of
    the master) — a quarter of the pass in measurements.  The pass creates no reference
    cycles, so reference counting frees all of it; collection resumes right after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Pass:
    """The mutable state of one pass: free GPUs, per-user counts, caches, decisions."""

    def __init__(self, snapshot: Snapshot, pool: FreePool | None = None) -> None:
        self.snapshot = snapshot
        self.config = snapshot.config
        self.now = snapshot.now
        self.policy = self.config.placement_policy
        self.pool = FreePool(snapshot.nodes) if pool is None else pool.copy()
        self.decisions = Decisions()
        # What the running jobs give: kept by the caller's `RunningSet`, or derived here.
        self.stats = running_stats(snapshot.running)
        # Share units (1000 = a GPU) and jobs per user, counting this pass's starts.
        self.user_gpus, self.user_jobs = self.stats.per_user()
        self.started: list[tuple[float, tuple[Placement, ...]]] = []
        self.started_ids: list[str] = []
        self._reasons: dict[object, tuple[WaitReason, bool]] = {}
        self._failed: dict[FreePool, set[object]] = {}  # shapes that fit no more (`_place`)
        self.fairshare: dict[str, float] = {}
        # Reservations still to come or under way, soonest first.
        self.reservations = sorted(
            (r for r in snapshot.reservations if r.end > self.now and r.placements),
            key=lambda r: (r.start, r.name),
        )
        self.by_name: dict[str, Reservation] = {r.name: r for r in self.reservations}
        self.member_pools: dict[str, FreePool] = {}
        # What the planner needs from the scan.
        self.held: set[str] = set()  # by a per-user limit: no estimate
        self.handled: list[int] = []  # scanned before the main scan (reservations' jobs)
        self.head: JobRequest | None = None
        self.head_reservation: HeadReservation | None = None

    # -- the pass

    def run(self) -> Decisions:
        pending = self.snapshot.pending
        d = self.decisions
        if not pending:
            return d
        needs = [j.gpus if j.counted else requested_gpus(j) for j in pending]
        sizes: list[int] | list[float] = needs
        if 0 in needs:  # a share counts F in the job-size factor (a --gpus 0 job counts 0)
            sizes = [
                j.gpu_share / SHARE_UNITS if j.gpu_share else n
                for j, n in zip(pending, needs, strict=True)
            ]
        self.fairshare = weighted_fairshare(self.snapshot)
        priorities, factors = compute_priorities(self.snapshot, sizes, self.fairshare)
        ids = [j.job_id for j in pending]
        d.priorities = dict(zip(ids, priorities, strict=True))
        d.factors = FactorMap(ids, factors)

        order = list(range(len(pending)))
        if self.config.queue_policy == "fifo":
            submitted = [j.submit_time for j in pending]
            order.sort(key=submitted.__getitem__)  # stable: ties keep the given order
        else:
            # Stable, so equal priorities keep `pending`'s (submit) order.  Age is part of
            # the priority, so exact ties are rare anyway.
            negated = [-p for p in priorities]
            order.sort(key=negated.__getitem__)
        full_order = order
        d.order = [ids[i] for i in order]
        if self.reservations:
            # A reservation's jobs use its GPUs alone: scanned apart, first.
            member = [j.reservation is not None for j in pending]
            if any(member):
                self._scan_members([i for i in order if member[i]], needs)
                order = [i for i in order if not member[i]]
        self._scan(order, ids, needs, priorities)
        if self.config.plan_jobs > 0:
            self._plan(full_order)
        return d

    def _scan(
        self, order: list[int], ids: list[str], needs: list[int], priorities: list[float]
    ) -> None:
        """Start what may start, taking pending jobs in `order` (indices into `pending`)."""
        pending = self.snapshot.pending
        backfill = self.config.queue_policy == "backfill"
        depth = max(0, self.config.backfill_depth)
        reasons = self.decisions.reasons
        pool = self.pool
        shadow = pool  # the GPUs backfill may use freely (pool minus the reservation)
        reservation: HeadReservation | None = None
        head: JobRequest | None = None
        examined = 0
        has_limits = (
            self.config.max_gpus_per_user is not None
            or self.config.max_running_jobs_per_user is not None
        )
        for pos, i in enumerate(order):
            if head is not None:
                if not backfill or examined >= depth:
                    self._finish(self.handled + order[:pos], ids, needs)
                    return
                examined += 1
            job = pending[i]
            need = needs[i]
            if has_limits:
                limited = self._limit_reason(job, need)
                if limited is not None:
                    reasons[job.job_id] = limited
                    self.held.add(job.job_id)
                    continue
            if job.reservation is not None:  # of a reservation that is not in the snapshot
                reasons[job.job_id] = self._wait_reason(job)[0]
                continue

            if head is None:
                placements = self._place(job, pool) if need <= pool.total_free else None
                if placements is not None and has_limits and self._over_limit(job, placements):
                    continue
                if placements is not None:
                    self._start(job, placements, need)
                    continue
                reason, runnable = self._wait_reason(job)
                if self.reservations:
                    reason = self._note(job, reason, runnable)
                reasons[job.job_id] = reason
                if not runnable:
                    continue
                head = self.head = job
                reservation = self.head_reservation = self._protect(job, priorities[i])
                if backfill and reservation is not None:
                    shadow = shadow_pool(pool, reservation)
                continue

            # A backfill candidate behind the head.
            placements = None
            if need <= shadow.total_free:
                placements = self._place(job, shadow)
            if (
                placements is None
                and reservation is not None
                and need <= pool.total_free
                and self.now + self._time_limit(job) <= reservation.time
            ):
                placements = self._place(job, pool)
            if placements is not None and has_limits and self._over_limit(job, placements):
                continue
            if placements is not None:
                self._start(job, placements, need, shadow)
                continue
            reason, runnable = self._wait_reason(job)
            if runnable and shadow is not pool and self._fits(job, need):
                reason = PRIORITY_REASON
            elif self.reservations:
                reason = self._note(job, reason, runnable)
            reasons[job.job_id] = reason

    def _scan_members(self, order: list[int], needs: list[int]) -> None:
        """Start reservations' jobs that fit in their reservation's GPUs now."""
        pending = self.snapshot.pending
        reasons = self.decisions.reasons
        has_limits = (
            self.config.max_gpus_per_user is not None
            or self.config.max_running_jobs_per_user is not None
        )
        for i in order:
            job = pending[i]
            need = needs[i]
            self.handled.append(i)
            if has_limits:
                limited = self._limit_reason(job, need)
                if limited is not None:
                    reasons[job.job_id] = limited
                    self.held.add(job.job_id)
                    continue
            res = self.by_name.get(job.reservation or "")
            placements = None
            if res is not None and res.start <= self.now:
                pool = self._member_pool(res)
                if need <= pool.total_free:
                    placements = self._place(job, pool)
            if placements is not None and has_limits and self._over_limit(job, placements):
                continue
            if placements is not None:
                self._start(job, placements, need)
            else:
                reasons[job.job_id] = self._wait_reason(job)[0]

    def _finish(self, handled: list[int], ids: list[str], needs: list[int]) -> None:
        """Reasons for the jobs the scan did not reach (all but `handled`); the pool is final.

        Jobs with the same request shape get the same answer, so each distinct shape is
        worked out once.  This may run over tens of thousands of jobs, so it answers every
        job in `pending` (memory) order with list comprehensions, then lays the scan's own
        answers over the top.
        """
        pending = self.snapshot.pending
        keys: list[object]
        if self.reservations:
            # Which reservations a job must keep off depends on its time limit too.
            starts = [r.start for r in self.reservations]
            now = self.now
            keys = [(_shape_key(j), bisect_left(starts, now + reach(j))) for j in pending]
        else:
            # A plain "N GPUs anywhere" job (most of a long queue) is keyed by its count
            # alone, which allocates nothing (with its ask's numbers when it asks for CPUs or
            # memory: made with the request); any other request by its full shape.
            keys = [_shape_key(j) if (k := j.fit_key) is None else k for j in pending]
        verdicts: dict[object, str] = {}
        for key, job in dict(zip(keys, pending, strict=True)).items():
            reason, runnable = self._wait_reason(job)
            if runnable and self._fits(job, requested_gpus(job)):
                reason = PRIORITY_REASON
            else:
                reason = self._note(job, reason, runnable)
            verdicts[key] = reason
        d = self.decisions
        reasons = dict(zip(ids, map(verdicts.__getitem__, keys), strict=True))
        for start in d.starts:
            del reasons[start.job_id]
        reasons.update(d.reasons)
        d.reasons = reasons
        if (
            self.config.max_gpus_per_user is not None
            or self.config.max_running_jobs_per_user is not None
        ):
            done = set(handled)
            for k, job in enumerate(pending):
                if k not in done:
                    limited = self._limit_reason(job, needs[k])
                    if limited is not None:
                        reasons[ids[k]] = limited
                        self.held.add(ids[k])

    # -- helpers

    def _start(
        self,
        job: JobRequest,
        placements: tuple[Placement, ...],
        need: int,
        shadow: FreePool | None = None,
    ) -> None:
        self.pool.take(placements)
        if shadow is not None and shadow is not self.pool:
            shadow.take(placements)
        for pool in self.member_pools.values():
            pool.take(placements)
        self.decisions.starts.append(Start(job.job_id, placements))
        user = job.user
        if job.asks and job.ask.exclusive:  # it holds every GPU of its nodes
            need = sum(len(p.gpu_ids) for p in placements)
        units = job.gpu_share or need * SHARE_UNITS
        self.user_gpus[user] = self.user_gpus.get(user, 0) + units
        self.user_jobs[user] = self.user_jobs.get(user, 0) + 1
        limit = self.config.default_time_limit if job.time_limit is None else job.time_limit
        self.started.append((self.now + limit, placements))
        self.started_ids.append(job.job_id)

    def _over_limit(self, job: JobRequest, placements: tuple[Placement, ...]) -> bool:
        """An `--exclusive` job holds every GPU of its nodes, more than it asked for: the
        per-user limit counts what it would hold (its reason set when that is too much)."""
        if not (job.asks and job.ask.exclusive):
            return False
        limited = self._limit_reason(job, sum(len(p.gpu_ids) for p in placements))
        if limited is None:
            return False
        self.decisions.reasons[job.job_id] = limited
        self.held.add(job.job_id)
        return True

    def _time_limit(self, job: JobRequest) -> float:
        return self.config.default_time_limit if job.time_limit is None else job.time_limit

    def _limit_reason(self, job: JobRequest, need: int) -> WaitReason | None:
        cfg = self.config
        user = job.user
        if cfg.max_running_jobs_per_user is not None:
            cap = cfg.max_running_jobs_per_user
            if self.user_jobs.get(user, 0) >= cap:
                limit = f"user {user} is at the limit of {cap} running job{'' if cap == 1 else 's'}"
                return WaitReason(limit, WaitCode.USER_JOB_LIMIT)
        units = job.gpu_share or need * SHARE_UNITS
        if cfg.max_gpus_per_user is not None and units > 0:
            cap = cfg.max_gpus_per_user
            used = self.user_gpus.get(user, 0)
            wanted = format_share(units)
            text: str | None = None
            if units > cap * SHARE_UNITS:
                text = f"the job needs {wanted} GPUs but user {user} may use at most {cap}"
            elif used + units > cap * SHARE_UNITS:
                if used >= cap * SHARE_UNITS:
                    text = f"user {user} is at the limit of {cap} GPUs in use"
                else:
                    text = (
                        f"user {user} has {format_share(used)} of at most {cap} GPUs in use "
                        f"and the job needs {wanted}"
                    )
            if text is not None:
                return WaitReason(text, WaitCode.USER_GPU_LIMIT)
        return None

    def _wait_reason(self, job: JobRequest) -> tuple[WaitReason, bool]:
        # A plain "N GPUs anywhere" request's reason depends on N (and its ask) alone.
        key = job.fit_key
        if key is None:
            key = _shape_key(job)
        found = self._reasons.get(key)
        if found is None:
            if job.reservation is None:
                text, runnable = wait_reason(job, self.pool)
                code = WaitCode.RESOURCES if runnable else WaitCode.NODE_NOT_AVAILABLE
                found = (WaitReason(text, code), runnable)
            else:
                text = self._member_reason(job, job.reservation)
                found = (WaitReason(text, WaitCode.RESERVATION), False)
            self._reasons[key] = found
        return found

    def _member_reason(self, job: JobRequest, name: str) -> str:
        """Why a reservation's job waits.  Never runnable in the main scan's sense: it uses
        the reservation's GPUs alone, so it must not hold up anyone else."""
        res = self.by_name.get(name)
        why = member_reason(name, res, self.now)
        if why is not None or res is None:
            return why or f"reservation {name} does not exist or has ended"
        pool = self._member_pool(res)
        never = could_ever_fit(job, pool.views)
        if never is not None:
            return f"reservation {name} cannot run it: {never}"
        reason, _ = wait_reason(job, pool)
        return f"{reason} of reservation {name}"

    def _member_pool(self, res: Reservation) -> FreePool:
        """The reservation's GPUs alone, as they are now in this pass."""
        pool = self.member_pools.get(res.name)
        if pool is None:
            main = self.pool
            live = [
                replace(
                    view,
                    free_gpus=frozenset(g for g in view.gpu_indices if g in main.free(nid)),
                    shared={g: u for g, u in main.shared(nid).items() if g in view.gpu_indices},
                    free_cpus=main.free_cpus(nid),
                    free_mem_mb=main.free_mem(nid),
                    bare_jobs=main.bare_jobs(nid),
                    whole=main.held_whole(nid),
                )
                for view in reservation_views(res, main.views)
                if main.is_up(nid := view.node_id)
            ]
            pool = self.member_pools[res.name] = FreePool(live)
        return pool

    def _blocks(self, job: JobRequest) -> list[Reservation]:
        """The reservations `job` must keep off if it started now."""
        return blocked_by(self.reservations, self.now, reach(job), job.reservation)

    def _place(self, job: JobRequest, pool: FreePool) -> tuple[Placement, ...] | None:
        if self.reservations:
            return place_around(job, pool, self.policy, self._blocks(job))
        key = job.fit_key if job.asks else None
        if key is None:
            return place(job, pool, self.policy)
        # A pass only takes from its pools: a shape that did not fit one never will in this
        # pass, and one whose CPUs are short on most nodes would walk them all every time.
        failed = self._failed.setdefault(pool, set())
        if key in failed:
            return None
        placements = place(job, pool, self.policy)
        if placements is None:
            failed.add(key)
        return placements

    def _fits(self, job: JobRequest, need: int) -> bool:
        return need <= self.pool.total_free and self._place(job, self.pool) is not None

    def _note(self, job: JobRequest, reason: WaitReason, runnable: bool) -> WaitReason:
        """`reason`, naming the reservation when one is what keeps `job` off GPUs now free."""
        if not self.reservations or not runnable or job.reservation is not None:
            return reason
        blocks = self._blocks(job)
        if not blocks or requested_gpus(job) > self.pool.total_free:
            return reason
        placements = place(job, self.pool, self.policy)
        if placements is None:
            return reason
        used = {(p.node_id, g) for p in placements for g in p.gpu_ids}
        for res in blocks:
            if any((p.node_id, g) in used for p in res.placements for g in p.gpu_ids):
                return WaitReason(f"{reason} ({kept_out_note(res, self.now)})", reason.code)
        return reason

    def _protect(self, head: JobRequest, priority: float) -> HeadReservation | None:
        """Preempt for the blocked head if allowed and possible, else reserve its start."""
        running = self.snapshot.running
        victims = self.stats.preemptible() if self.config.preemption else []
        # No running job's priority can be below the floor: none could be a victim.
        if victims and running_priority_floor(self.snapshot, self.stats, self.fairshare) < priority:
            current = running_priorities(self.snapshot, victims, self.fairshare)
            pool = self.pool
            if self.reservations:  # the head's GPUs must be clear of reservations too
                pool = pool.copy()
                pool.block(p for r in self._blocks(head) for p in r.placements)
            plan = plan_preemption(head, priority, pool, running, self.policy, current, victims)
            if plan is not None:
                self.decisions.preempt.extend(plan.victims)
                n = len(plan.victims)
                reasons = self.decisions.reasons
                jobs = "1 lower-priority job" if n == 1 else f"{n} lower-priority jobs"
                was = reasons[head.job_id]
                reasons[head.job_id] = WaitReason(
                    f"{was}; preempting {jobs}", code_of(was) or WaitCode.RESOURCES
                )
                return HeadReservation(head.job_id, self.now, plan.placements)
        events = self.stats.releases(self.now, self.config.default_time_limit, self.started)
        reservation = find_reservation(
            head, self.pool, events, self.policy, self.reservations, reach(head)
        )
        if reservation is not None:
            self.decisions.expected_start[head.job_id] = reservation.time
        return reservation

    # -- estimates

    def _plan(self, order: list[int]) -> None:
        """Estimated starts and what each waiting job waits for (`plan.py`)."""
        cfg = self.config
        d = self.decisions
        pending = self.snapshot.pending
        started = set(self.started_ids)
        if len(started) == len(pending):
            return
        budget = cfg.plan_seconds
        deadline = None if budget is None else time.perf_counter() + budget
        victims = set(d.preempt)
        now, default = self.now, cfg.default_time_limit
        intervals = [
            (r.job_id, expected_end(r.start_time, r.time_limit, default, now), r.placements)
            for r in self.snapshot.running
            if r.job_id not in victims
        ]
        intervals.extend(
            (job_id, end, placements)
            for job_id, (end, placements) in zip(self.started_ids, self.started, strict=True)
        )
        planner = Planner(
            now, self.pool, self.snapshot.nodes, intervals, self.reservations, self.policy, deadline
        )
        ordered = cfg.queue_policy != "backfill"
        skip = started | self.held
        floor, ahead = now, None
        head, res = self.head, self.head_reservation
        if head is not None:
            skip.add(head.job_id)
            if res is not None:
                if victims:
                    gone = [r for r in self.snapshot.running if r.job_id in victims]
                    planner.release_now(p for r in gone for p in r.placements)
                planned = Planned(res.time, res.placements)
                planner.commit(head.job_id, planned, self._time_limit(head))
                d.expected_start[head.job_id] = res.time
                on = list(d.preempt) if res.time <= now else []
                on.extend(planner.waiting_on(planned, None))
                d.waiting_on[head.job_id] = tuple(dict.fromkeys(on))
                floor, ahead = res.time, head.job_id
            elif ordered:
                return  # nothing behind a head that never starts may pass it

        def waiting() -> Iterator[JobRequest]:
            for i in order:
                job = pending[i]
                if job.job_id in skip:
                    continue
                if job.reservation is None and not self._wait_reason(job)[1]:
                    continue  # could not run on the nodes that are up: no estimate
                yield job

        starts, waits = plan_queue(
            planner, waiting(), self._time_limit, ordered, cfg.plan_jobs, floor, ahead
        )
        d.expected_start.update(starts)
        d.waiting_on.update(waits)
