"""Group commit: the jobs changed in one event-loop turn, written in one transaction, and
the agent messages that wait on them, sent only after.

A change marks its job dirty (`persist`); the first one of a turn arms one `flush` at the
end of the turn.  Messages to agents go to the outbox (`send`) and leave after the write
that holds the changes before them: an agent never hears of a state the master could lose
in a crash.  Until a job's change is written, queries find it here (`pending`): a job
that has just ended is in no other place for that moment.  A srun step that ended is a
row of its own (`step_ended`), written in the same transaction without rewriting its job
(store/steps.py); so are the running jobs' steps as they change (`step_changed`:
control/livesteps.py), before the launch or the agent's `Forget` that follows from the
change is sent.

The write is handed to the store's thread (`Store.save_jobs_later`, store/dbthread.py)
and the event loop goes on: one batch is written at a time, the changes of the turns
meanwhile make the next one (group commit), and each batch's messages leave once it is
written.  A flush given an audit event (a user's cancel, say) waits for its write, for
the store's `answer_within` at most.  A batch the database refused for want of a
connection (StoreUnavailable) is not lost: its jobs, steps and messages go back ahead of
what came since, and are written again a moment later.  Without a running event loop
(the controller tests, a shutdown) every flush waits for its write.

A job's end is written only once the output of every job that ended is stored
(`outputs_stored`: PostgreSQL's output store writes a moment later, store/pgoutputs.py): a
new leader drops the output an agent re-sends for a run that ended, so a master killed
between the two writes must not have stored the end alone.  The batch waits for that
without the event loop waiting (a user's change, which waits for its write, waits for it
too), and the changes meanwhile go in the next batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from mgpu.master.runtime.clock import Timers
from mgpu.master.runtime.loop import running_loop
from mgpu.master.state.keyhold import HELD, Event, KeyHold
from mgpu.master.state.registry import AgentLink, Unsendable
from mgpu.master.store.base import Store, StoreUnavailable
from mgpu.master.store.steps import StepRow
from mgpu.model import Job
from mgpu.scheduler import UsageLedger

log = logging.getLogger("mgpu.master")

__all__ = ["RETRY_S", "UnitOfWork"]


RETRY_S = 1.0
"""Seconds before a batch the database refused is written again."""
OUTPUT_WAIT = 0.5
"""Seconds a flush that waits (a user's change) gives the ended jobs' output at most, on
the event loop: a paused database then costs its write's bound, not twice that."""

OutputsStored = Callable[[Callable[[], None], bool, bool], None]
"""`OutputStore.when_stored(then, ended, in_thread)`."""


def _stored_at_once(then: Callable[[], None], ended: bool, in_thread: bool) -> None:
    then()


@dataclass(eq=False)
class Batch:
    """One flush's write and what waits on it."""

    jobs: dict[str, Job]
    steps: list[StepRow]
    outbox: list[tuple[AgentLink, BaseModel]]
    usage: bool
    live: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = field(default_factory=dict)
    """Running jobs' steps: their job, and their record as it is when the batch is written."""
    gone: list[str] = field(default_factory=list)
    """Jobs whose steps are forgotten (they ended)."""
    answers: list[tuple[str, str, str]] = field(default_factory=list)
    """Keyed requests' answers: (user, key, answer) (state/keyhold.py)."""
    handed: bool = field(default=False)
    """Given to the store (it waited for the ended jobs' output before)."""
    done: bool = field(default=False)


class UnitOfWork:
    def __init__(self, store: Store, timers: Timers, usage: UsageLedger) -> None:
        self.store = store
        self.timers = timers
        self.usage = usage
        self._dirty: dict[str, Job] = {}
        self._steps: list[StepRow] = []
        self._live: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {}
        """Steps changed this turn: their job, and their record as it will be at the flush."""
        self._steps_gone: list[str] = []
        self._answers: list[tuple[str, str, str]] = []
        self._outbox: list[tuple[AgentLink, BaseModel]] = []
        self._usage_dirty = False
        self._flush_armed = False
        self._writing: list[Batch] = []
        """Batches handed to the store and not written yet, oldest first."""
        self._retry_armed = False
        self.on_unsendable: Callable[[str, BaseModel, str], None] = lambda n, m, why: None
        """Told of a message that could not be encoded (node id, message, why)."""
        self.on_persist: Callable[[Job], None] = lambda job: None
        """Told of every change (the scheduler's running-job index: master/state/runindex.py)."""
        self.outputs_stored: OutputsStored = _stored_at_once
        """The output store's `when_stored`: a batch is written after the ended jobs'
        output (module docstring)."""

    def persist(self, job: Job) -> None:
        """Write this job's change with this turn's flush."""
        self._dirty[job.id] = job
        self.on_persist(job)
        self._arm_flush()

    def step_ended(self, job_id: str, step: dict[str, Any]) -> None:
        """Write a srun step that ended (one row: its job's record is not written again)."""
        self._steps.append((job_id, step))
        self._arm_flush()

    def step_changed(self, step_id: str, job_id: str, record: Callable[[], dict[str, Any]]) -> None:
        """Write a running job's step as `record()` says at the flush."""
        self._live[step_id] = (job_id, record)
        self._arm_flush()

    def steps_forgotten(self, job_id: str) -> None:
        """The job's steps are forgotten (it ended): so are their rows."""
        self._live = {k: v for k, v in self._live.items() if v[0] != job_id}
        self._steps_gone.append(job_id)
        self._arm_flush()

    def pending_steps(self, job_id: str) -> list[dict[str, Any]]:
        """The job's steps that ended and are not written yet."""
        rows = [row for batch in self._writing for row in batch.steps] + self._steps
        return [step for owner, step in rows if owner == job_id]

    def usage_changed(self) -> None:
        self._usage_dirty = True
        self._arm_flush()

    def send(self, link: AgentLink, message: BaseModel) -> None:
        """Send to an agent after the state that led to it is on disk."""
        self._outbox.append((link, message))
        self._arm_flush()

    def pending(self, job_id: str) -> Job | None:
        """A job whose change is not written yet."""
        job = self._dirty.get(job_id)
        if job is None:
            for batch in reversed(self._writing):
                if (job := batch.jobs.get(job_id)) is not None:
                    break
        return job

    def pending_jobs(self) -> Iterable[Job]:
        found: dict[str, Job] = {}
        for batch in self._writing:
            found.update(batch.jobs)
        found.update(self._dirty)
        return found.values()

    def _arm_flush(self) -> None:
        if not self._flush_armed:
            self._flush_armed = True
            self.timers.call_soon(self.flush)

    def flush(
        self, event: Event | None = None, detail: str | None = None, wait: bool = False
    ) -> None:
        """Write every changed job in one transaction (with `event` for the audit log, if
        given), then send what waited on it.  Without `event` or `wait`, while a batch is
        being written, the changes wait for it (they go in the next one); with either,
        this one is written after it and waited for.  A user's change (`event`) made while
        a keyed request is answered is held for its answer (state/keyhold.py)."""
        hold = HELD.get()
        if event is not None and hold is not None and hold.open:
            earlier, hold.change = hold.change, (event, detail)
            if earlier is None:
                return  # written with the answer (flush_answer)
            event, detail = earlier  # a second change: the first is written now
        self._flush_armed = False
        wait = wait or event is not None
        if not wait and self._writing:
            return  # group commit: armed again once the batch in flight is written
        batch = Batch(
            self._dirty, self._steps, self._outbox, self._usage_dirty, self._live, self._steps_gone
        )
        batch.answers = self._answers
        self._dirty, self._steps, self._outbox, self._usage_dirty = {}, [], [], False
        self._live, self._steps_gone, self._answers = {}, [], []
        written = batch.jobs or batch.steps or batch.live or batch.gone or batch.answers
        if not (written or batch.usage or event):
            if self._writing:  # messages only: after the writes before them
                self._writing[-1].outbox += batch.outbox
            else:
                self._send(batch.outbox)
            return
        self._writing.append(batch)
        if running_loop() is not None and not wait:  # the batch is written once the output is
            self.outputs_stored(lambda: self._write(batch, event, detail, wait), True, False)
            return
        stored = threading.Event()
        self.outputs_stored(stored.set, True, True)
        if not stored.wait(OUTPUT_WAIT):
            log.warning("ended jobs' output not stored yet: their end is written first")
        for before in list(self._writing):  # batches still waiting for output go first
            if before is not batch:
                self._write(before, None, None, False)
        self._write(batch, event, detail, wait)

    def _write(self, batch: Batch, event: Event | None, detail: str | None, wait: bool) -> None:
        """Hand the batch (in `_writing`) to the store; what waits on it follows its write."""
        if batch.done or batch.handed:
            return  # given already, or put back meanwhile (a batch before it failed)
        batch.handed = True
        # The usage ledger goes in the jobs' transaction: one commit per flush.
        usage = ("usage", self.usage.dumps()) if batch.usage else None
        live = [(step_id, job, record()) for step_id, (job, record) in batch.live.items()]
        try:
            later = self.store.save_jobs_later(
                list(batch.jobs.values()),
                event,
                detail,
                usage,
                ended_steps=batch.steps,
                live_steps=live,
                gone_steps=batch.gone,
                answers=batch.answers,
            )
        except StoreUnavailable as e:  # refused before it was given (the queue is full)
            self._written(batch, e)
            if wait:
                raise
            return
        if running_loop() is not None and not wait:
            later.then(lambda error: self._written(batch, error))
            return
        error: BaseException | None = None
        try:  # a user's change, or no event loop: the caller goes on once it is written
            later.wait(self.store.answer_within if running_loop() is not None else None)
        except StoreUnavailable as e:
            if not later.future.done():  # still being written: followed up then
                later.then(lambda error: self._written(batch, error))
                raise
            error = e
        except BaseException as e:
            error = e
        self._written(batch, error)
        if error is not None:
            raise error

    def _written(self, batch: Batch, error: BaseException | None) -> None:
        """The batch's write is over: send what waited on it, or (the database could not
        be reached) put it back ahead of what came since, to be written again."""
        if batch.done:
            return
        batch.done = True
        if batch in self._writing:
            self._writing.remove(batch)
        if error is None:
            self._send(batch.outbox)
        elif isinstance(error, StoreUnavailable):
            log.warning(
                "writing %d job change(s) failed (%s): trying again", len(batch.jobs), error
            )
            self._dirty = {**batch.jobs, **self._dirty}  # a newer change wins
            self._steps = batch.steps + self._steps
            self._live = {**batch.live, **self._live}  # a newer record wins
            self._steps_gone = batch.gone + self._steps_gone
            self._answers = batch.answers + self._answers
            self._outbox = batch.outbox + self._outbox
            self._usage_dirty |= batch.usage
            self._retry_later()
            return
        else:  # Fenced (this master steps down), or a bug: nothing of it is sent
            raise error
        pending = self._dirty or self._steps or self._live or self._steps_gone or self._answers
        if pending or self._outbox or self._usage_dirty:
            self._arm_flush()

    def _retry_later(self) -> None:
        if self._retry_armed:
            return
        self._retry_armed = True

        def retry() -> None:
            self._retry_armed = False
            self._arm_flush()

        self.timers.call_later(RETRY_S, retry)

    def _send(self, outbox: list[tuple[AgentLink, BaseModel]]) -> None:
        for link, message in outbox:
            try:
                link.send(message)
            except Unsendable as e:  # this message only: the rest of the batch goes out
                self.on_unsendable(link.node_id, message, str(e))

    def flush_answer(self, hold: KeyHold, answer: str | None) -> None:
        """The keyed request's held change and its `answer` (None: not kept, a master's
        failure) written in one transaction with what else is pending, and waited for; a
        change after this is written at once."""
        hold.open = False
        if answer is not None:
            self._answers.append((hold.user, hold.key, answer))
        event, detail = hold.change if hold.change is not None else (None, None)
        self.flush(event, detail, wait=True)

    def flush_all(self) -> None:
        """Everything to disk now (shutdown): written after what is being written, and
        waited for."""
        self.flush(wait=True)
