"""Which queued jobs may be scheduled now: begin times, retry backoff, dependencies, array caps.

`eligibility(queued, now, targets, array_running)` runs before `schedule()`, in the master
and in the simulator alike; what it lets through is `Snapshot.pending`.  Each queued job,
in the order given (submit order), is checked in this order:

0. **held** (`--hold`, `mgpu hold`) — it waits ("held") until released.
1. **begin time** (`--begin`) — `begin_time` still ahead: it waits ("begin time
   2026-12-07T00:00:00"); then **retry backoff** — `eligible_time` still ahead: it waits
   ("retry backoff until 12:00:05").
2. **dependencies** (`--dependency KIND:ID`) — the targets of ID (that job, or every task of
   that array) must all have ended: `afterok` needs each to have completed, `afternotok`
   each to have ended otherwise, `afterany` either.  A target not ended yet: it waits
   ("waiting for dependency ID").  A target that ended the wrong way can never satisfy it:
   the job is to be cancelled ("dependency afterok:ID can never be satisfied (ID ended
   failed)"), and a job cancelled so counts as ended "cancelled" for the jobs after it; a
   job that is not to be killed for it (`kill_invalid_dep` false: a Slurm job's default)
   waits instead, with that reason (DependencyNeverSatisfied).  A dependency whose ID has no
   entry in `targets` counts as satisfied (the caller knows it is, or knows no such job).
   Then a job whose time limit is over its Slurm partition's waits (PartitionTimeLimit).
3. **array cap** (`--array A-B%N`) — N of the array's tasks running (`array_running`) or let
   through earlier in this call: it waits ("array limit of N running tasks").

Pure: the caller looks the dependency targets up (the master: in memory or in its store) and
applies the verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mgpu.model import WaitCode

from .types import Dependency, JobRequest, WaitReason

__all__ = [
    "ARRAY_LIMIT",
    "COMPLETED",
    "HELD",
    "PARTITION_TIME_LIMIT",
    "DependencyTarget",
    "Eligibility",
    "backoff_reason",
    "begin_reason",
    "eligibility",
]

COMPLETED = "completed"
"""The final state that satisfies `afterok` (any other satisfies `afternotok`)."""

_CANCELLED = "cancelled"
HELD = WaitReason("held", WaitCode.HELD)
"""The reason a held job shows."""
PARTITION_TIME_LIMIT = WaitReason(
    "its time limit is over its partition's max_time", WaitCode.PARTITION_TIME_LIMIT
)
ARRAY_LIMIT = "array limit of "
"""How the reason of a task held back by its array's `%N` begins."""


@dataclass(frozen=True, slots=True)
class DependencyTarget:
    """One job a dependency waits for, as the caller knows it now."""

    job_id: str
    final_state: str | None = None
    """None while the job has not ended; else its final state ("completed", "failed", ...)."""


@dataclass(slots=True)
class Eligibility:
    eligible: list[JobRequest] = field(default_factory=list)
    """The jobs that may start now, in the order given: `Snapshot.pending`."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Job id → why it may not start yet."""
    cancel: dict[str, str] = field(default_factory=dict)
    """Job id → why it never can (a dependency that can never be satisfied)."""
    satisfied: set[Dependency] = field(default_factory=set)
    """Dependencies found satisfied: for good, since a final state never changes."""


def backoff_reason(until: float) -> WaitReason:
    text = f"retry backoff until {time.strftime('%H:%M:%S', time.localtime(until))}"
    return WaitReason(text, WaitCode.BEGIN_TIME)


def begin_reason(begin: float) -> WaitReason:
    text = f"begin time {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(begin))}"
    return WaitReason(text, WaitCode.BEGIN_TIME)


def eligibility(
    queued: Sequence[JobRequest],
    now: float,
    targets: Mapping[str, Sequence[DependencyTarget]] | None = None,
    array_running: Mapping[str, int] | None = None,
) -> Eligibility:
    """Sort `queued` into eligible, waiting and to-be-cancelled (see the module docstring)."""
    out = Eligibility()
    eligible = out.eligible
    running = dict(array_running or {})
    known = targets or {}
    for job in queued:
        # Most jobs wait for nothing but GPUs: one test each, so a long queue costs little.
        if job.held:
            out.waiting[job.job_id] = HELD
            continue
        if job.begin_time > now:
            out.waiting[job.job_id] = begin_reason(job.begin_time)
            continue
        if job.eligible_time > now:
            out.waiting[job.job_id] = backoff_reason(job.eligible_time)
            continue
        if job.dependencies:
            verdict = _dependencies(job, known, out)
            if verdict is not None:
                never, text = verdict
                if never and job.kill_invalid_dep:
                    out.cancel[job.job_id] = text
                else:
                    code = WaitCode.DEPENDENCY_NEVER_SATISFIED if never else WaitCode.DEPENDENCY
                    out.waiting[job.job_id] = WaitReason(text, code)
                continue
        if job.over_partition_time:
            out.waiting[job.job_id] = PARTITION_TIME_LIMIT
            continue
        cap, array_id = job.array_max_running, job.array_id
        if cap is not None and array_id is not None:
            if running.get(array_id, 0) >= cap:
                text = f"{ARRAY_LIMIT}{cap} running tasks"
                out.waiting[job.job_id] = WaitReason(text, WaitCode.ARRAY_LIMIT)
                continue
            running[array_id] = running.get(array_id, 0) + 1  # counts for its siblings
        eligible.append(job)
    return out


def _dependencies(
    job: JobRequest, targets: Mapping[str, Sequence[DependencyTarget]], out: Eligibility
) -> tuple[bool, str] | None:
    """None if every dependency is satisfied, else (cancel?, reason)."""
    for dep in job.dependencies:
        for target in targets.get(dep.job_id, ()):
            state = _CANCELLED if target.job_id in out.cancel else target.final_state
            if state is None:
                return False, f"waiting for dependency {dep.job_id}"
            ok = state == COMPLETED
            if (dep.kind == "afterok" and not ok) or (dep.kind == "afternotok" and ok):
                return True, (
                    f"dependency {dep.kind}:{dep.job_id} can never be satisfied "
                    f"({target.job_id} ended {state})"
                )
        out.satisfied.add(dep)
    return None
