"""Job control after submit: hold, release, requeue, update (Slurm's `scontrol hold`,
`release`, `requeue`, `update`).

* **hold** — a queued job is kept from starting; its reason says `held`.  A running job
  cannot be held (requeue it first).
* **release** — a held job may start again.  A job an admin held for another user only an
  admin releases (as Slurm's admin hold).
* **requeue** — a running job is stopped and queued again: `EndReason.REQUEUED`, so no
  retry is spent; the run ends as an attempt and the next one sees `MGPU_RESTART_COUNT`
  one higher.  A queued job is left as it is (said in a sentence).
* **signal** — a signal sent to a running job now (Slurm's `scancel --signal`): to its
  steps' processes and, unless it is a batch job, its own (`full`: a batch job's script
  and its children too; `batch_only`: the batch script's shell only, `scancel -b`).  A
  queued job is refused as Slurm refuses it (`Job is pending execution`).
* **update** — a queued job's time limit, priority, GPU count and name; a running job's
  time limit and name.  Values are checked by the submit rules (`JobSpec`), and a queued
  job's new shape by admission (`could_ever_fit`, the site's limits and validator), so an
  impossible update is refused with the sentence submit would give.  A running job's new
  limit is sent to its agents (`SetTimeLimit`), which apply it to the run's start.  The
  owner may lower a running job's limit; only an admin may raise it (as in Slurm, where
  the limit is what the scheduler planned around).

Each change is written with an audit event in the same transaction, before the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mgpu import spec as specs
from mgpu.master.control.admission import Admission, AdmissionContext
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.control.loop import SchedulingLoop
from mgpu.master.control.nodes import Conflict
from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.steps import is_batch
from mgpu.model import DesiredState, EndReason, Job, JobState, SlotPhase, WaitCode
from mgpu.protocol import SetTimeLimit, SignalRun

__all__ = ["Actor", "Change", "JobControl", "NotAllowed", "SignalAsked", "signal_number"]


class NotAllowed(PermissionError):
    """The asker may not do this (one sentence why); `target` names what was asked, for
    the audit log (None: the caller names it)."""

    def __init__(self, why: str, target: str | None = None) -> None:
        super().__init__(why)
        self.target = target


@dataclass(frozen=True, slots=True)
class Change:
    """What one action did to one job: `changed` False means it was left as it was."""

    job_id: str
    changed: bool
    message: str
    detail: str = ""
    """What changed, for the audit log (update)."""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asks; `audit`: write each change with its own audit event now (False: the
    caller flushes a slice of an array's tasks with one event)."""

    user: str
    admin: bool
    address: str | None = None
    audit: bool = True

    def check_owner(self, job_id: str, owner: str, verb: str) -> None:
        """The one ownership rule: a job is acted on by its owner or an admin."""
        if not self.admin and owner != self.user:
            raise NotAllowed(f"job {job_id} belongs to {owner}", f"{verb} {job_id}")

    def owns(self, job: Job, verb: str) -> Job:
        """`job`, if this asker may `verb` it (else NotAllowed)."""
        self.check_owner(job.id, job.user, verb)
        return job

    def check_admin(self, action: str) -> None:
        if not self.admin:
            raise NotAllowed(f"{action} needs an admin token ({self.user} is not admin)", action)

    def acting_as(self, user: str | None, action: str) -> str:
        """Who this asker `action`s as: itself, or `user` (another user: admins only)."""
        if not user or user == self.user:
            return self.user
        if not self.admin:
            raise NotAllowed(f"{self.user} may not {action} as {user}", action)
        return user


def _ended(job: Job, what: str) -> Conflict:
    return Conflict(f"job {job.id} has ended ({job.state.value}); {what}")


def _new_limit(new: JobSpec) -> float | None:
    """An update's time limit (None: unlimited)."""
    assert new.time is not None
    return None if math.isinf(new.time) else new.time


def _moment(epoch: float | None) -> str:
    if epoch is None:
        return "none"
    from datetime import datetime

    return datetime.fromtimestamp(epoch).isoformat(timespec="seconds")


def _limit(seconds: float | None) -> str:
    return specs.format_time_limit(seconds)


@dataclass(frozen=True, slots=True)
class SignalAsked:
    """`scancel --signal`'s request: the signal, and where it goes (see `JobControl.signal`)."""

    number: int
    batch_only: bool = False
    full: bool = False


def signal_number(value: object) -> int:
    """A signal by name (`USR1`, `SIGUSR1`, any case) or number; SpecError if none."""
    import signal as signals

    if isinstance(value, int) and not isinstance(value, bool):
        if 1 <= value <= signals.SIGRTMAX:
            return value
        raise specs.SpecError(f"signal number {value} does not exist; use 1-{signals.SIGRTMAX}")
    text = str(value).strip()
    if text.isdigit():
        return signal_number(int(text))
    name = text.upper() if text.upper().startswith("SIG") else "SIG" + text.upper()
    member = signals.Signals.__members__.get(name)
    if member is None or name in ("SIGRTMIN", "SIGRTMAX"):
        raise specs.SpecError(f"{text[:40]!r} is not a signal name; use one such as USR1 or TERM")
    return int(member)


class JobControl:
    def __init__(
        self,
        state: ControllerState,
        life: Lifecycle,
        loop: SchedulingLoop,
        admission: Admission,
        context: Callable[[], AdmissionContext],
    ) -> None:
        self.state = state
        self.life = life
        self.uow = life.uow
        self.loop = loop
        self.admission = admission
        self.context = context

    def _done(self, job: Job, kind: str, actor: Actor, message: str, detail: str = "") -> Change:
        """Written now, with the audit event, before the asker is told (an array's tasks:
        by the caller, a slice at a time, with one event for the request)."""
        self.uow.persist(job)
        if actor.audit:
            self.uow.flush(event=(kind, actor.user, actor.address, job.id), detail=detail or None)
        self.state.notify(job)
        return Change(job.id, True, message, detail)

    def _requeued_changed(self, job: Job) -> None:
        """A queued job's request changed: the loop's cached verdicts go, a pass comes."""
        self.loop.forget(job)
        self.state.wake()

    def check_allowed(self, verb: str, job: Job, actor: Actor, new: JobSpec | None = None) -> None:
        """NotAllowed if `actor` may not `verb` `job` (`new`: an update's values), changing
        nothing: every task of an array is checked before any is changed (all or nothing)."""
        actor.check_owner(job.id, job.user, verb)
        if actor.admin:
            return
        held_by_another = job.held and job.held_by not in (None, job.user, actor.user)
        if verb == "release" and held_by_another and job.state == JobState.QUEUED:
            raise NotAllowed(f"job {job.id} was held by {job.held_by}; only an admin releases it")
        if verb == "update" and new is not None and "time" in new.model_fields_set:
            limit = _new_limit(new)
            raising = limit is None or (job.time_limit is not None and limit > job.time_limit)
            if job.state == JobState.RUNNING and raising:
                raise NotAllowed(
                    f"only an admin may raise the time limit of a running job "
                    f"({job.id} has {_limit(job.time_limit)}; asked {_limit(limit)})"
                )

    # ---- hold / release ---------------------------------------------------

    def hold(self, job: Job, actor: Actor) -> Change:
        if job.terminal:
            raise _ended(job, "only a queued job can be held")
        if job.state == JobState.RUNNING:
            raise Conflict(
                f"job {job.id} is running; only a queued job can be held "
                f"(mgpu requeue {job.id} first)"
            )
        if job.held:
            return Change(job.id, False, f"job {job.id} is held already")
        job.held, job.held_by, job.reason = True, actor.user, "held"
        job.reason_code = WaitCode.HELD
        self._requeued_changed(job)
        return self._done(job, "hold", actor, f"held {job.id}")

    def release(self, job: Job, actor: Actor) -> Change:
        if not job.held or job.state != JobState.QUEUED:
            return Change(job.id, False, f"job {job.id} is not held")
        self.check_allowed("release", job, actor)
        job.held, job.held_by, job.reason = False, None, "waiting to be scheduled"
        job.reason_code = None
        self._requeued_changed(job)
        return self._done(job, "release", actor, f"released {job.id}")

    # ---- requeue ----------------------------------------------------------

    def requeue(self, job: Job, actor: Actor) -> Change:
        if job.terminal:
            raise _ended(job, "only a running job can be requeued (submit it again)")
        if job.state == JobState.QUEUED:
            return Change(job.id, False, f"job {job.id} is queued already: nothing to requeue")
        if job.desired is DesiredState.STOP:
            raise Conflict(f"job {job.id} is being cancelled; it cannot be requeued")
        if job.desired is not DesiredState.RUN:
            return Change(job.id, False, f"job {job.id} is being requeued already")
        self.life.request_stop(job, EndReason.REQUEUED, f"requested by {actor.user}")
        return self._done(job, "requeue", actor, f"requeueing {job.id}")

    # ---- signal -----------------------------------------------------------

    def signal(self, job: Job, actor: Actor, asked: SignalAsked) -> Change:
        """Send the signal to the running job's processes (Slurm's `scancel --signal`):
        its steps' and, unless it is a batch job (whose script Slurm leaves alone without
        `-f`), its own; `batch_only`: the batch script's shell only (`-b`, no steps)."""
        if job.terminal:
            raise Conflict(f"job {job.id}: Job/step already completing or completed")
        if job.state == JobState.QUEUED:
            raise Conflict(f"job {job.id}: Job is pending execution")
        for slot in job.allocation:
            node = self.state.nodes.get(slot.node_id)
            if node is not None and node.link is not None and node.link.no_signal:
                raise Conflict(f"job {job.id} cannot be signalled: {node.link.no_signal}")
        own = asked.batch_only or asked.full or not is_batch(job)
        sent = 0
        if own:
            for slot in job.allocation:  # a batch job's: its first node's only
                node = self.state.nodes.get(slot.node_id)
                live = slot.phase in (SlotPhase.SENT, SlotPhase.STARTED)
                if not live or node is None or node.link is None:
                    continue
                message = SignalRun(
                    job_id=job.id, epoch=job.epoch, signal=asked.number, top_only=asked.batch_only
                )
                self.uow.send(node.link, message)
                sent += 1
        if not asked.batch_only:
            for step in self.state.steps.of_job(job.id):
                for node_id in step.on_nodes:
                    node = self.state.nodes.get(node_id)
                    if step.ended_on(node_id) or node is None or node.link is None:
                        continue
                    message = SignalRun(job_id=step.id, epoch=step.epoch, signal=asked.number)
                    self.uow.send(node.link, message)
                    sent += 1
        detail = f"signal {asked.number} to {sent} run(s)"
        if actor.audit:
            self.uow.flush(event=("signal", actor.user, actor.address, job.id), detail=detail)
        return Change(job.id, True, f"signal {asked.number} sent to {job.id}", detail)

    # ---- update -----------------------------------------------------------

    @staticmethod
    def parse_update(
        time: str | None,
        priority: int | None,
        gpus: int | None,
        name: str | None,
        begin: float | None = None,
    ) -> JobSpec:
        """The new values checked as submit checks them (its sentences, its limits): a
        SpecError or pydantic ValidationError for a bad one."""
        if time is None and priority is None and gpus is None and name is None and begin is None:
            raise specs.SpecError("nothing to change: give --time, --priority, --gpus or --name")
        raw: dict[str, object] = {"command": "true"}
        for key, value in (
            ("time", time),
            ("priority", priority),
            ("gpus", gpus),
            ("begin", begin),
        ):
            if value is not None:
                raw[key] = value
        if name is not None:
            raw["name"] = name
        return JobSpec.model_validate(raw)

    async def update(self, job: Job, new: JobSpec, actor: Actor) -> Change:
        """Apply the values given in `new` (see `parse_update`) to `job`."""
        fields = new.model_fields_set - {"command"}
        was = job.state
        if job.terminal:
            raise _ended(job, "only a queued or running job can be updated")
        if job.state == JobState.RUNNING and fields & {"priority", "gpus", "begin"}:
            raise Conflict(
                f"job {job.id} is running: only its --time and --name can change now "
                "(--priority, --gpus and its start time only while it is queued)"
            )
        self.check_allowed("update", job, actor, new)
        limit = job.time_limit if "time" not in fields else _new_limit(new)
        updated = Job.from_record(job.to_record())
        updated.time_limit = limit
        if "name" in fields:
            updated.name = new.name
        if "priority" in fields:
            updated.priority = new.priority
        if "gpus" in fields:
            self._reshape(updated, new)
        if "begin" in fields:
            updated.begin_time = new.begin
        await self._admit(job, updated, new)
        if job.state != was:  # it started (or ended) while the site's validator ran
            raise Conflict(f"job {job.id} changed while the update was checked; try again")
        changes = []
        for attr, label in (
            ("time_limit", "time"),
            ("name", "name"),
            ("priority", "priority"),
            ("gpus", "gpus"),
            ("begin_time", "begin"),
        ):
            old, value = getattr(job, attr), getattr(updated, attr)
            if old != value:
                shown = _limit if attr == "time_limit" else _moment if attr == "begin_time" else str
                changes.append(f"{label} {shown(old)} -> {shown(value)}")
                setattr(job, attr, value)
        job.gpus_per_node = updated.gpus_per_node
        if not changes:
            return Change(job.id, False, f"job {job.id} has these values already")
        if job.state == JobState.RUNNING and "time" in fields:
            self._send_limit(job)
        if job.state == JobState.QUEUED:
            self._requeued_changed(job)
        detail = "; ".join(changes)
        return self._done(job, "update", actor, f"updated {job.id}: {detail}", detail)

    @staticmethod
    def _reshape(job: Job, new: JobSpec) -> None:
        """`--gpus N` on a queued job: its total, spread as it asked (per node for a gang)."""
        if job.gpu_ids is not None or job.node_gpu_ids is not None:
            option = "--gpu-ids" if job.gpu_ids is not None else "--node-gpu-ids"
            raise Conflict(
                f"job {job.id} asked for exact GPUs ({option}); --gpus cannot change that "
                "(cancel it and submit again)"
            )
        assert new.gpus is not None
        if job.nodes is not None:  # checked as submit checks --gpus with --nodes
            spec = JobSpec.model_validate({"command": "true", "gpus": new.gpus, "nodes": job.nodes})
            job.gpus, job.gpus_per_node = spec.shape.gpus, spec.shape.gpus_per_node
        else:
            job.gpus = new.gpus

    async def _admit(self, job: Job, updated: Job, new: JobSpec) -> None:
        """The site's rules on the updated job, as at submit (SubmitError)."""
        if job.state == JobState.RUNNING:
            top = self.admission.max_time
            if top is not None and (updated.time_limit is None or updated.time_limit > top):
                raise SubmitError(
                    f"the job's time limit {_limit(updated.time_limit)} is more than this "
                    f"cluster allows per job ({_limit(top)})"
                )
            return
        ctx = self.context()
        groups = self.admission.check(updated, new, ctx)
        if self.admission.config.validator:
            await self.admission.run_validator(updated, new, groups or ctx.groups(job.user))

    def _send_limit(self, job: Job) -> None:
        """The running job's agents apply the new limit (again when they reconnect)."""
        job.limit_changed = True
        for slot in job.allocation:
            node = self.state.nodes.get(slot.node_id)
            if slot.phase in (SlotPhase.SENT, SlotPhase.STARTED) and node and node.link:
                message = SetTimeLimit(job_id=job.id, epoch=job.epoch, time_limit=job.time_limit)
                self.uow.send(node.link, message)
