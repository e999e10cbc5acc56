"""The controller's read side: jobs, arrays and nodes as the API, the dashboard and the
metrics ask for them (a part of `Cluster`, which it is mixed into).

A job is looked for where it is: active in memory, just changed and not written yet (the
unit of work), or in the store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from mgpu.master.control.loop import SchedulingLoop
from mgpu.master.control.positions import QueuePositions
from mgpu.master.monitor.gpuwatch import GpuWatch
from mgpu.master.runtime.clock import Clock
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.registry import NodeRecord
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.master.store.base import Store
from mgpu.model import Job, JobState
from mgpu.spec import job_number, may_be_array_id

__all__ = ["Reads"]


class Reads:
    state: ControllerState
    jobs: dict[str, Job]
    uow: UnitOfWork
    store: Store
    loop: SchedulingLoop
    gpuwatch: GpuWatch
    clock: Clock

    def get_job(self, job_id: str) -> Job | None:
        """Active, just changed (not written yet), or from the store; a number no job has
        may be an array task's own (its SLURM_JOB_ID): that task."""
        job = self.jobs.get(job_id) or self.uow.pending(job_id)
        if job is None:
            job = self.store.get_job(job_id)
        if job is None and (task_id := self.task_of_number(job_id)) is not None:
            job = self.jobs.get(task_id) or self.uow.pending(task_id) or self.store.get_job(task_id)
        return job

    def task_of_number(self, job_id: str) -> str | None:
        """`1238` -> `1234_4` when task 4 of array 1234 has that job number, as Slurm's
        array tasks each have their own id (`specs.task_job_number`); else None."""
        number = job_number(job_id)
        if number is None or self.store.has_job(job_id):  # an array's own id: the array
            return None
        base = self.store.array_below(number)
        stored = self.store.get_array(base) if base is not None else None
        if base is None or stored is None:
            return None
        index = number - int(base)
        return f"{base}_{index}" if index in stored[1] else None

    def get_jobs(self, job_ids: list[str]) -> dict[str, Job]:
        """Many jobs by id: from memory, the rest in one store query (unknown ids left out)."""
        found: dict[str, Job] = {}
        missing = []
        for job_id in job_ids:
            job = self.jobs.get(job_id) or self.uow.pending(job_id)
            if job is None:
                missing.append(job_id)
            else:
                found[job_id] = job
        if missing:
            found.update(self.store.get_jobs(missing))
        return found

    def job_steps(self, job_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The srun steps these jobs ran (`sacct`, a job's detail), oldest first: stored
        (store/steps.py: any master's), then those not written yet; jobs with none are
        left out."""
        found = self.store.steps_of(job_ids)
        for job_id in job_ids:
            if pending := self.uow.pending_steps(job_id):
                found[job_id] = [*found.get(job_id, []), *pending]
        return found

    def active_ids(self) -> tuple[str, ...]:
        """The queued and running jobs' ids, in submit order."""
        return tuple(self.jobs)

    def task_rows(self, array_id: str, after: str, size: int) -> list[tuple[str, str, str]]:
        """A page of an array's stored task rows (id, state, user) after task id `after`."""
        return self.store.job_rows_with_prefix(array_id + "_", after, size)

    def array_tasks(self, array_id: str) -> list[Job]:
        if not may_be_array_id(array_id):
            return []
        found = {j.id: j for j in self.store.jobs_with_prefix(array_id + "_")}
        for j in [*self.uow.pending_jobs(), *self.jobs.values()]:
            if j.array_job_id == array_id:
                found[j.id] = j
        return sorted(found.values(), key=lambda j: j.array_task_id or 0)

    def array_pages(self, array_id: str, size: int) -> Iterator[list[tuple[str, str, str]]]:
        """An array's tasks as pages of (id, stored state, user), in index order.  An array
        stored as one row lists every task from its indices (the state is "" there: an
        active task is in memory, any other has ended); an older one pages its stored rows."""
        stored = self.store.get_array(array_id) if may_be_array_id(array_id) else None
        if stored is None:
            after = ""
            while rows := self.store.job_rows_with_prefix(array_id + "_", after, size):
                yield rows
                after = rows[-1][0]
            return
        template, indices, _ = stored
        for i in range(0, len(indices), size):
            yield [(f"{array_id}_{k}", "", template.user) for k in indices[i : i + size]]

    def public_job(self, job: Job) -> dict[str, Any]:
        out = job.to_public()
        if not job.terminal:
            out.update(self.gpuwatch.job_fields(job))
        if job.state == JobState.QUEUED:
            out["priority_value"] = self.loop.priorities.get(job.id)
            out["priority_factors"] = self.loop.factors.get(job.id)
            expected = self.loop.expected_start.get(job.id)
            if job.begin_time is not None:  # not before its --begin, whatever the GPUs say
                expected = max(expected or 0.0, job.begin_time)
            out["expected_start"] = expected
            out["waiting_on"] = list(self.loop.waiting_on.get(job.id, ()))
        return out

    def active_job(self, job_id: str) -> Job | None:
        """A queued or running job, or one that has just changed (not written yet)."""
        return self.jobs.get(job_id) or self.uow.pending(job_id)

    def finished_jobs(self, keep: Callable[[Job], bool]) -> list[Job]:
        """What `queue --all` adds: the last 1,000 ended jobs in the store, then those that
        have just ended and are not written yet, oldest first; those `keep` keeps."""
        ended = {j.id: j for j in self.uow.pending_jobs() if j.terminal}
        stored = self.store.finished_jobs(limit=1000)
        jobs = [j for j in reversed(stored) if j.id not in ended]
        jobs += sorted(ended.values(), key=_end_time)
        return [j for j in jobs if keep(j)]

    def node_ids(self) -> list[str]:
        """Every node's id, in the order `mgpu nodes` lists them."""
        return [n.node_id for n in self.state.sorted_nodes()]

    def nodes_public(self) -> list[dict[str, Any]]:
        nodes = self.state.sorted_nodes()
        # The users of the jobs on nodes only: not a map of every queued job per request.
        on_nodes = (self.jobs.get(job_id) for n in nodes for job_id in n.jobs)
        users = {j.id: j.user for j in on_nodes if j is not None}
        return [n.to_public(users) for n in nodes]

    def node_public(self, node: NodeRecord) -> dict[str, Any]:
        return node.to_public({j.id: j.user for j in self.jobs.values()})

    def job_event(self, job_id: str) -> asyncio.Event:
        return self.state.job_event(job_id)

    def queue_position(self, job_id: str) -> int | None:
        """`job_id`'s place in the queue as last counted (None: not yet); one walk counts
        it for every follower (control/positions.py)."""
        return self.queue_positions.of(job_id, self.clock.monotonic())

    @property
    def queue_positions(self) -> QueuePositions:
        positions: QueuePositions | None = getattr(self, "_queue_positions", None)
        if positions is None:
            positions = self._queue_positions = QueuePositions(self.jobs)
        return positions

    def stored_counts(self) -> dict[str, int]:
        """Jobs in the store by state (/metrics)."""
        return self.store.count_by_state()

    def finished_since(
        self, since: float, user: str | None = None, states: set[str] | None = None, limit: int = 0
    ) -> list[Job]:
        """Jobs that ended at or after `since` (history, reports); safe in a thread."""
        return self.store.read_finished(since, user, states, limit or None)


def _end_time(job: Job) -> float:
    return job.end_time or 0.0
