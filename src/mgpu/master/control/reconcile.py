"""What an agent runs when it says hello, against what the master expects there.

`reconcile(reports, expected)` is pure: `reports` are the runs the agent has (its `Hello`),
`expected` what the master expects of each job or step id on that node.  The controller
applies the result:

* **kill** — every run the master does not expect that is still running: an unknown id, a
  stale epoch (the job was requeued and runs elsewhere now), a slot or step that has ended,
  and a run the master wants stopped (a cancel it may have missed);
* **lost** — jobs the master expects running here, whose process the agent had reported
  started, that the agent does not report (it restarted without them): they are requeued,
  a retry spent, and the node is charged one failure for the whole restart, not one per job;
* **unlaunched** — jobs whose launch the master stored as sent (or still pending) that the
  agent neither reported started nor reports now: the launch never reached it (the master
  died before sending it, or the connection did).  Requeued free: no retry, no failure;
* **resume** — runs the master expects of this epoch on this node, ended or not, with
  the output it should tell the agent it already has (the agent re-sends the rest);
* **lost steps** — steps whose process the master expects on this node, not ended, that
  the agent does not report: the launch never reached it (a master that took over knows
  the step from the store, control/livesteps.py, but its launch died with the old one) or
  the agent restarted without it.  Their process there ends, with no exit code, so that
  the step ends and its srun client is told, rather than wait for ever.

An exited run the agent has not been told to forget is reported with `exited`: it is
never killed, and not lost either (its end is re-sent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mgpu.master.state.steps import Step, is_step_id
from mgpu.model import DesiredState, Job, JobState
from mgpu.protocol import RunningReport

__all__ = ["Expected", "Reconciliation", "expectations", "reconcile"]


@dataclass(frozen=True, slots=True)
class Expected:
    """What the master expects of one job (or step) id on the node saying hello."""

    epoch: int
    here: bool = True
    """The job has a slot on this node (a step: was started on this node)."""
    ended: bool = False
    """That slot (or step) has ended."""
    stop: bool = False
    """The master wants it stopped (a cancel requested): a live report is killed."""
    step: bool = False
    """A job step (`mgpu rsh`): it ends with its job, so it is never lost on its own."""
    started: bool = True
    """The agent had reported its process started (else the launch may never have come)."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    kill: tuple[RunningReport, ...] = ()
    lost: tuple[str, ...] = ()
    """Job ids; the first loss of a hello is the node's failure, the others are not."""
    resume: tuple[tuple[str, int], ...] = ()
    """(job or step id, epoch) of each run whose output the master keeps taking."""
    unlaunched: tuple[str, ...] = ()
    """Job ids whose launch never reached the agent: requeued free."""
    lost_steps: tuple[str, ...] = ()
    """Step ids whose process on the node is gone: it ends there."""


def reconcile(reports: Sequence[RunningReport], expected: Mapping[str, Expected]) -> Reconciliation:
    """Compare what the agent runs with what the master expects (see the module docstring).

    `expected` holds the running jobs with a slot on the node and the jobs and steps the
    agent reports that the master knows; any id it does not hold is unknown.
    """
    kill: list[RunningReport] = []
    resume: list[tuple[str, int]] = []
    matched: set[str] = set()
    for rep in reports:
        e = expected.get(rep.job_id)
        same_run = e is not None and e.epoch == rep.epoch and e.here
        if same_run:
            resume.append((rep.job_id, rep.epoch))
        if e is None or not same_run or e.ended:
            if not rep.exited:
                kill.append(rep)
            continue
        matched.add(rep.job_id)
        if e.stop and not rep.exited:
            kill.append(rep)
    missing = [
        (job_id, e.started)
        for job_id, e in expected.items()
        if e.here and not e.ended and not e.step and job_id not in matched
    ]
    lost = tuple(job_id for job_id, started in missing if started)
    unlaunched = tuple(job_id for job_id, started in missing if not started)
    lost_steps = tuple(
        run_id
        for run_id, e in expected.items()
        if e.here and not e.ended and e.step and run_id not in matched
    )
    return Reconciliation(tuple(kill), lost, tuple(resume), unlaunched, lost_steps)


def expectations(
    node_id: str,
    node_jobs: Iterable[str],
    reports: Sequence[RunningReport],
    jobs: Mapping[str, Job],
    steps: Mapping[str, Step],
) -> dict[str, Expected]:
    """What the master expects on `node_id` of the jobs it placed there (`node_jobs`), of
    the steps with a process there not ended, and of each reported id, from its live jobs
    and steps."""
    out: dict[str, Expected] = {}
    on_node = [i for i, s in steps.items() if s.runs_on(node_id) and not s.ended_on(node_id)]
    for run_id in [*node_jobs, *on_node, *(r.job_id for r in reports)]:
        if run_id in out:
            continue
        if is_step_id(run_id):
            step = steps.get(run_id)
            if step is not None:
                here, ended = step.runs_on(node_id), step.ended_on(node_id)
                out[run_id] = Expected(step.epoch, here, ended, step=True)
            continue
        job = jobs.get(run_id)
        if job is None or job.state != JobState.RUNNING:
            continue
        slot = next((s for s in job.allocation if s.node_id == node_id), None)
        ended = slot is None or slot.done
        stop = job.desired is not DesiredState.RUN
        started = slot is None or slot.started
        out[run_id] = Expected(job.epoch, slot is not None, ended, stop, started=started)
    return out
