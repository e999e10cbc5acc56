"""The agents' side of the controller: hellos, what they report, and job steps.

An agent that may join (`refuse_hello`, `verify_node`) says hello with what it runs; the
master compares it with what it expects there (`reconcile`, pure) and applies the result
before anything else is sent on the new connection: kill what it does not expect, requeue
what was lost, resume the output of the rest.  Then every message of the agent lands in
`message`, which hands it to its type's handler: output, started, exited, port reserved
(fenced by the epoch: a message of an older run is ignored, a stale start killed),
typed input acknowledged, and heartbeats, whose GPU telemetry `GpuWatch` turns into
actions applied here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from mgpu import exits
from mgpu.config import ClusterConfig
from mgpu.master.control.launch import step_launch
from mgpu.master.control.lifecycle import Lifecycle, awaits_port
from mgpu.master.control.nodes import NodeAdmin
from mgpu.master.control.reconcile import expectations, reconcile
from mgpu.master.control.submit import SubmitError
from mgpu.master.monitor.gpuwatch import (
    BlockGpus,
    CancelIdle,
    GpuWatch,
    JobIdle,
    Notice,
    WatchAction,
)
from mgpu.master.security.nodeauth import HelloVerdict, NodeSecrets
from mgpu.master.state.cpus import offered_cpus
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.registry import AgentLink, NodeRecord
from mgpu.master.state.steps import Step, is_step_id
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.master.store.base import Store
from mgpu.master.store.outputs import OutputStore
from mgpu.model import EndReason, Job, JobState, NodeEvent, Slot, SlotPhase
from mgpu.protocol import (
    PROTOCOL_VERSION,
    AgentMessage,
    Exited,
    Forget,
    Heartbeat,
    Hello,
    Kill,
    Output,
    PortReserved,
    Resume,
    RunMemory,
    RunningReport,
    SetTimeLimit,
    Started,
    TerminalAck,
    Welcome,
)

log = logging.getLogger("mgpu.master")

RunMessage = Started | Output | Exited | PortReserved | RunMemory
"""What an agent says about one run (a job's slot, or a step): fenced by its epoch."""

__all__ = ["Agents"]


class Agents:
    def __init__(
        self,
        state: ControllerState,
        life: Lifecycle,
        nodes: NodeAdmin,
        outputs: OutputStore,
        gpuwatch: GpuWatch,
        node_secrets: NodeSecrets,
        store: Store,
        config: ClusterConfig,
    ) -> None:
        self.state = state
        self.life = life
        self.uow: UnitOfWork = life.uow
        self.nodes = nodes
        self.outputs = outputs
        self.gpuwatch = gpuwatch
        self.node_secrets = node_secrets
        self.store = store
        self.config = config
        self.on_joined: Callable[[], None] = lambda: None
        """Told after a node joined (jobs queued before any node are judged then)."""
        # Each message type's handler, which takes that type (the table cannot say so).
        self._handlers: dict[type[BaseModel], Callable[[NodeRecord, Any], None]] = {
            Hello: self._hello_again,
            Heartbeat: self._heartbeat,
            TerminalAck: self._terminal_ack,
            Output: self._output,
            Started: self._started,
            PortReserved: self._port_reserved,
            Exited: self._exited_message,
        }

    # ---- joining ----------------------------------------------------------

    def refuse_hello(self, hello: Hello) -> str | None:
        """Why this agent may not join, or None."""
        if hello.protocol != PROTOCOL_VERSION:
            return (
                f"node {hello.node_id} speaks protocol {hello.protocol}, this master "
                f"{PROTOCOL_VERSION}: run the same mgpu version on both"
            )
        if self.config.node(hello.node_id) is None and not self.config.cluster.allow_unlisted_nodes:
            return (
                f"node {hello.node_id} is not listed in the cluster config "
                "and allow_unlisted_nodes is false"
            )
        return None

    def verify_node(self, hello: Hello) -> HelloVerdict:
        """May this agent speak for its node id (mgpu.master.security.nodeauth)?"""
        node = self.state.nodes.get(hello.node_id)
        connected = node is not None and node.connected
        return self.node_secrets.verify(hello.node_id, hello.node_secret, connected)

    def hello(self, hello: Hello, link: AgentLink, node_secret: str | None = None) -> Welcome:
        """Accept an agent that `verify_node` let in; `node_secret`: issued at this join."""
        node = self.state.node(hello.node_id)
        if node.link is not None and node.link is not link:
            log.warning("node %s proved its secret: its older connection is dropped", node.node_id)
            node.link.close()
        node.link = link
        node.hostname = hello.hostname
        node.ip = hello.ip
        node.gpus = list(hello.gpus)
        node.gpu_source = hello.gpu_source
        reserve = self.config.reserve(hello.node_id)
        node.cpus = offered_cpus(hello.cpus or [], reserve.cpus)
        node.mem_mb = max(0, hello.mem_mb - reserve.mem) if hello.mem_mb else 0
        node.features = list(hello.features)
        node.run_as_user = hello.run_as_user
        node.containment, node.gpu_isolation = hello.containment, hello.gpu_isolation
        node.heard_now(self.state.clock)
        entry = self.config.node(hello.node_id)
        if entry is not None and entry.gpu_type:
            node.gpu_type = entry.gpu_type
        node.move(NodeEvent.JOINED)
        kill, resume = self.reconcile(node, hello.running)
        self.store.save_node(node.node_id, node.to_record())
        self.on_joined()
        log.info(
            "node %s connected: %s (%s), %d GPU(s) via %s",
            node.node_id,
            node.hostname,
            node.ip,
            len(node.gpus),
            node.gpu_source,
        )
        self.state.wake()
        return Welcome(
            heartbeat_interval=self.nodes.pace.welcome(node.node_id),
            kill=kill,
            resume=resume,
            node_secret=node_secret,
        )

    def reconcile(
        self, node: NodeRecord, reports: list[RunningReport]
    ) -> tuple[list[RunningReport], list[Resume]]:
        """Compare what the agent runs with what the master expects there and apply it:
        requeue the lost (one node failure per restart, however many jobs it lost) and the
        unlaunched (free); returns what the agent must kill, and where each run it keeps
        resumes its output."""
        expected = expectations(
            node.node_id, node.jobs, reports, self.state.jobs, self.state.steps.by_id
        )
        result = reconcile(reports, expected)
        live = {r.job_id for r in reports if not r.exited}
        resume = []
        for run_id, epoch in result.resume:
            job = self.state.jobs.get(run_id)
            slot = (
                None
                if job is None
                else next((s for s in job.allocation if s.node_id == node.node_id), None)
            )
            if slot is not None and run_id in live and slot.phase == SlotPhase.SENT:
                slot.phase = SlotPhase.STARTED  # its start was not stored yet
            o, e = self.outputs.resume_point(run_id, epoch, node.node_id)
            resume.append(Resume(job_id=run_id, epoch=epoch, stdout=o, stderr=e))
            if job is not None and job.limit_changed and node.link is not None:
                # Changed while it ran (mgpu update): the agent may not have heard (after
                # the welcome, on the same ordered link).
                limit = SetTimeLimit(job_id=run_id, epoch=epoch, time_limit=job.time_limit)
                self.uow.send(node.link, limit)
        why = f"{node.node_id} restarted and no longer runs it"
        # A run the master was stopping ends as that stop (lifecycle.slot_lost): not the
        # node's failure.
        if any(self.state.jobs[job_id].stop_reason is None for job_id in result.lost):
            self.nodes.charge_failure(node, why)
        for job_id in result.lost:
            self.life.slot_lost(self.state.jobs[job_id], EndReason.NODE_LOST, why)
        for job_id in result.unlaunched:
            never = f"the launch never reached {node.node_id}"
            self.life.slot_lost(self.state.jobs[job_id], EndReason.NOT_LAUNCHED, never)
        for step_id in result.lost_steps:  # not there: never launched, or the agent restarted
            step = self.state.steps.by_id[step_id]
            if self.state.steps.node_exited(step, node.node_id, None, f"{node.node_id} lost it"):
                self.outputs.close(step.id)
        return list(result.kill), resume

    def disconnected(self, node_id: str, link: AgentLink) -> None:
        node = self.state.nodes.get(node_id)
        if node is not None and node.link is link:
            node.link = None
            log.warning("node %s disconnected", node_id)

    # ---- messages ---------------------------------------------------------

    def message(self, node_id: str, msg: AgentMessage) -> None:
        node = self.state.nodes.get(node_id)
        if node is None:
            return  # removed (mgpu node remove) while this message was on its way
        node.heard_now(self.state.clock)
        handle = self._handlers.get(type(msg))
        if handle is None:  # not one an agent sends (parse_agent_messages lets none in)
            log.warning("node %s sent a %s message: ignored", node_id, type(msg).__name__)
            return
        handle(node, msg)

    def _hello_again(self, node: NodeRecord, msg: Hello) -> None:
        log.warning("node %s said hello again on its connection: ignored", node.node_id)

    def _heartbeat(self, node: NodeRecord, msg: Heartbeat) -> None:
        pace = self.nodes.pace.heartbeat(node.node_id)  # the cluster's size changed it
        if pace is not None and node.link is not None:
            node.link.send(pace)
        node.telemetry = {t.index: t for t in msg.telemetry}
        actions = self.gpuwatch.heartbeat(
            node, self.state.jobs, self.state.nodes.values(), node.last_seen
        )
        self.apply_watch(actions)
        for use in msg.memory:
            self._peak_so_far(node, use)

    def _peak_so_far(self, node: NodeRecord, use: RunMemory) -> None:
        """A running job's peak memory on `node` so far: its MaxRSS before it ends (in
        memory only; the end's count is stored).  A step's is its own, not the job's."""
        if is_step_id(use.job_id):
            return
        found = self._running(node, use)
        if found is not None and use.max_rss_mb > (found[0].max_rss_mb or 0):
            found[0].max_rss_mb = use.max_rss_mb

    def _terminal_ack(self, node: NodeRecord, msg: TerminalAck) -> None:
        if node.link is not None:  # typed input the agent passed on: room for more
            node.link.input_acked(msg.job_id, msg.bytes)

    def _output(self, node: NodeRecord, msg: Output) -> None:
        if is_step_id(msg.job_id):
            self._step_output(node, msg)
            return
        found = self._running(node, msg)  # None: late output of an ended run, closed
        if found is None:
            return
        job, _ = found
        data = self.outputs.accept(
            job.id, msg.epoch, node.node_id, msg.stream, msg.data, msg.offset, msg.end
        )
        if data is not None:  # None: already stored (re-sent after a reconnect)
            self.outputs.append(job.id, msg.stream, data, node.node_id, msg.epoch, msg.end)

    def _started(self, node: NodeRecord, msg: Started) -> None:
        if is_step_id(msg.job_id):
            self._step(node, msg, kill_stale=True)  # a step's start is news only when stale
            return
        found = self._running(node, msg, kill_stale=True)
        if found is None:
            return
        job, slot = found
        slot.share_enforced = msg.share_enforced  # saved with the start
        self.life.slot_started(job, slot, msg.pid, msg.hostname, msg.ip, msg.time)

    def _port_reserved(self, node: NodeRecord, msg: PortReserved) -> None:
        if is_step_id(msg.job_id):
            return  # a step has no MASTER_PORT
        found = self._running(node, msg, kill_stale=True)
        if found is None:
            return
        job, _ = found
        if awaits_port(job, node.node_id):
            self.life.launch(job, port=msg.port)
        else:  # from another rank, or again: MASTER_PORT is rank 0's, given once
            log.warning("node %s: port_reserved for job %s ignored", node.node_id, job.id)

    def _exited_message(self, node: NodeRecord, msg: Exited) -> None:
        if node.link is not None:
            # Sent after this message's effect is on disk (see UnitOfWork) and the run's
            # output is stored (PostgreSQL's is written a moment later); until then the
            # agent keeps the run and re-sends its end and output after a reconnect.
            link, forget = node.link, Forget(job_id=msg.job_id, epoch=msg.epoch)
            self.outputs.when_stored(lambda: self.uow.send(link, forget))
        if is_step_id(msg.job_id):
            self._step_exited(node, msg)
            return
        found = self._running(node, msg)
        if found is None:
            return
        job, slot = found
        if not slot.done:  # done: a re-sent end
            self._exited(job, node, slot, msg)

    def _running(
        self, node: NodeRecord, msg: RunMessage, kill_stale: bool = False
    ) -> tuple[Job, Slot] | None:
        """The running job `msg` is about and its slot on `node`, or None: a message of an
        older run (fenced by the epoch), of an ended one, or from a node it does not run on;
        `kill_stale`: a stale run the agent still has is killed."""
        job = self.state.jobs.get(msg.job_id)
        if job is None or job.epoch != msg.epoch or job.state != JobState.RUNNING:
            if kill_stale and node.link is not None:
                self.uow.send(node.link, Kill(job_id=msg.job_id, epoch=msg.epoch, reason="stale"))
            return None
        slot = next((s for s in job.allocation if s.node_id == node.node_id), None)
        return None if slot is None else (job, slot)

    def _exited(self, job: Job, node: NodeRecord, slot: Slot, msg: Exited) -> None:
        """A slot's end: a launch error (the job's, or the node's), else its exit code."""
        if msg.launch_error is not None and msg.fatal:
            slot.phase = SlotPhase.EXITED
            self.life.finish(job, EndReason.LAUNCH_FATAL, f"{node.node_id}: {msg.launch_error}")
            return
        if msg.launch_error is not None:
            why = f"{node.node_id} could not launch the job: {msg.launch_error}"
            if job.stop_reason is None:  # else it ends as the stop asked for
                self.nodes.charge_failure(node, why)
            # A failed prolog is the site's verdict on the node: tried again, no retry spent.
            reason = EndReason.PROLOG_FAILED if msg.requeue_free else EndReason.LAUNCH_FAILED
            self.life.slot_lost(job, reason, why)
            return
        node.failures = 0  # out of memory too: the job's own failure, not the node's
        if msg.epilog_error is not None:  # as Slurm: the node drains, the job's result stands
            self.nodes.drain(node.node_id, msg.epilog_error)
        if msg.max_rss_mb is not None:
            job.max_rss_mb = max(job.max_rss_mb or 0, msg.max_rss_mb)
        self.life.slot_exited(job, slot, msg.exit_code, msg.timed_out, msg.out_of_memory)

    def apply_watch(self, actions: list[WatchAction]) -> None:
        """Apply what GpuWatch made of a heartbeat."""
        for action in actions:
            if isinstance(action, BlockGpus):
                node = self.state.nodes.get(action.node_id)
                if node is not None:
                    node.foreign_blocked = action.gpus
                    if action.freed:
                        self.state.wake()
            elif isinstance(action, JobIdle):
                self.store.record_event("idle", target=action.job_id, detail=action.detail)
            elif isinstance(action, Notice):
                self.outputs.append(action.job_id, "e", action.text, action.node_id)
            elif isinstance(action, CancelIdle):
                job = self.state.jobs.get(action.job_id)
                if job is not None and job.state == JobState.RUNNING:
                    self.life.request_stop(job, EndReason.IDLE, action.reason)
                    self.uow.flush(event=("cancel", None, None, job.id))

    # ---- job steps (mgpu rsh) ---------------------------------------------

    def start_step(self, job_id: str, host: str, argv: list[str]) -> Step:
        """Run `argv` (through /bin/sh, as ssh would) on the allocated node `host` names."""
        job = self.state.jobs.get(job_id)
        if job is None or job.state != JobState.RUNNING:
            raise SubmitError(f"job {job_id} is not running")
        nodes = self.state.nodes
        ranks = [
            rank
            for rank, s in enumerate(job.allocation)
            if host in (s.node_id, nodes[s.node_id].hostname, nodes[s.node_id].ip)
        ]
        if not ranks:
            names = ", ".join(s.node_id for s in job.allocation)
            raise SubmitError(f"{host} is not one of job {job_id}'s nodes ({names})")
        slot = job.allocation[ranks[0]]
        link = nodes[slot.node_id].link
        if link is None:
            raise SubmitError(f"{slot.node_id} is not connected")
        step = self.state.steps.new(job.id, job.epoch, slot.node_id)
        credential = self.life.credential(job)
        launch = step_launch(step.id, job, ranks[0], argv, nodes, credential, self.config)
        self.uow.send(link, launch)
        return step

    def _step(self, node: NodeRecord, msg: RunMessage, kill_stale: bool = False) -> Step | None:
        """The step `msg` is about, or None: of an older run, or not on `node`; `kill_stale`:
        a stale start is killed."""
        step = self.state.steps.by_id.get(msg.job_id)
        if step is None or step.epoch != msg.epoch or not step.runs_on(node.node_id):
            if kill_stale and node.link is not None:
                self.uow.send(node.link, Kill(job_id=msg.job_id, epoch=msg.epoch, reason="stale"))
            return None
        return step

    def _step_output(self, node: NodeRecord, msg: Output) -> None:
        step = self._step(node, msg)
        if step is None:
            return
        data = self.outputs.accept(
            step.id, msg.epoch, node.node_id, msg.stream, msg.data, msg.offset, msg.end
        )
        if data is None:
            return  # already stored (re-sent after a reconnect)
        self.outputs.append(step.id, msg.stream, data, node.node_id, msg.epoch, msg.end)
        if step.to_job_output:
            self.outputs.append(step.job_id, msg.stream, data, node.node_id)

    def _step_exited(self, node: NodeRecord, msg: Exited) -> None:
        step = self._step(node, msg)
        if step is None or step.ended_on(node.node_id):
            return
        code, error = msg.exit_code, msg.launch_error
        if code is not None:
            code = exits.shell_code(code)  # a task's death by signal N: 128+N, as srun
        if msg.out_of_memory:
            step.out_of_memory = True
        if self.state.steps.node_exited(step, node.node_id, code, error):
            self.outputs.close(step.id)
