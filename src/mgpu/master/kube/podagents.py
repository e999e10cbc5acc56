"""The pod agents of the jobs' Pods, and the steps the master sends to a Kubernetes Node.

On mgpu's own nodes a step (`srun`, `mgpu rsh`) is a launch sent to the node's agent.
On a Kubernetes partition a Node has no agent of mgpu's; the job's Pod on it has one
(mgpu.podagent), which connects to `/api/kube/pod` with the job's credential and names
its Pod.  It is admitted only for a Pod this master runs for that very job and run
(epoch), not ended: it may then be sent that job's steps on that Pod's node, and tell
their start, output and end, nothing else (a message about any other run is dropped).
A step sent before its Pod's agent is there waits for it, `steps.agent_wait` at most,
then ends with a sentence; so does a step whose agent went away and did not come back.

A signal to the job itself (`scancel --signal`, `-b`, a cancel's `--signal` warning) goes
to the agent of each of the job's Pods on that node, which sends it to the job's processes
in its Pod (mgpu.podagent.jobsignal); one sent before the agent is there waits for it as a
step does, then is dropped with a line in the log.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from mgpu.master.kube.podsteps import step_for_pod
from mgpu.master.kube.runs import PodRun
from mgpu.model import JobState
from mgpu.protocol import (
    Exited,
    Kill,
    Launch,
    Output,
    SignalRun,
    Started,
    TerminalAck,
    TerminalInput,
    TerminalResize,
    encode,
)

if TYPE_CHECKING:
    from mgpu.kubesection import KubernetesSection
    from mgpu.master.control.cluster import Cluster
    from mgpu.model import Job


class PodRuns(Protocol):
    """What the agents need of a partition's Pod runs (mgpu.master.kube.pods.PodRuns,
    which holds the agents: a Protocol here, not an import back)."""

    cl: Cluster
    partition: str
    section: KubernetesSection
    runs: dict[str, PodRun]

    def tell(self, node_id: str, message: BaseModel) -> None: ...

    def _job(self, job_id: str, epoch: int) -> Job | None: ...

    def of_job(self, job_id: str, epoch: int) -> list[PodRun]: ...


log = logging.getLogger("mgpu.master.kube")

__all__ = ["PodAgent", "PodAgents"]

OUTBOX_LIMIT = 10_000
"""Messages queued for one agent that does not read: past it, the link is closed."""


@dataclass(eq=False)
class PodAgent:
    """One connected pod agent: its Pod's run, and what is to be written to it."""

    pod: str
    runs: PodRuns
    run: PodRun
    outbox: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    closed: bool = False

    def send(self, message: BaseModel) -> None:
        if self.closed:
            return
        if self.outbox.qsize() >= OUTBOX_LIMIT:
            log.warning("pod agent of %s reads nothing: its link is closed", self.pod)
            self.closed = True
            self.outbox.put_nowait("")  # wakes the writer, which sees `closed`
            return
        self.outbox.put_nowait(encode(message))


@dataclass
class _Step:
    """A step sent to a Pod: waiting for its agent (`since`), or with it."""

    pod: str
    node_id: str
    runs: PodRuns
    step_id: str
    epoch: int
    launch: Launch | None = None
    """What the Pod's agent was sent; None: a step an earlier master sent, found in the
    store after this one started (`adopt`): the agent is sent nothing, it says it has it
    (its Started again, at each connection)."""
    since: float | None = None
    """When it began to wait for the Pod's agent (None: the agent has it)."""


class PodAgents:
    """Every partition's pod agents, by Pod name, and the steps sent to them."""

    def __init__(self) -> None:
        self.partitions: list[PodRuns] = []
        self.agents: dict[str, PodAgent] = {}
        self.steps: dict[str, _Step] = {}
        """Step run id → where it was sent."""
        self.signals: dict[str, list[tuple[float, SignalRun]]] = {}
        """Pod name → signals to its job that wait for its agent (since when)."""

    # ---- the agents' connections ------------------------------------------

    def admit(self, pod: str, token_id: str) -> PodAgent | str:
        """The agent of `pod` for a caller authenticated as `token_id`, or why not."""
        for runs in self.partitions:
            run = runs.runs.get(pod)
            if run is None:
                continue
            if runs.section.steps is None:
                return f"partition {runs.partition} runs no steps (kubernetes.steps)"
            if token_id != f"job:{run.job_id}":
                return f"not the credential of the job of pod {pod}"
            job = runs.cl.jobs.get(run.job_id)
            if run.ended or job is None or job.state != JobState.RUNNING or job.epoch != run.epoch:
                return f"pod {pod} runs no job now"
            return PodAgent(pod, runs, run)
        return f"no pod {pod} of a running job here"

    def attach(self, agent: PodAgent) -> None:
        """`agent` is its Pod's (a newer connection replaces an older one); the steps that
        waited for it are sent."""
        old = self.agents.get(agent.pod)
        if old is not None:
            old.closed = True
            old.outbox.put_nowait("")
        self.agents[agent.pod] = agent
        log.info("pod agent of %s connected", agent.pod)
        now = time.monotonic()
        for step in self.steps.values():
            if step.pod != agent.pod:
                continue
            if step.launch is None:  # adopted: it must say it has it, within agent_wait
                step.since = step.since or now
                continue
            step.since = None
            agent.send(step.launch)  # again after a reconnect: the agent knows its own
        for _, waiting in self.signals.pop(agent.pod, []):
            agent.send(waiting)

    def detach(self, agent: PodAgent) -> None:
        agent.closed = True
        if self.agents.get(agent.pod) is agent:
            del self.agents[agent.pod]
            now = time.monotonic()
            for step in self.steps.values():
                if step.pod == agent.pod and step.since is None:
                    step.since = now  # it may come back (a dropped connection)

    def received(self, agent: PodAgent, message: BaseModel) -> None:
        """A message of `agent`: a start, output or end of a step sent to it, else
        dropped."""
        if not isinstance(message, (Started, Output, Exited, TerminalAck)):
            log.warning("pod agent of %s sent a %s: dropped", agent.pod, type(message).__name__)
            return
        step = self.steps.get(message.job_id)
        if step is None or step.pod != agent.pod or step.epoch != message.epoch:
            return  # not one of its steps (or one already ended)
        if isinstance(message, Exited):
            del self.steps[message.job_id]
        else:
            step.since = None  # an adopted step its agent has
        step.runs.tell(step.node_id, message)

    def adopt(self, runs: PodRuns, run: PodRun) -> None:
        """After this master's start, the stored steps of `run`'s job still running on its
        Pod's node (an earlier master sent them): followed again, waiting for the Pod's
        agent to say it has them (else they end after `agent_wait`, as a lost launch)."""
        now = time.monotonic()
        for step in runs.cl.state.steps.by_id.values():
            if (
                step.id not in self.steps
                and (step.job_id, step.epoch) == (run.job_id, run.epoch)
                and step.runs_on(run.slot_node)
                and not step.ended_on(run.slot_node)
            ):
                self.steps[step.id] = _Step(
                    run.name, run.slot_node, runs, step.id, step.epoch, since=now
                )

    def on_node(self, node_id: str) -> list[tuple[str, int]]:
        """The steps (id, epoch) followed on the Kubernetes Node `node_id`: a Node's hello
        reports them as running, so that they are not taken for lost."""
        return [(s.step_id, s.epoch) for s in self.steps.values() if s.node_id == node_id]

    # ---- the master's messages --------------------------------------------

    def deliver(self, runs: PodRuns, node_id: str, message: BaseModel) -> None:
        """The master's message about a step run on the Kubernetes Node `node_id`."""
        if isinstance(message, Launch):
            self._launch(runs, node_id, message)
            return
        step = self.steps.get(getattr(message, "job_id", ""))
        if step is None:
            return
        agent = self.agents.get(step.pod)
        if isinstance(message, Kill):
            if agent is None:  # never started, or its agent is away: it ends now
                self._end(step, f"killed ({message.reason}) before its pod's agent had it")
            else:
                agent.send(message)
        elif isinstance(message, (SignalRun, TerminalInput, TerminalResize)) and agent:
            agent.send(message)
        elif isinstance(message, TerminalInput):  # dropped: its client may send more
            typed = len(base64.b64decode(message.data))
            ack = TerminalAck(job_id=message.job_id, epoch=message.epoch, bytes=typed)
            step.runs.tell(node_id, ack)

    def signal_job(self, runs: PodRuns, node_id: str, message: SignalRun) -> None:
        """The master's signal to the job's own run on `node_id` (not a step): to the
        agent of each of its live Pods there (a held slot's runs nothing of the job's)."""
        for run in runs.of_job(message.job_id, message.epoch):
            if run.slot_node == node_id:
                self.signal_pod(run, message)

    def signal_pod(self, run: PodRun, message: SignalRun) -> None:
        """`message` to the agent of `run`'s Pod, now or once it connects."""
        if run.ended or run.holds:
            return
        agent = self.agents.get(run.name)
        if agent is not None:
            agent.send(message)
        else:
            self.signals.setdefault(run.name, []).append((time.monotonic(), message))

    def _launch(self, runs: PodRuns, node_id: str, launch: Launch) -> None:
        step = runs.cl.state.steps.by_id.get(launch.job_id)
        job = None if step is None else runs._job(step.job_id, launch.epoch)
        run = None
        if step is not None:
            run = next(
                (
                    r
                    for r in runs.of_job(step.job_id, launch.epoch)
                    if r.slot_node == node_id and not r.ended
                ),
                None,
            )
        if job is None or run is None:
            refused = f"the job has no pod on {node_id} to run the step"
            runs.tell(node_id, _ended(launch.job_id, launch.epoch, refused))
            return
        slot = next(s for s in job.allocation if s.node_id == node_id)
        for_pod = step_for_pod(launch, list(slot.gpu_ids))
        sent = _Step(run.name, node_id, runs, launch.job_id, launch.epoch, for_pod)
        self.steps[launch.job_id] = sent
        agent = self.agents.get(run.name)
        if agent is None:
            sent.since = time.monotonic()
        else:
            agent.send(for_pod)

    # ---- bounded waits ----------------------------------------------------

    def check(self, now: float) -> None:
        """Steps whose Pod's agent did not come within `agent_wait`, or whose Pod ended."""
        for step in list(self.steps.values()):
            run = step.runs.runs.get(step.pod)
            if run is None or run.ended:
                self._end(step, f"pod {step.pod} ended")
                continue
            steps = step.runs.section.steps
            wait = steps.agent_wait if steps is not None else 0.0
            if step.since is not None and now - step.since > wait:
                if step.launch is None and step.pod in self.agents:
                    what = "does not run it (an earlier master sent it)"
                    self._end(step, f"the mgpu pod agent of pod {step.pod} {what}")
                    continue
                what = "did not connect" if run.started_at is None else "is not connected"
                self._end(step, f"the mgpu pod agent of pod {step.pod} {what} within {wait:g} s")
        for pod, waiting in list(self.signals.items()):
            self._expire_signals(pod, waiting, now)

    def _expire_signals(self, pod: str, waiting: list[tuple[float, SignalRun]], now: float) -> None:
        """Signals that waited for `pod`'s agent past `agent_wait`, or whose Pod ended."""
        runs = next((r for r in self.partitions if pod in r.runs), None)
        run = None if runs is None else runs.runs[pod]
        steps = None if runs is None else runs.section.steps
        wait = steps.agent_wait if steps is not None else 0.0
        kept = [(since, m) for since, m in waiting if now - since <= wait]
        if run is None or run.ended or len(kept) < len(waiting):
            log.warning("signal to the job of pod %s not sent: its pod agent is not there", pod)
        if run is None or run.ended or not kept:
            del self.signals[pod]
        else:
            self.signals[pod] = kept

    def _end(self, step: _Step, why: str) -> None:
        self.steps.pop(step.step_id, None)
        step.runs.tell(step.node_id, _ended(step.step_id, step.epoch, why))


def _ended(step_id: str, epoch: int, why: str) -> Exited:
    """A step's end told for its agent: it never ran (or is lost), with why."""
    return Exited(
        job_id=step_id,
        epoch=epoch,
        exit_code=None,
        time=time.time(),
        launch_error=why,
    )
