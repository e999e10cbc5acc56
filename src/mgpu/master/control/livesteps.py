"""The steps of running jobs, kept in the store so that they outlive their master.

A step (`srun` inside a job, `mgpu srun` inside an allocation, `mgpu rsh`) was the leader's
memory only: after a failover the new leader did not know it, killed its processes as
unknown when their agents said hello, and its srun client was told the step was lost.
Here every step is written as it stands (store/steps.py's `live_steps`): when it is made,
in the flush that sends its launch (so no agent runs a step the store does not hold), and
again when one of its processes ends, before the agent is told to forget that end.  A job's
steps go with it.  A master that takes over reads them back (`restore`), ended ones too,
so that a srun client that reconnects gets the rest of the output and the exit code; the
agents then report the processes still running and the output goes on from where the
store has it (control/reconcile.py resumes them).

A step's record is what its followers and its end need: where each process runs, which
have ended and how, and what srun prints about it; not its launch (sent already).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from mgpu.master.state.steps import STEP_SEPARATOR, Step, Steps, TaskStep
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.model import Job, JobState

log = logging.getLogger("mgpu.master")

__all__ = ["LiveSteps", "record_of", "run_of"]


class LiveSteps:
    def __init__(self, steps: Steps, uow: UnitOfWork) -> None:
        self.steps = steps
        self.uow = uow
        steps.on_change.append(self._changed)
        steps.on_forget.append(uow.steps_forgotten)

    def _changed(self, run: Step | TaskStep) -> None:
        self.uow.step_changed(run.id, run.job_id, lambda: record_of(run))

    def restore(
        self,
        rows: list[tuple[str, str, dict[str, Any]]],
        jobs: Mapping[str, Job],
        last_stored: Callable[[str], int | None],
    ) -> int:
        """Know again the stored steps of the running jobs (those of a job that has ended,
        or runs again in another epoch, are forgotten); how many were restored."""
        restored, stale = 0, set()
        for step_id, job_id, record in sorted(rows, key=lambda r: _order(r[0], r[1])):
            job = jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING or job.epoch != record.get("epoch"):
                stale.add(job_id)
                continue
            try:
                run = run_of(step_id, job_id, record)
            except (KeyError, TypeError, ValueError) as e:  # a record this mgpu cannot read
                log.warning("step %s could not be read back (%s): forgotten", step_id, e)
                continue
            self.steps.restored(run)
            restored += 1
        for job_id in {r[1] for r in rows} - stale:
            last = last_stored(job_id)
            if last is not None:
                self.steps.number_from(job_id, last + 1)
        for job_id in sorted(stale):
            self.uow.steps_forgotten(job_id)
        if restored:
            log.info("restored %d step(s) of running jobs", restored)
        return restored


def _order(step_id: str, job_id: str) -> tuple[str, int]:
    """Steps in the order they were made (their number after `.s`)."""
    tail = step_id[len(job_id) + len(STEP_SEPARATOR) :].split(".")[0]
    return job_id, int(tail) if tail.isdigit() else 0


def _process(step: Step) -> dict[str, Any]:
    return {
        "node_id": step.node_id,
        "nodes": step.nodes,
        "exits": step.exits,
        "done": step.done,
        "exit_code": step.exit_code,
        "error": step.error,
        "pty": step.pty,
        "pty_size": step.pty_size,
        "host": step.host,
        "to_job_output": step.to_job_output,
        "bind_note": step.bind_note,
        "out_of_memory": step.out_of_memory,
    }


def record_of(run: Step | TaskStep) -> dict[str, Any]:
    """What the store keeps of a step (see the module docstring)."""
    if isinstance(run, TaskStep):
        return {
            "kind": "srun",
            "epoch": run.tasks[0].epoch if run.tasks else 0,
            "number": run.number,
            "name": run.name,
            "start": run.start_time,
            "kill_on_bad_exit": run.kill_on_bad_exit,
            "failed_task": run.failed_task,
            "done": run.done,
            "exit_code": run.exit_code,
            "error": run.error,
            "tasks": [_process(t) for t in run.tasks],
        }
    return {"kind": "step", "epoch": run.epoch, **_process(run)}


def _step(step_id: str, job_id: str, epoch: int, rec: dict[str, Any]) -> Step:
    step = Step(id=step_id, job_id=job_id, epoch=epoch, node_id=str(rec["node_id"]))
    step.nodes = [str(n) for n in rec.get("nodes") or []]
    step.exits = {str(n): (None if c is None else int(c)) for n, c in rec["exits"].items()}
    step.done, step.exit_code, step.error = bool(rec["done"]), rec["exit_code"], rec["error"]
    step.pty, step.pty_size = bool(rec["pty"]), rec.get("pty_size")
    step.host, step.to_job_output = str(rec.get("host") or ""), bool(rec["to_job_output"])
    step.bind_note = rec.get("bind_note")
    step.out_of_memory = bool(rec.get("out_of_memory"))
    if step.done:
        step.finished.set()
    return step


def run_of(step_id: str, job_id: str, rec: dict[str, Any]) -> Step | TaskStep:
    """A stored step read back (KeyError, TypeError, ValueError: not one this mgpu wrote)."""
    epoch = int(rec["epoch"])
    if rec["kind"] != "srun":
        return _step(step_id, job_id, epoch, rec)
    group = TaskStep(id=step_id, job_id=job_id, number=int(rec["number"]))
    group.name, group.start_time = str(rec["name"]), float(rec["start"])
    group.kill_on_bad_exit, group.failed_task = bool(rec["kill_on_bad_exit"]), rec["failed_task"]
    group.done, group.exit_code, group.error = bool(rec["done"]), rec["exit_code"], rec["error"]
    for task, process in enumerate(rec["tasks"]):
        step = _step(f"{step_id}.{task}", job_id, epoch, process)
        step.group, step.task = group, task
        group.tasks.append(step)
    if group.done:
        group.finished.set()
    return group
