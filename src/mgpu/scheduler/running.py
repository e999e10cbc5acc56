"""The running jobs as a pass reads them, with what it derives from them kept up to date.

A pass reads `Snapshot.running` for a few things: each user's GPUs and jobs (per-user
limits), the users who take part in fairshare, the preemptible jobs (and whether any could
be of lower priority than a blocked head), and the times their GPUs come back (backfill's
reservation for that head).  Derived from a list, each costs a walk over every running job
at every pass: at 8,000 running jobs that was most of a pass.  `RunningSet` keeps them as
jobs are put and dropped (the master does so at every transition: master/state/runindex.py), so
a pass costs what changed; a plain sequence (the simulator, tests) gets the same answers
derived on demand (`running_stats`).  Both give identical answers for the same jobs in the
same order: the order is the set's (first put first), and every answer is the one a walk
over the jobs in that order would give.

The running jobs' usage so far (fairshare) is kept exactly (`Fraction`s of GPU-seconds, and
of CPU- and MiB-seconds beside them), so it does not depend on the order jobs came and went:
`running_usage` is the same sum made at once.  The billing weights (`BillingWeights`) apply
when it is read.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from itertools import chain
from typing import overload

from .backfill import Release, release_events
from .types import GPU_BILLING, SHARE_UNITS, BillingWeights, Placement, RunningJob

__all__ = ["RunningSet", "RunningStats", "running_stats", "running_usage"]


def _end(job: RunningJob, default_limit: float) -> float:
    """When the job's GPUs are expected back, not clamped to now (see `releases`)."""
    return job.start_time + (default_limit if job.time_limit is None else job.time_limit)


def running_usage(
    now: float, running: Iterable[RunningJob], billing: BillingWeights = GPU_BILLING
) -> dict[str, float]:
    """Each user's running work so far at `now` in GPU-seconds (a share counts F), or what
    `billing` charges for it: the sum of GPUs x (now - start) over their jobs (and of their
    CPUs and memory), exact and then rounded, never below 0."""
    units: dict[str, int] = {}
    started: dict[str, Fraction] = {}
    held: dict[str, list[Fraction]] = {}
    for r in running:
        units[r.user] = units.get(r.user, 0) + r.gpu_units
        started[r.user] = started.get(r.user, Fraction(0)) + r.gpu_units * Fraction(r.start_time)
        if r.cpus or r.mem_mb:
            _hold(held, r, 1)
    return _usage(now, units, started, held, billing)


def _hold(held: dict[str, list[Fraction]], job: RunningJob, sign: int) -> None:
    """Add (`sign` 1) or take out (-1) the job's CPUs and memory: [cpus, MiB, Σ cpus·start,
    Σ MiB·start] per user."""
    sums = held.setdefault(job.user, [Fraction(0)] * 4)
    start = Fraction(job.start_time)
    sums[0] += sign * job.cpus
    sums[1] += sign * job.mem_mb
    sums[2] += sign * job.cpus * start
    sums[3] += sign * job.mem_mb * start
    if not (sums[0] or sums[1]):
        del held[job.user]


def _usage(
    now: float,
    units: Mapping[str, int],
    started: Mapping[str, Fraction],
    held: Mapping[str, list[Fraction]],
    billing: BillingWeights,
) -> dict[str, float]:
    at = Fraction(now)
    out: dict[str, float] = {}
    if billing.gpu_only:
        for user, n in units.items():
            if n:
                out[user] = max(0.0, float((n * at - started[user]) / SHARE_UNITS))
        return out
    gpu, cpu, mem = (Fraction(w) for w in (billing.gpu, billing.cpu, billing.mem_gb / 1024))
    for user, n in units.items():
        total = gpu * (n * at - started[user]) / SHARE_UNITS
        sums = held.get(user)
        if sums is not None:
            total += cpu * (sums[0] * at - sums[2]) + mem * (sums[1] * at - sums[3])
        if total:
            out[user] = max(0.0, float(total))
    return out


class RunningStats:
    """What a pass derives from the running jobs, derived from a sequence on demand (the
    answers `RunningSet` keeps)."""

    def __init__(self, running: Sequence[RunningJob]) -> None:
        self._running = running
        self._users: tuple[dict[str, int], dict[str, int]] | None = None
        self._pre: list[RunningJob] | None = None

    def per_user(self) -> tuple[dict[str, int], dict[str, int]]:
        """Each user's GPUs in use (share units) and running jobs (new dicts)."""
        if self._users is None:
            gpus: dict[str, int] = {}
            jobs: dict[str, int] = {}
            for r in self._running:
                gpus[r.user] = gpus.get(r.user, 0) + r.gpu_units
                jobs[r.user] = jobs.get(r.user, 0) + 1
            self._users = gpus, jobs
        return dict(self._users[0]), dict(self._users[1])

    def users(self) -> Iterable[str]:
        """The users with running jobs."""
        return {r.user for r in self._running}

    def preemptible(self) -> list[RunningJob]:
        """The preemptible jobs, in order."""
        if self._pre is None:
            self._pre = [r for r in self._running if r.preemptible]
        return self._pre

    def floor(self) -> Mapping[str, tuple[float, int, int]] | None:
        """Per user with preemptible jobs: (latest submit, least GPU units, least
        `--priority`) over a superset of them, from which no job's priority can be lower
        (see `core._protect`); None when not kept."""
        return None

    def releases(
        self,
        now: float,
        default_limit: float,
        started: Iterable[tuple[float, tuple[Placement, ...]]],
    ) -> Iterator[Release]:
        """Every finite release, soonest first (running jobs' before those `started` at the
        same time, each in order): `backfill.release_events`, made as it is read."""
        return iter(release_events(self._running, started, now, default_limit))


class RunningSet(Sequence[RunningJob], RunningStats):
    """Running jobs kept by their owner (`put`, `drop`), with `RunningStats` kept up to date.

    `copy()` gives a set nobody else changes (for a pass on another thread)."""

    def __init__(self, default_limit: float, jobs: Iterable[RunningJob] = ()) -> None:
        self.default_limit = default_limit
        """The limit of a job without one: its release time is kept with it."""
        self._jobs: dict[str, RunningJob] = {}
        self._seq: dict[str, int] = {}
        self._next = 0
        self._list: list[RunningJob] | None = None
        self._ends: list[tuple[float, int, str]] = []
        """(expected end, seq, job id), sorted."""
        self._pre_jobs: dict[str, RunningJob] = {}
        self._pre_sorted = True
        self._units: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._started: dict[str, Fraction] = {}
        self._held: dict[str, list[Fraction]] = {}
        self._floor: dict[str, tuple[float, Counter[int], Counter[int]]] = {}
        for job in jobs:
            self.put(job)

    # -- keeping

    def put(self, job: RunningJob) -> None:
        """Add `job`, or replace the job of its id (which keeps its place)."""
        old = self._jobs.get(job.job_id)
        if old is not None:
            if old is job:
                return
            self._remove(old, job.preemptible)
            seq = self._seq[job.job_id]
        else:
            seq = self._seq[job.job_id] = self._next
            self._next += 1
        self._jobs[job.job_id] = job
        self._list = None
        insort(self._ends, (_end(job, self.default_limit), seq, job.job_id))
        user = job.user
        self._units[user] = self._units.get(user, 0) + job.gpu_units
        self._count[user] = self._count.get(user, 0) + 1
        self._started[user] = self._started.get(user, Fraction(0)) + job.gpu_units * Fraction(
            job.start_time
        )
        if job.cpus or job.mem_mb:
            _hold(self._held, job, 1)
        if job.preemptible:
            if old is not None and not old.preemptible:  # appended last: out of order
                self._pre_sorted = False
            self._pre_jobs[job.job_id] = job  # (a replaced one keeps its place)
            submitted = job.start_time if job.submit_time is None else job.submit_time
            latest, units, prios = self._floor.get(user) or (submitted, Counter(), Counter())
            units[job.gpu_units] += 1
            prios[job.priority] += 1
            self._floor[user] = (max(latest, submitted), units, prios)

    def drop(self, job_id: str) -> None:
        old = self._jobs.pop(job_id, None)
        if old is not None:
            self._remove(old)
            del self._seq[job_id]
            self._list = None

    def _remove(self, old: RunningJob, keep: bool = False) -> None:
        """Take `old`'s part out of the answers (`keep`: its place among the preemptible,
        for the job replacing it)."""
        seq = self._seq[old.job_id]
        entry = (_end(old, self.default_limit), seq, old.job_id)
        k = bisect_right(self._ends, entry) - 1
        assert self._ends[k] == entry
        del self._ends[k]
        user = old.user
        self._units[user] -= old.gpu_units
        self._count[user] -= 1
        self._started[user] -= old.gpu_units * Fraction(old.start_time)
        if old.cpus or old.mem_mb:
            _hold(self._held, old, -1)
        if not self._count[user]:
            del self._units[user], self._count[user], self._started[user]
        if old.preemptible:
            if not keep:
                del self._pre_jobs[old.job_id]
            _, units, prios = self._floor[user]
            for counter, key in ((units, old.gpu_units), (prios, old.priority)):
                counter[key] -= 1
                if not counter[key]:
                    del counter[key]
            if not prios:  # none left: the latest submit starts again
                del self._floor[user]

    def copy(self) -> RunningSet:
        other = RunningSet.__new__(RunningSet)
        other.default_limit = self.default_limit
        other._jobs = dict(self._jobs)
        other._seq = dict(self._seq)
        other._next = self._next
        other._list = self._list
        other._ends = list(self._ends)
        other._pre_jobs = dict(self._pre_jobs)
        other._pre_sorted = self._pre_sorted
        other._units = dict(self._units)
        other._count = dict(self._count)
        other._started = dict(self._started)
        other._held = {u: list(sums) for u, sums in self._held.items()}
        other._floor = {u: (t, Counter(a), Counter(p)) for u, (t, a, p) in self._floor.items()}
        return other

    # -- the sequence

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[RunningJob]:
        return iter(self._jobs.values())

    def __contains__(self, job: object) -> bool:
        return isinstance(job, RunningJob) and self._jobs.get(job.job_id) is job

    @overload
    def __getitem__(self, i: int) -> RunningJob: ...
    @overload
    def __getitem__(self, i: slice) -> list[RunningJob]: ...
    def __getitem__(self, i: int | slice) -> RunningJob | list[RunningJob]:
        if self._list is None:
            self._list = list(self._jobs.values())
        return self._list[i]

    def get(self, job_id: str) -> RunningJob | None:
        return self._jobs.get(job_id)

    # -- the answers

    def usage(self, now: float, billing: BillingWeights = GPU_BILLING) -> dict[str, float]:
        """`running_usage(now, self, billing)`, from the kept sums."""
        return _usage(now, self._units, self._started, self._held, billing)

    def per_user(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self._units), dict(self._count)

    def users(self) -> Iterable[str]:
        return self._count.keys()

    def preemptible(self) -> list[RunningJob]:
        if not self._pre_sorted:
            seq = self._seq
            ordered = sorted(self._pre_jobs.values(), key=lambda r: seq[r.job_id])
            self._pre_jobs = {r.job_id: r for r in ordered}
            self._pre_sorted = True
        return list(self._pre_jobs.values())

    def floor(self) -> Mapping[str, tuple[float, int, int]]:
        return {u: (t, min(a), min(p)) for u, (t, a, p) in self._floor.items()}

    def releases(
        self,
        now: float,
        default_limit: float,
        started: Iterable[tuple[float, tuple[Placement, ...]]],
    ) -> Iterator[Release]:
        if default_limit != self.default_limit:
            return RunningStats(self).releases(now, default_limit, started)
        return self._releases(now, started)

    def _releases(
        self, now: float, started: Iterable[tuple[float, tuple[Placement, ...]]]
    ) -> Iterator[Release]:
        jobs, ends = self._jobs, self._ends
        k = bisect_right(ends, (now, math.inf))
        # Overdue ones come back now, in the set's order (as a stable sort on the clamped
        # time would give them); the others by their end, ties in the set's order.
        overdue = sorted(ends[:k], key=lambda e: e[1])
        mine = (
            Release(now if i < k else end, jobs[job_id].placements)
            for i, (end, _, job_id) in enumerate(chain(overdue, ends[k:]))
        )
        theirs = sorted((Release(max(now, end), p) for end, p in started), key=lambda e: e.time)
        for event in heapq.merge(mine, theirs, key=lambda e: e.time):
            if not math.isfinite(event.time):
                return
            yield event


def running_stats(running: Sequence[RunningJob]) -> RunningStats:
    """The kept answers of a `RunningSet`, or answers derived from any other sequence."""
    return running if isinstance(running, RunningSet) else RunningStats(running)
