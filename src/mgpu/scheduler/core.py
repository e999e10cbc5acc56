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

Every pending job gets a `priorities`/`factors` entry; every one that does not start gets
a `reasons` entry: a limit, "waiting for 2 GPUs" and the like when it does not fit now,
or "priority" when it would fit but higher-priority work comes first.

Cost: placements are attempted only for jobs that start plus the scan window; every other
job is answered from per-pass caches keyed by request shape, so a pass over 50,000 jobs
is dominated by computing their priorities.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from .backfill import Reservation, find_reservation, release_events, shadow_pool
from .placement import FreePool, place, requested_gpus, wait_reason
from .preemption import plan_preemption
from .priority import compute_priorities, running_priorities, weighted_fairshare
from .types import Decisions, JobRequest, Placement, Snapshot, Start

__all__ = ["PRIORITY_REASON", "schedule"]

PRIORITY_REASON = "priority"
"""The reason of a job that would fit now but waits behind higher-priority work."""

_ShapeKey = tuple[object, ...]


def _shape_key(job: JobRequest) -> _ShapeKey:
    """Everything about a request that decides where it fits (not who or when)."""
    return (
        job.gpus,
        job.gpu_ids,
        job.node_gpu_ids,
        job.nodes,
        job.gpus_per_node,
        job.distributed,
        job.nodelist,
        job.exclude,
        job.allowed_nodes,
        job.gpu_type,
        job.requires,
    )


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide which pending jobs start now, where, and why the others wait."""
    with _cyclic_gc_paused():
        return _Pass(snapshot).run()


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

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.config = snapshot.config
        self.now = snapshot.now
        self.policy = self.config.placement_policy
        self.pool = FreePool(snapshot.nodes)
        self.decisions = Decisions()
        self.user_gpus: dict[str, int] = {}
        self.user_jobs: dict[str, int] = {}
        for r in snapshot.running:
            self.user_gpus[r.user] = self.user_gpus.get(r.user, 0) + r.gpus
            self.user_jobs[r.user] = self.user_jobs.get(r.user, 0) + 1
        self.started: list[tuple[float, tuple[Placement, ...]]] = []
        self._reasons: dict[_ShapeKey, tuple[str, bool]] = {}
        self.fairshare: dict[str, float] = {}

    # -- the pass

    def run(self) -> Decisions:
        pending = self.snapshot.pending
        d = self.decisions
        if not pending:
            return d
        needs = [
            j.gpus
            if j.nodes is None and j.node_gpu_ids is None and j.gpu_ids is None
            else requested_gpus(j)
            for j in pending
        ]
        self.fairshare = weighted_fairshare(self.snapshot)
        priorities, factors = compute_priorities(self.snapshot, needs, self.fairshare)
        ids = [j.job_id for j in pending]
        d.priorities = dict(zip(ids, priorities, strict=True))
        d.factors = dict(zip(ids, factors, strict=True))

        order = list(range(len(pending)))
        if self.config.queue_policy == "fifo":
            submitted = [j.submit_time for j in pending]
            order.sort(key=submitted.__getitem__)  # stable: ties keep the given order
        else:
            # Stable, so equal priorities keep `pending`'s (submit) order.  Age is part of
            # the priority, so exact ties are rare anyway.
            negated = [-p for p in priorities]
            order.sort(key=negated.__getitem__)
        self._scan(order, ids, needs, priorities)
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
        reservation: Reservation | None = None
        head: JobRequest | None = None
        examined = 0
        has_limits = (
            self.config.max_gpus_per_user is not None
            or self.config.max_running_jobs_per_user is not None
        )
        for pos, i in enumerate(order):
            if head is not None:
                if not backfill or examined >= depth:
                    self._finish(order[:pos], ids, needs)
                    return
                examined += 1
            job = pending[i]
            need = needs[i]
            if has_limits:
                limited = self._limit_reason(job, need)
                if limited is not None:
                    reasons[job.job_id] = limited
                    continue

            if head is None:
                placements = place(job, pool, self.policy) if need <= pool.total_free else None
                if placements is not None:
                    self._start(job, placements, need)
                    continue
                reason, runnable = self._wait_reason(job)
                reasons[job.job_id] = reason
                if not runnable:
                    continue
                head = job
                reservation = self._protect(job, priorities[i])
                if backfill and reservation is not None:
                    shadow = shadow_pool(pool, reservation)
                continue

            # A backfill candidate behind the head.
            placements = None
            if need <= shadow.total_free:
                placements = place(job, shadow, self.policy)
            if (
                placements is None
                and reservation is not None
                and need <= pool.total_free
                and self.now + self._time_limit(job) <= reservation.time
            ):
                placements = place(job, pool, self.policy)
            if placements is not None:
                self._start(job, placements, need, shadow)
                continue
            reason, runnable = self._wait_reason(job)
            if runnable and shadow is not pool and self._fits(job, need):
                reason = PRIORITY_REASON
            reasons[job.job_id] = reason

    def _finish(self, handled: list[int], ids: list[str], needs: list[int]) -> None:
        """Reasons for the jobs the scan did not reach (all but `handled`); the pool is final.

        Jobs with the same request shape get the same answer, so each distinct shape is
        worked out once.  This may run over tens of thousands of jobs, so it answers every
        job in `pending` (memory) order with list comprehensions, then lays the scan's own
        answers over the top.
        """
        pending = self.snapshot.pending
        # A plain "N GPUs anywhere" job (most of a long queue) is keyed by its count alone,
        # which allocates nothing; any other request by its full shape.
        keys: list[_ShapeKey | int] = [
            j.gpus
            if j.node_gpu_ids is None
            and j.nodes is None
            and j.gpu_ids is None
            and j.nodelist is None
            and j.gpu_type is None
            and j.allowed_nodes is None
            and not j.exclude
            and not j.requires
            and not j.distributed
            else _shape_key(j)
            for j in pending
        ]
        verdicts: dict[_ShapeKey | int, str] = {}
        for key, job in dict(zip(keys, pending, strict=True)).items():
            reason, runnable = self._wait_reason(job)
            if runnable and self._fits(job, requested_gpus(job)):
                reason = PRIORITY_REASON
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
        self.decisions.starts.append(Start(job.job_id, placements))
        user = job.user
        self.user_gpus[user] = self.user_gpus.get(user, 0) + need
        self.user_jobs[user] = self.user_jobs.get(user, 0) + 1
        limit = self.config.default_time_limit if job.time_limit is None else job.time_limit
        self.started.append((self.now + limit, placements))

    def _time_limit(self, job: JobRequest) -> float:
        return self.config.default_time_limit if job.time_limit is None else job.time_limit

    def _limit_reason(self, job: JobRequest, need: int) -> str | None:
        cfg = self.config
        user = job.user
        if cfg.max_running_jobs_per_user is not None:
            cap = cfg.max_running_jobs_per_user
            if self.user_jobs.get(user, 0) >= cap:
                return f"user {user} is at the limit of {cap} running job{'' if cap == 1 else 's'}"
        if cfg.max_gpus_per_user is not None and need > 0:
            cap = cfg.max_gpus_per_user
            used = self.user_gpus.get(user, 0)
            if need > cap:
                return f"the job needs {need} GPUs but user {user} may use at most {cap}"
            if used + need > cap:
                if used >= cap:
                    return f"user {user} is at the limit of {cap} GPUs in use"
                return (
                    f"user {user} has {used} of at most {cap} GPUs in use and the job needs {need}"
                )
        return None

    def _wait_reason(self, job: JobRequest, key: _ShapeKey | None = None) -> tuple[str, bool]:
        if key is None:
            key = _shape_key(job)
        found = self._reasons.get(key)
        if found is None:
            found = self._reasons[key] = wait_reason(job, self.pool)
        return found

    def _fits(self, job: JobRequest, need: int) -> bool:
        return need <= self.pool.total_free and place(job, self.pool, self.policy) is not None

    def _protect(self, head: JobRequest, priority: float) -> Reservation | None:
        """Preempt for the blocked head if allowed and possible, else reserve its start."""
        running = self.snapshot.running
        if self.config.preemption and any(r.preemptible for r in running):
            current = running_priorities(
                self.snapshot, (r for r in running if r.preemptible), self.fairshare
            )
            plan = plan_preemption(head, priority, self.pool, running, self.policy, current)
            if plan is not None:
                self.decisions.preempt.extend(plan.victims)
                n = len(plan.victims)
                reasons = self.decisions.reasons
                jobs = "1 lower-priority job" if n == 1 else f"{n} lower-priority jobs"
                reasons[head.job_id] = f"{reasons[head.job_id]}; preempting {jobs}"
                return Reservation(head.job_id, self.now, plan.placements)
        events = release_events(
            self.snapshot.running, self.started, self.now, self.config.default_time_limit
        )
        reservation = find_reservation(head, self.pool, events, self.policy)
        if reservation is not None:
            self.decisions.expected_start[head.job_id] = reservation.time
        return reservation
