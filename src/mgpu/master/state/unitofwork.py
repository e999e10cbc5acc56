"""Group commit: the jobs changed in one event-loop turn, written in one transaction, and
the agent messages that wait on them, sent only after.

A change marks its job dirty (`persist`); the first one of a turn arms one `flush` at the
end of the turn.  Messages to agents go to the outbox (`send`) and leave in `flush`, after
the write: an agent never hears of a state the master could lose in a crash.  Until a
job's change is written, queries find it here (`pending`): a job that has just ended is in
no other place for that moment.  A srun step that ended is a row of its own
(`step_ended`), written in the same flush without rewriting its job (store/steps.py);
so are the running jobs' steps as they change (`step_changed`: control/livesteps.py), before
the launch or the agent's `Forget` that follows from the change is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel

from mgpu.master.runtime.clock import Timers
from mgpu.master.state.registry import AgentLink, Unsendable
from mgpu.master.store.base import Store
from mgpu.master.store.steps import StepRow
from mgpu.model import Job
from mgpu.scheduler import UsageLedger

log = logging.getLogger("mgpu.master")

__all__ = ["UnitOfWork"]

Event = tuple[str, str | None, str | None, str]
"""An audit event written with the jobs: (kind, actor, address, target)."""


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
        self._outbox: list[tuple[AgentLink, BaseModel]] = []
        self._usage_dirty = False
        self._flush_armed = False
        self.on_unsendable: Callable[[str, BaseModel, str], None] = lambda n, m, why: None
        """Told of a message that could not be encoded (node id, message, why)."""
        self.on_persist: Callable[[Job], None] = lambda job: None
        """Told of every change (the scheduler's running-job index: master/state/runindex.py)."""

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
        return [step for owner, step in self._steps if owner == job_id]

    def usage_changed(self) -> None:
        self._usage_dirty = True
        self._arm_flush()

    def send(self, link: AgentLink, message: BaseModel) -> None:
        """Send to an agent after the state that led to it is on disk."""
        self._outbox.append((link, message))
        self._arm_flush()

    def pending(self, job_id: str) -> Job | None:
        """A job whose change is not written yet."""
        return self._dirty.get(job_id)

    def pending_jobs(self) -> Iterable[Job]:
        return self._dirty.values()

    def _arm_flush(self) -> None:
        if not self._flush_armed:
            self._flush_armed = True
            self.timers.call_soon(self.flush)

    def flush(self, event: Event | None = None, detail: str | None = None) -> None:
        """Write every changed job in one transaction (with `event` for the audit log, if
        given), then send what waited on it."""
        self._flush_armed = False
        # The usage ledger goes in the jobs' transaction: one commit per flush.
        usage = ("usage", self.usage.dumps()) if self._usage_dirty else None
        if self._dirty or event is not None or usage is not None:
            jobs = list(self._dirty.values())
            self.store.save_jobs(jobs, event=event, detail=detail, meta=usage)
            self._dirty.clear()  # after the write: queries find them here until it is done
            self._usage_dirty = False
        if self._steps or self._live or self._steps_gone:
            live = [(step_id, job, record()) for step_id, (job, record) in self._live.items()]
            self.store.save_steps(self._steps, live=live, gone=self._steps_gone)
            self._steps, self._live, self._steps_gone = [], {}, []
        outbox, self._outbox = self._outbox, []
        for link, message in outbox:
            try:
                link.send(message)
            except Unsendable as e:  # this message only: the rest of the batch goes out
                self.on_unsendable(link.node_id, message, str(e))

    def flush_all(self) -> None:
        """Everything to disk now (shutdown)."""
        self.flush()
