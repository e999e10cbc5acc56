"""Runs held by a client: terminals (`mgpu srun --pty`) and allocations (`mgpu alloc`).

Such a run has a person at the other end, through one client: the client keeps the
run's attach WebSocket open (master/http/attach.py) and says something at least every
heartbeat interval.  Typed input and size changes arrive there and go straight on to
the agent that runs the terminal, on its ordered channel (after the launch they follow).
Typed input is flow-controlled end to end: at most a window of it per terminal is on its
way to the agent, unacknowledged (`AgentLink.input_sent`); while the window is full the
attach reads no more from its client (`input_room`), so TCP slows the client down, and
the agent acknowledges what its pty took (or dropped).

A client can die without a word (`kill -9`, a closed laptop, a partition).  As for a
node's agent, silence longer than `networking.timeout` means it is gone, and its run is
ended, so that nothing waits for it for ever: a queued job is cancelled, a running one
stopped (cancelled), a terminal step killed.  The clock starts at the run's submit or at
the master's start (nothing of this is stored): after a master restart every client
gets a full timeout to come back.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Iterable

from mgpu.config import ClusterConfig
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.registry import AgentLink
from mgpu.master.state.steps import Step
from mgpu.model import ALLOCATION, DesiredState, EndReason, Job, JobState
from mgpu.protocol import Kill, TerminalInput, TerminalResize, TerminalSize

log = logging.getLogger("mgpu.master")

__all__ = ["Sessions", "held_by_client"]


def held_by_client(job: Job) -> bool:
    """Does this job end when its client goes away?"""
    return job.pty or job.kind == ALLOCATION


class Sessions:
    def __init__(self, state: ControllerState, life: Lifecycle, config: ClusterConfig) -> None:
        self.state = state
        self.life = life
        self.uow = life.uow
        self.config = config
        self.held: set[str] = set()
        """Ids of the active jobs that end when their client goes away."""
        self.last_seen: dict[str, float] = {}
        """Run (job or step) id → when its client was last heard, monotonic seconds (memory
        only: a jump of the wall clock ends no run)."""
        life.on_end.append(self._ended)

    def track(self, jobs: Iterable[Job]) -> None:
        """Jobs just submitted (or loaded at start): those held by a client are watched."""
        now = self.state.clock.monotonic()
        for job in jobs:
            if held_by_client(job) and not job.terminal:
                self.held.add(job.id)
                self.last_seen.setdefault(job.id, now)

    def touch(self, run_id: str) -> None:
        """The run's client said something (a heartbeat, a key, a resize)."""
        self.last_seen[run_id] = self.state.clock.monotonic()

    def _ended(self, job: Job) -> None:
        self.held.discard(job.id)
        self.last_seen.pop(job.id, None)

    # ---- gone clients -----------------------------------------------------------

    def check(self) -> None:
        """End the runs whose client has been silent for longer than the timeout."""
        now = self.state.clock.monotonic()
        timeout = self.config.networking.timeout
        why = f"its client went away (silent for {timeout:g} s)"
        for job_id in sorted(self.held):
            job = self.state.jobs.get(job_id)
            if job is None or job.terminal:
                self._ended_id(job_id)
                continue
            if now - self.last_seen.setdefault(job_id, now) <= timeout:
                continue
            log.warning("job %s: %s", job_id, why)
            self._ended_id(job_id)
            if job.state == JobState.QUEUED:
                self.life.finish(job, EndReason.CANCELLED, f"cancelled: {why}")
            elif job.desired is DesiredState.RUN:
                self.life.request_stop(job, EndReason.CANCELLED, f"cancelled: {why}")
            self.uow.flush(event=("cancel", None, None, job_id), detail=why)
        live = set(self.held)
        for step in list(self.state.steps.by_id.values()):
            if not step.pty or step.done:
                continue
            if now - self.last_seen.setdefault(step.id, now) > timeout:
                log.warning("step %s: %s", step.id, why)
                self.last_seen.pop(step.id, None)
                self.kill_step(step, "its client went away")
            else:
                live.add(step.id)
        for run_id in [r for r in self.last_seen if r not in live]:
            del self.last_seen[run_id]  # ended steps, runs attached to that no client holds

    def _ended_id(self, job_id: str) -> None:
        self.held.discard(job_id)
        self.last_seen.pop(job_id, None)

    def kill_step(self, step: Step, reason: str) -> None:
        """Kill a step's processes on every node where they still run (its end follows
        from their exits)."""
        for node_id in step.on_nodes:
            node = self.state.nodes.get(node_id)
            if node is not None and node.link is not None and not step.ended_on(node_id):
                grace = self.config.scheduling.kill_grace
                kill = Kill(job_id=step.id, epoch=step.epoch, reason=reason, grace=grace)
                self.uow.send(node.link, kill)

    # ---- the terminal -------------------------------------------------------------

    def _terminal(self, run_id: str) -> tuple[AgentLink, int] | None:
        """The connection of the agent that runs this terminal now, and the run's epoch."""
        step = self.state.steps.by_id.get(run_id)
        if step is not None:
            if not step.pty or step.done:
                return None
            node_id, epoch = step.on_nodes[0], step.epoch
        else:
            job = self.state.jobs.get(run_id)
            if job is None or not job.pty or job.state != JobState.RUNNING:
                return None
            if not job.allocation or job.allocation[0].done:
                return None
            node_id, epoch = job.allocation[0].node_id, job.epoch
        node = self.state.nodes.get(node_id)
        if node is None or node.link is None:
            return None
        return node.link, epoch

    def terminal_input(self, run_id: str, data: bytes) -> bool:
        """Typed bytes (at most MAX_TERMINAL_INPUT) for the run's pty; False when it has
        none running (dropped)."""
        target = self._terminal(run_id)
        if target is None:
            return False
        link, epoch = target
        text = base64.b64encode(data).decode("ascii")
        link.input_sent(run_id, len(data))
        self.uow.send(link, TerminalInput(job_id=run_id, epoch=epoch, data=text))
        return True

    def input_room(self, run_id: str) -> asyncio.Event | None:
        """None when the run's client may send more input now, else an event set once it
        may: its agent acknowledged enough of what is in flight, or the link is gone."""
        target = self._terminal(run_id)
        return None if target is None else target[0].input_room(run_id)

    def resize(self, run_id: str, rows: int, cols: int) -> None:
        """The client's terminal size: kept for the launch, and set on a running pty."""
        step = self.state.steps.by_id.get(run_id)
        held = step if step is not None else self.state.jobs.get(run_id)
        if held is not None:
            held.pty_size = [rows, cols]
        target = self._terminal(run_id)
        if target is not None:
            link, epoch = target
            size = TerminalSize(rows=rows, cols=cols)
            self.uow.send(link, TerminalResize(job_id=run_id, epoch=epoch, size=size))
