"""A job's life on the master: one method per transition, each doing its bookkeeping once.

    queued ──start──▶ running ──slot_started──▶ (started) ──slot_exited (last)──▶ ended
      ▲                  │ request_stop: desired STOP / PREEMPT / REQUEUE, processes killed
      └──── requeue ◀────┘ slot_lost (node lost, restarted, removed; launch failed)

* `start` — queued → running: a new epoch, the GPUs taken, a new credential, an attempt;
  the launch (or, for a job on several nodes, the rank-0 port request) is sent after the
  write.  Slots go pending → sent (`launch`) → started (`slot_started`) → exited.
* `slot_exited` — one slot's process ended; the last one decides how the run ended (an
  `EndReason`: the desired state first, then the time limit, then the exit codes).
* `request_stop` — the master wants a running job stopped (`Job.desired`): its processes
  are killed and the job ends (or is requeued) when their exits arrive.
* `slot_lost` — a slot's process is gone without an exit: requeued for the reason given
  (or, when a stop was requested, ended or requeued as that stop).
* `requeue` — running → queued, a retry spent when the reason counts one (with exponential
  backoff), failed when none is left; `finish` — to the final state the reason names.

The node side of a lost or failed slot (its failure count, a drain) is the caller's: none
for a run the master was stopping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pydantic import BaseModel

from mgpu import exits
from mgpu.config import ClusterConfig
from mgpu.master.control.launch import job_launch, preempt_warning
from mgpu.master.monitor.metrics import JobMetrics
from mgpu.master.security.auth import new_job_token
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.steps import is_batch
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.master.store.outputs import OutputStore
from mgpu.model import (
    ALLOCATION,
    Attempt,
    DesiredState,
    EndReason,
    Job,
    JobState,
    Slot,
    SlotPhase,
)
from mgpu.protocol import Kill, Launch, ReservePort
from mgpu.scheduler import UsageLedger
from mgpu.signalspec import SignalSpec
from mgpu.tokens import token_hash

log = logging.getLogger("mgpu.master")

__all__ = ["Lifecycle"]

_STOP_WORDS = {
    DesiredState.STOP: ("cancelling", "cancelled"),
    DesiredState.PREEMPT: ("preempting", "preempted"),
    DesiredState.REQUEUE: ("requeueing", "requeued"),
}
"""A stop's reason shown while it is under way, and the Kill message's reason."""


def needs_port(job: Job) -> bool:
    """Is this job launched only once its rank-0 node has reserved MASTER_PORT?"""
    return len(job.allocation) > 1 or job.distributed or job.mpi


def awaits_port(job: Job, node_id: str) -> bool:
    """May `node_id`'s `port_reserved` launch this running job: it asked for the port
    (its rank 0, asked at start), and none came yet.  Another node's, or a second one,
    would set (or change) every rank's MASTER_PORT, or launch the job twice."""
    if not needs_port(job) or not job.allocation or job.port is not None:
        return False
    first = job.allocation[0]
    return first.node_id == node_id and first.phase == SlotPhase.PENDING


class Lifecycle:
    def __init__(
        self,
        state: ControllerState,
        uow: UnitOfWork,
        outputs: OutputStore,
        usage: UsageLedger,
        config: ClusterConfig,
        token_suffix: str,
        job_metrics: JobMetrics,
    ) -> None:
        self.state = state
        self.uow = uow
        self.outputs = outputs
        self.usage = usage
        self.config = config
        self.token_suffix = token_suffix
        """What follows a credential's secret: the CA's fingerprint, marked on a TLS master."""
        self.job_metrics = job_metrics
        self._tokens: dict[str, str] = {}
        """Running jobs' credentials in clear: memory only (the store keeps their hashes)."""
        self.on_end: list[Callable[[Job], None]] = []
        """Told when a job leaves the active set (ended): caches drop it."""
        self.on_requeue: list[Callable[[Job], None]] = []
        """Told when a running job is queued again (the loop's quick passes look at it)."""

    # ---- credentials ------------------------------------------------------

    def credential(self, job: Job) -> str:
        """The running job's $MGPU_TOKEN.  Only hashes are stored, so after a master restart
        the plaintext is gone: a new credential is made for what starts now (a step, or a
        launch that waited for its port), its hash added beside the first (written before
        any agent hears of it)."""
        token = self._tokens.get(job.id)
        if token is None:
            token = self._tokens[job.id] = new_job_token(job.id, self.token_suffix)
            job.job_token_hashes.append(token_hash(token))
            self.uow.persist(job)
        return token

    def _forget_credential(self, job: Job) -> None:
        job.job_token_hashes = []
        self._tokens.pop(job.id, None)

    # ---- starting ---------------------------------------------------------

    def start(
        self,
        job: Job,
        placements: Sequence[tuple[str, Sequence[int]]],
        held: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """queued → running on `placements` (node, GPUs), which the caller found free;
        `held`: the CPUs and MiB it holds on each (a count: which CPUs is picked here),
        which the caller found free too (None: none, the node's are shared)."""
        job.epoch += 1
        if job.epoch == 1:  # never run: nothing of its output is stored anywhere
            self.outputs.fresh(job.id)
        token = new_job_token(job.id, self.token_suffix)
        self._tokens[job.id] = token
        job.job_token_hashes = [token_hash(token)]
        job.transition(JobState.RUNNING, "launching")
        job.allocation = [
            self._new_slot(job, n, g, held[i] if held else (0, 0))
            for i, (n, g) in enumerate(placements)
        ]
        job.attempts.append(
            Attempt(
                epoch=job.epoch,
                nodes=[n for n, _ in placements],
                gpu_ids={n: list(g) for n, g in placements},
            )
        )
        job.start_time = job.exit_code = job.failed_node = job.port = None
        job.timed_out = job.limit_changed = job.out_of_memory = False
        job.max_rss_mb = None  # this run's, as its agents tell it
        job.stop_reason = job.stop_text = None
        for slot in job.allocation:
            self.state.allocate(job, slot.node_id, slot.gpu_ids, slot.cpu_ids or (), slot.mem_mb)
        self.uow.persist(job)  # written before any agent hears of it (see UnitOfWork)
        self.state.counters["started"] += 1
        if job.kind == ALLOCATION:
            self._grant(job)
            return
        if needs_port(job):
            first = self.state.nodes[placements[0][0]]
            assert first.link is not None
            self.uow.send(first.link, ReservePort(job_id=job.id, epoch=job.epoch))
        else:
            self.launch(job, port=None)

    def _new_slot(
        self, job: Job, node_id: str, gpu_ids: Sequence[int], held: tuple[int, int]
    ) -> Slot:
        """The job's slot on a node, with the CPU ids it gets there (see `start`)."""
        cpus, mem_mb = held
        cpu_ids = self.state.pick_cpus(node_id, cpus, gpu_ids) if cpus else None
        if cpus and cpu_ids is None:  # the caller checked: a bug, not a user's error
            raise RuntimeError(f"{cpus} CPUs of node {node_id} for job {job.id} are not free")
        return Slot(
            node_id=node_id,
            gpu_ids=list(gpu_ids),
            cpus=cpus or None,
            cpu_ids=cpu_ids,
            mem_mb=mem_mb or None,
        )

    def launch(self, job: Job, port: int | None) -> None:
        """Send every rank its launch (pending → sent); `port`: the rank-0 node's reserved
        MASTER_PORT, for a job on several nodes."""
        job.port = port
        if job.stop_reason is not None:  # stopped while its port was being reserved
            end, text = self._how_it_ended(job, failed=False)
            if end.to_state() == JobState.QUEUED:
                self.requeue(job, end, text or end.value)
            else:
                self.finish(job, end, text)
            return
        nodes = self.state.nodes
        for rank, slot in enumerate(job.allocation):
            if slot.phase != SlotPhase.PENDING:
                continue
            if (job.mpi or is_batch(job)) and rank > 0:
                # mpirun on rank 0 starts the other ranks through `mgpu rsh` (job steps), a
                # batch script's srun its tasks; their slots stay allocated until it ends.
                node = nodes[slot.node_id]
                slot.phase, slot.hostname, slot.ip = SlotPhase.HELD, node.hostname, node.ip
                continue
            link = nodes[slot.node_id].link
            if link is None:
                continue  # left pending: lost at the node's next hello, or with the node
            message = job_launch(job, rank, nodes, self.credential(job), self.config)
            slot.phase = SlotPhase.SENT
            self.uow.send(link, message)
        self.uow.persist(job)

    def _grant(self, job: Job) -> None:
        """An allocation runs nothing of its own: its slots are held for its steps, and it
        has started once its GPUs are taken (master/control/allocations.py)."""
        for slot in job.allocation:
            node = self.state.nodes[slot.node_id]
            slot.phase, slot.hostname, slot.ip = SlotPhase.HELD, node.hostname, node.ip
        job.start_time = job.attempts[-1].start_time = self.state.clock.time()
        job.reason = None
        self.job_metrics.started(job)
        self.state.notify(job)

    def slot_started(
        self, job: Job, slot: Slot, pid: int, hostname: str, ip: str, time: float
    ) -> None:
        slot.pid, slot.hostname, slot.ip = pid, hostname, ip
        if slot.phase in (SlotPhase.PENDING, SlotPhase.SENT):
            slot.phase = SlotPhase.STARTED
        if job.start_time is None:
            job.start_time = time
            if job.attempts:
                job.attempts[-1].start_time = time
            self.job_metrics.started(job)
        if job.desired is DesiredState.RUN:
            job.reason = None  # no longer "launching"
        # Written with this turn's flush (one more write per job, in the same transaction
        # as the turn's other changes): after a master restart, only a slot known to have
        # started counts as lost when its agent no longer has it; one not known to have
        # started may never have received its launch and is requeued free.
        self.uow.persist(job)
        self.state.notify(job)

    # ---- ending -----------------------------------------------------------

    def slot_exited(
        self,
        job: Job,
        slot: Slot,
        exit_code: int | None,
        timed_out: bool,
        out_of_memory: bool = False,
    ) -> None:
        """One slot's process ended with `exit_code`; the last one ends the run."""
        slot.phase = SlotPhase.EXITED
        slot.exit_code = exit_code
        if timed_out:
            job.timed_out = True
        if out_of_memory:
            job.out_of_memory = True
            job.failed_node = job.failed_node or slot.node_id
        live = [s for s in job.allocation if not s.done]
        if exit_code != 0 and live and job.desired is not DesiredState.STOP:
            # As srun --kill-on-bad-exit: one rank failing ends the others.
            job.failed_node = slot.node_id
            self.kill_slots(job, f"{slot.node_id} failed")
        self.state.release(job, slot)
        if live:
            self.uow.persist(job)
            return
        codes = [s.exit_code for s in job.allocation if s.exit_code is not None]
        bad = [c for c in codes if c != 0]
        job.exit_code = bad[0] if bad else (codes[0] if codes else None)
        first_bad = self._slot(job, job.failed_node) if job.failed_node else None
        if first_bad is not None:
            job.exit_code = first_bad.exit_code  # the rank that failed first, not its victims
        end, text = self._how_it_ended(job, bool(bad))
        if end.to_state() == JobState.QUEUED:
            self.requeue(job, end, text or end.value)
        else:
            self.finish(job, end, text)

    def _how_it_ended(self, job: Job, failed: bool) -> tuple[EndReason, str | None]:
        """Every slot has exited: what the master asked for first, then what happened."""
        if job.stop_reason is not None:
            if job.desired is DesiredState.PREEMPT:
                return job.stop_reason, job.stop_text or "preempted by higher-priority work"
            if job.desired is DesiredState.REQUEUE:
                return job.stop_reason, job.stop_text or "requeue requested"
            return job.stop_reason, job.stop_text or "cancelled"
        where = f" on {job.failed_node}" if job.failed_node and len(job.allocation) > 1 else ""
        if job.out_of_memory:  # before the time limit: the kill was the limit's
            return EndReason.OUT_OF_MEMORY, f"out of memory{where}: killed at its memory limit"
        if job.timed_out:
            return EndReason.TIMEOUT, "time limit reached"
        if not failed:
            return EndReason.EXIT_OK, None
        code = job.exit_code
        return (
            EndReason.EXIT_NONZERO,
            f"{exits.describe(code) if code is not None else 'failed'}{where}",
        )

    def request_stop(self, job: Job, reason: EndReason, text: str | None = None) -> None:
        """Ask a running job to stop for `reason` (cancelled, idle, preempted, requeued):
        its processes are killed, and it ends or is requeued when their exits arrive.  A
        stop that ends the job wins over one that would requeue it."""
        if job.desired is DesiredState.STOP and reason.desired is not DesiredState.STOP:
            return
        job.stop_reason, job.stop_text = reason, text
        shown, kill_reason = _STOP_WORDS[reason.desired]
        job.reason = shown
        self.uow.persist(job)
        # A preempted job is warned first, as --signal warns of the time limit.
        warning = preempt_warning(job, self.config) if reason is EndReason.PREEMPTED else None
        self.kill_slots(job, kill_reason, warning=warning)
        if all(slot.done for slot in job.allocation):  # nothing to wait for (an allocation)
            end, why = self._how_it_ended(job, failed=False)
            if end.to_state() == JobState.QUEUED:
                self.requeue(job, end, why or end.value)
            else:
                self.finish(job, end, why)

    def slot_lost(self, job: Job, reason: EndReason, why: str) -> None:
        """A slot's process is gone without an exit: requeue for `reason` (`why` is shown),
        unless the master was stopping the run: then it ends as that stop (cancelled,
        requeued, preempted: no retry spent), whatever happened to the node meanwhile
        (issue 25 item 8: an agent killed during the kill grace)."""
        if job.stop_reason is None:
            self.requeue(job, reason, why)
            return
        end, text = self._how_it_ended(job, failed=False)
        if end.to_state() == JobState.QUEUED:
            self.requeue(job, end, text or end.value)
        else:
            self.finish(job, end, text)

    def requeue(self, job: Job, reason: EndReason, why: str) -> None:
        """running → queued; a retry is spent when `reason` counts one (failed when none
        is left), with exponential backoff before the next start."""
        if reason.counts_retry and job.retries >= job.max_retries:
            self.finish(job, EndReason.RETRIES_EXHAUSTED, why, last=reason)
            return
        for slot in job.allocation:
            self.state.release(job, slot)
        self.kill_slots(job, "requeued")
        self.end_steps(job)
        if reason.counts_retry:
            job.retries += 1
            s = self.config.scheduling
            backoff = min(s.retry_backoff_base * 2 ** (job.retries - 1), s.retry_backoff_max)
            job.eligible_time = self.state.clock.time() + backoff
            text = f"requeued: {why} (retry {job.retries}/{job.max_retries})"
        else:
            text = f"requeued: {why}"
        now = self.state.clock.time()
        self._charge(job, now)
        self._end_attempt(job, now, why)
        job.last_end = reason
        job.restarts += 1  # MGPU_RESTART_COUNT of the next run, whatever the cause
        job.transition(JobState.QUEUED, text)
        job.stop_reason = job.stop_text = None
        self._forget_credential(job)
        for slot in job.allocation:
            slot.phase = SlotPhase.EXITED
        self.uow.persist(job)
        self.state.notify(job)
        for told in self.on_requeue:
            told(job)
        self.state.wake()

    def finish(
        self, job: Job, reason: EndReason, text: str | None, last: EndReason | None = None
    ) -> None:
        """To the final state `reason` names, `text` shown as the job's reason; `last`: the
        requeue reason of a job out of retries, which decides its `end_code`."""
        final = reason.to_state()
        assert final.terminal, reason
        now = self.state.clock.time()
        if job.state == JobState.RUNNING:
            self._charge(job, now)
            self.kill_slots(job, final.value)  # ranks still running elsewhere
            job.last_end = last or reason  # a run ended (a queued job's last one stands)
        job.transition(final, text)
        job.end_code = (last or reason).end_code
        self._forget_credential(job)  # the run's credential dies with it
        self.end_steps(job)
        job.end_time = now
        for slot in job.allocation:
            self.state.release(job, slot)
        self._end_attempt(job, now, text or final.value)
        self.uow.persist(job)
        self.state.jobs.pop(job.id, None)
        self.outputs.close(job.id)
        self.state.counters["completed" if final == JobState.COMPLETED else "failed"] += 1
        self.job_metrics.finished(job, final)
        for forget in self.on_end:
            forget(job)
        self.state.notify(job)
        self.state.wake()

    def unsendable(self, node_id: str, message: BaseModel, why: str) -> None:
        """A launch that cannot be encoded fails its job (not the node, no retry spent)."""
        log.error("not sent to %s: %s %s", node_id, type(message).__name__, why)
        if not isinstance(message, Launch):
            return
        reason = f"could not be sent to {node_id}: {why}"
        step = self.state.steps.by_id.get(message.job_id)
        if step is not None:
            self.state.steps.end(step, None, reason)
            self.outputs.close(step.id)
            return
        job = self.state.jobs.get(message.job_id)
        if job is not None and job.state == JobState.RUNNING and job.epoch == message.epoch:
            self.finish(job, EndReason.LAUNCH_FATAL, reason)

    # ---- helpers ----------------------------------------------------------

    def kill_slots(
        self,
        job: Job,
        reason: str,
        except_node: str | None = None,
        warning: SignalSpec | None = None,
    ) -> None:
        """Kill the run's live slots; `warning`: a signal sent first, and the seconds the
        job then has to end on its own before SIGTERM (a preempted job's)."""
        for slot in job.allocation:
            if slot.done or slot.node_id == except_node:
                continue
            node = self.state.nodes.get(slot.node_id)
            if node is not None and node.link is not None:
                kill = Kill(
                    job_id=job.id,
                    epoch=job.epoch,
                    reason=reason,
                    grace=self.config.scheduling.kill_grace,
                )
                if warning is not None:
                    kill.signal, kill.signal_lead = warning.number, float(warning.seconds)
                    kill.signal_batch = warning.batch_only
                self.uow.send(node.link, kill)

    def end_steps(self, job: Job) -> None:
        """The job's run ended: its steps are ended too, their processes killed."""
        for step in self.state.steps.forget_job(job.id):
            for node_id in step.on_nodes:
                node = self.state.nodes.get(node_id)
                if node is not None and node.link is not None and node_id not in step.exits:
                    kill = Kill(job_id=step.id, epoch=step.epoch, reason="job ended")
                    self.uow.send(node.link, kill)
            self.outputs.close(step.id)

    def _charge(self, job: Job, now: float) -> None:
        """Add what the ending attempt cost (GPU-seconds by default; `scheduling.billing`)
        to its user's fairshare usage."""
        cpus = sum(s.cpus or 0 for s in job.allocation)
        mem = sum(s.mem_mb or 0 for s in job.allocation)
        if job.start_time is not None and (job.gpus > 0 or cpus or mem):
            amount = job.gpus * job.gpu_fraction  # a share is charged F of its GPU's time
            seconds = max(0.0, now - job.start_time)
            self.usage.charge(job.user, amount, cpus, mem, seconds, now)
            self.uow.usage_changed()

    @staticmethod
    def _end_attempt(job: Job, now: float, why: str) -> None:
        if job.attempts and job.attempts[-1].end_time is None:
            job.attempts[-1].end_time = now
            job.attempts[-1].end_reason = why

    @staticmethod
    def _slot(job: Job, node_id: str) -> Slot | None:
        return next((s for s in job.allocation if s.node_id == node_id), None)
