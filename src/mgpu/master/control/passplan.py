"""A pass's plan (its verdicts, not applied yet) and the head of a long queue that the quick
passes between full ones look at (master/control/loop.py runs both)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mgpu.model import Job, JobState
from mgpu.scheduler import Decisions, Eligibility

__all__ = ["Head", "Plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    """One pass's verdicts, computed from a snapshot and not applied yet."""

    now: float
    eligibility: Eligibility
    decisions: Decisions | None
    """None when no queued job was eligible (no scheduler call was needed)."""
    seconds: float
    """CPU time the planning took."""
    quick: bool = False
    """A quick pass's: its verdicts cover the head of the queue alone."""
    capped: Mapping[str, list[str]] = field(default_factory=dict)
    """A full pass's: each capped array's tasks waiting for its cap, in submit order."""
    queued: int = 0
    """A full pass's: how many jobs were queued."""
    users: frozenset[str] = frozenset()
    """A full pass's: the users of the jobs it could start (fairshare normalisation)."""
    estimated: bool = True
    """A full pass's: it made every waiting job's estimate (else the last ones stand)."""


@dataclass(slots=True)
class Head:
    """What the quick passes of a long queue look at, as the last full pass left it, and the
    jobs queued since."""

    order: list[str] = field(default_factory=list)
    """The last full pass's pending jobs in priority order."""
    cursor: int = 0
    """Where in `order` the first job still queued may be."""
    would_start: list[str] = field(default_factory=list)
    """Jobs the last full pass would have started (backfill deep in the queue): the quick
    passes that follow look at them too, so that depth does not hide them."""
    fresh: dict[str, None] = field(default_factory=dict)
    """Jobs queued since the last full pass's snapshot, in submit order."""
    fresh_old: dict[str, None] = field(default_factory=dict)
    """Jobs queued before the snapshot of the full pass under way (or last)."""
    capped: Mapping[str, list[str]] = field(default_factory=dict)
    """Each capped array's tasks waiting for its cap, in submit order."""
    capped_at: dict[str, int] = field(default_factory=dict)
    users: frozenset[str] = frozenset()
    """Users of the last full pass's pending jobs (fairshare normalisation)."""
    queued: int = 0
    """How many jobs the last full pass saw queued."""

    def snapshot_taken(self) -> None:
        """A full pass reads the queue now: the jobs queued so far are in it."""
        self.fresh_old.update(self.fresh)
        self.fresh = {}

    def full_applied(self, plan: Plan) -> None:
        """A full pass's plan is carried out: the quick passes start from it."""
        self.fresh_old = {}
        self.queued = plan.queued
        self.capped, self.capped_at = plan.capped, {}
        self.order = plan.decisions.order if plan.decisions is not None else []
        self.cursor = 0
        self.users = plan.users

    def pick(self, jobs: Mapping[str, Job], depth: int) -> list[Job]:
        """The queued jobs a quick pass looks at: the head of the last full order, the
        jobs the last full pass would have started, the first fresh ones, the next tasks
        of each capped array."""
        queued = JobState.QUEUED
        picked: dict[str, Job] = {}
        order, k, leading = self.order, self.cursor, True
        while k < len(order) and len(picked) < depth:
            job = jobs.get(order[k])
            if job is not None and job.state is queued:
                picked[job.id] = job
                leading = False
            elif leading:  # started or gone: the next quick pass need not look again
                self.cursor = k + 1
            k += 1
        if self.would_start:
            still = [job for job in map(jobs.get, self.would_start) if job and job.state is queued]
            self.would_start = [job.id for job in still]
            for job in still:
                picked.setdefault(job.id, job)
        for fresh in (self.fresh_old, self.fresh):
            gone, taken = [], 0
            for job_id in fresh:
                if taken >= depth:
                    break
                job = jobs.get(job_id)
                if job is None or job.state is not queued:
                    gone.append(job_id)
                    continue
                picked.setdefault(job_id, job)
                taken += 1
            for job_id in gone:
                del fresh[job_id]
        for array_id, tasks in self.capped.items():
            k = self.capped_at.get(array_id, 0)
            leading, taken, cap = True, 0, None
            while k < len(tasks) and (cap is None or taken < cap):
                job = jobs.get(tasks[k])
                if job is not None and job.state is queued:
                    picked.setdefault(job.id, job)
                    cap = min(depth, job.array_max_running or 1)
                    taken += 1
                    leading = False
                elif leading:
                    self.capped_at[array_id] = k + 1
                k += 1
        return list(picked.values())
