"""Allocations (`mgpu alloc`): GPUs held for a client, and the steps it runs on them.

An allocation is a job of kind `allocation` (as Slurm's salloc makes): scheduled like any
job, but nothing of its own runs on the nodes.  When it starts its slots are `held`
(lifecycle.py) and its client runs a command on the submitting machine; each `mgpu srun`
in that command is a **step** here: a process on the allocation's nodes (every node, or
those `-w` names; a terminal step on the first only) with the allocation's GPUs, its
`CUDA_VISIBLE_DEVICES`, and the environment and directory of the `srun` that asked.
Steps are the same runs as `mgpu rsh`'s (master/state/steps.py): they end with the allocation.

How an allocation ends, and why it ends so (its `EndReason`):

* its command ends: the client reports the exit code, and the run ends as if that
  command had been the job's own: `EXIT_OK` (completed) or `EXIT_NONZERO` (failed, that
  exit code).  Not `CANCELLED`: nothing was cut short, the allocation did its work;
* its time limit: the master enforces it (no process on a node carries it): `TIMEOUT`,
  its steps killed, the client told;
* `mgpu cancel`, an idle GPU watch, its client gone (master/control/sessions.py): `CANCELLED`,
  at once, since there is no process to wait for;
* a node lost: it is never requeued (its client's command runs on elsewhere, with its
  steps gone), so it fails (`max_retries` 0).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from mgpu.config import ClusterConfig
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.control.livesteps import LiveSteps
from mgpu.master.control.sessions import Sessions
from mgpu.master.control.srun import Sruns, launch_in_job
from mgpu.master.control.submit import SubmitError
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.steps import Step
from mgpu.model import ALLOCATION, EndReason, Job, JobState

log = logging.getLogger("mgpu.master")

__all__ = ["Allocations", "StepRequest"]


@dataclasses.dataclass(frozen=True, slots=True)
class StepRequest:
    """A step as `mgpu srun` inside an allocation asks for it (already validated)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    nodes: Sequence[str] = ()
    """Only these of the allocation's nodes (ids or hostnames); empty: every node."""
    pty: bool = False
    pty_size: Sequence[int] | None = None


class Allocations:
    def __init__(
        self,
        state: ControllerState,
        life: Lifecycle,
        sessions: Sessions,
        config: ClusterConfig,
    ) -> None:
        self.state = state
        self.life = life
        self.uow = life.uow
        self.sessions = sessions
        self.config = config
        self.sruns = Sruns(state, life, sessions, config)
        """`srun` inside any running job (a batch job, an allocation): Slurm's steps."""
        self.live = LiveSteps(state.steps, self.uow)
        """Every step of a running job kept in the store: a master that takes over knows it."""

    def running(self, job_id: str) -> Job:
        """The running allocation `job_id`, or SubmitError saying why there is none."""
        job = self.state.jobs.get(job_id) or self.uow.pending(job_id)
        if job is None or job.kind != ALLOCATION:
            raise SubmitError(f"job {job_id} is not an allocation (mgpu alloc)")
        if job.state == JobState.QUEUED:
            raise SubmitError(f"allocation {job_id} has not started yet")
        if job.state != JobState.RUNNING:
            raise SubmitError(f"allocation {job_id} has ended ({job.state.value})")
        return job

    # ---- steps --------------------------------------------------------------

    def start_step(self, job_id: str, request: StepRequest) -> Step:
        """Start `request` on the allocation's nodes (SubmitError: one sentence why not)."""
        job = self.running(job_id)
        nodes = self.state.nodes
        ranks = self._ranks(job, request.nodes)
        if request.pty:
            ranks = ranks[:1]  # as srun --pty: the terminal is task zero's
        for rank in ranks:
            node = nodes.get(job.allocation[rank].node_id)
            if node is None or node.link is None:
                raise SubmitError(f"{job.allocation[rank].node_id} is not connected")
        step = self.state.steps.new(job.id, job.epoch, job.allocation[ranks[0]].node_id)
        step.nodes = [job.allocation[r].node_id for r in ranks]
        step.pty = request.pty
        step.pty_size = None if request.pty_size is None else list(request.pty_size)
        credential = self.life.credential(job)
        for rank in ranks:
            launch = launch_in_job(
                step,
                job,
                rank,
                argv=request.argv,
                srun_env=request.env,
                cwd=request.cwd,
                gpu_ids=job.allocation[rank].gpu_ids,
                nodes=nodes,
                credential=credential,
                config=self.config,
            )
            link = nodes[job.allocation[rank].node_id].link
            assert link is not None
            self.uow.send(link, launch)
        if step.pty:
            self.sessions.touch(step.id)
        return step

    def _ranks(self, job: Job, wanted: Sequence[str]) -> list[int]:
        if not wanted:
            return list(range(len(job.allocation)))
        nodes = self.state.nodes
        ranks = []
        for name in wanted:
            found = [
                rank
                for rank, slot in enumerate(job.allocation)
                if name in (slot.node_id, nodes[slot.node_id].hostname)
            ]
            if not found:
                names = ", ".join(s.node_id for s in job.allocation)
                raise SubmitError(f"{name} is not one of allocation {job.id}'s nodes ({names})")
            ranks += [r for r in found if r not in ranks]
        return ranks

    def cancel_step(self, step: Step) -> bool:
        """Kill a step (`srun`'s Ctrl-C); False if it had already ended."""
        if step.done:
            return False
        self.sessions.kill_step(step, "cancelled")
        return True

    # ---- the end ------------------------------------------------------------

    def end(self, job: Job, exit_code: int) -> bool:
        """The client's command ended with `exit_code`: so does the allocation (completed,
        or failed with that code).  One that has not started is cancelled; False if it had
        already ended."""
        job = self.state.jobs.get(job.id, job)
        if job.terminal:
            return False
        if job.state == JobState.QUEUED:
            self.life.finish(job, EndReason.CANCELLED, "cancelled: its client's command ended")
            return True
        job.exit_code = exit_code
        if exit_code == 0:
            self.life.finish(job, EndReason.EXIT_OK, None)
        else:
            self.life.finish(job, EndReason.EXIT_NONZERO, f"exit code {exit_code}")
        return True

    def check(self) -> None:
        """Allocations past their time limit end (no process on a node carries it)."""
        now = self.state.clock.time()
        for job_id in sorted(self.sessions.held):
            job = self.state.jobs.get(job_id)
            if job is None or job.kind != ALLOCATION or job.state != JobState.RUNNING:
                continue
            if job.time_limit is None or job.start_time is None:
                continue
            if now >= job.start_time + job.time_limit:
                log.info("allocation %s reached its time limit", job.id)
                job.timed_out = True
                self.life.finish(job, EndReason.TIMEOUT, "time limit reached")
