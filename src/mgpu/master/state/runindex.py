"""The running jobs as the scheduler sees them, kept by the jobs' changes instead of found
by a walk over every node or job at every pass.

Every change to a job goes through `UnitOfWork.persist` (it is written before it is acted
on), which tells `touched`; a pass first `refresh`es the jobs touched since the last one:
a job that runs gets its `RunningJob` (made anew only when what it is made of changed),
one that no longer runs leaves.  The kept `RunningSet` (scheduler/running.py) keeps what a
pass derives from the running jobs (per-user counts, the preemptible ones, when GPUs come
back, the running work's usage), and each array's running tasks are counted here.  A job
still launching (no start time) counts from `now`, as it always did: it is made anew until
its start is known (a handful at a time), once LAUNCHING_RECOUNT has passed since it was
last made.  The set is built from every job at the first refresh (jobs loaded at start-up
were not touched).
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu.master.state.snapshot import running_job
from mgpu.model import Job, JobState
from mgpu.scheduler.running import RunningSet

__all__ = ["RunningIndex"]

_Key = tuple[object, ...]

LAUNCHING_RECOUNT = 1.0
"""Seconds after which a launching job is counted from `now` again.  Passes come up to a
hundred a second while jobs stream in, and making each launching job anew at each one was
a good part of a pass; a second in an expected end changes no plan that matters (Slurm's
backfill plans in minutes: bf_resolution, 60 s)."""


def _key(job: Job) -> _Key:
    """What a started job's `RunningJob` is made of and may change while it runs."""
    return (job.start_time, job.epoch, job.time_limit, job.priority, job.preemptible)


class RunningIndex:
    def __init__(self, jobs: Mapping[str, Job], default_limit: float) -> None:
        self._jobs = jobs
        self.default_limit = default_limit
        self.set = RunningSet(default_limit)
        self.arrays: dict[str, int] = {}
        """Each array's running tasks."""
        self._made: dict[str, _Key | None] = {}
        """The key each kept job was made from (None: launching, made at every refresh)."""
        self._launching: dict[str, float] = {}
        """Kept jobs whose start is not known yet, with the `now` they were made at (made
        again LAUNCHING_RECOUNT later)."""
        self._array: dict[str, str] = {}
        self._touched: dict[str, None] = {}
        self._built = False

    def touched(self, job: Job) -> None:
        """The job changed (any change: most are not a running job's)."""
        self._touched[job.id] = None

    def refresh(self, now: float) -> RunningSet:
        """The running jobs as of now (the kept set: the caller must not change it)."""
        if not self._built:
            self._built = True
            self._touched = dict.fromkeys(self._jobs)
        touched, self._touched = self._touched, {}
        for job_id in touched:
            self._update(job_id, now)
        for job_id, made in list(self._launching.items()):
            if job_id not in touched and not 0 <= now - made < LAUNCHING_RECOUNT:
                self._update(job_id, now)  # still launching: it counts from now
        return self.set

    def _update(self, job_id: str, now: float) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING:
            if self._made.pop(job_id, False) is not False:
                self.set.drop(job_id)
                self._launching.pop(job_id, None)
                array = self._array.pop(job_id, None)
                if array is not None:
                    left = self.arrays[array] - 1
                    if left:
                        self.arrays[array] = left
                    else:
                        del self.arrays[array]
            return
        key = None if job.start_time is None else _key(job)
        if key is not None and job_id in self._made and self._made[job_id] == key:
            return
        if job_id not in self._made and job.array_job_id is not None:
            self._array[job_id] = job.array_job_id
            self.arrays[job.array_job_id] = self.arrays.get(job.array_job_id, 0) + 1
        self._made[job_id] = key
        if key is None:
            self._launching[job_id] = now
        else:
            self._launching.pop(job_id, None)
        self.set.put(running_job(job, now))
