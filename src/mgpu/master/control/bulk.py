"""Work on many jobs in one request, in one place: an array's tasks built at submit and told
to the scheduling loop, and a job or every task of an array cancelled, held, released,
requeued or updated.

One slicing policy for all of it (`Pacer`): the work goes a slice of `SLICE` items at a
time; once `BUDGET` seconds have passed since the loop was last free (the write of what is
pending included, its cost estimated from the last write), what is pending is written in
one transaction (the request's one audit event with the first) and the loop is let go
(`bulk_turn`) before the next slice.  A request of 100,000 tasks holds the loop a few
milliseconds at a time and writes as few transactions as that allows.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from mgpu.master.control.jobctl import Actor, Change, NotAllowed
from mgpu.master.control.nodes import Conflict, NotFound
from mgpu.master.runtime.turns import bulk_turn
from mgpu.master.store import arrays
from mgpu.model import Job
from mgpu.spec import may_be_array_id

__all__ = [
    "BUDGET",
    "SLICE",
    "Bulk",
    "Cancelled",
    "Pacer",
    "build_tasks",
    "in_slices",
]

SLICE = 50
"""Items handled between two looks at the clock."""
BUDGET = 0.02
"""Seconds of bulk work per turn of the event loop, the write of its changes included."""
FIRST_WRITE_COST = 30e-6
"""Seconds per changed job a write takes, guessed until one has been timed."""

T = TypeVar("T")
Event = tuple[str, str | None, str | None, str]
"""(kind, actor, address, target): an audit event written with a transaction."""


def slices(items: Sequence[T], size: int = SLICE) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Pacer:
    """The slicing policy: call `done(n)` after each slice of work (n items changed, not
    written yet); it writes and lets the loop go once the budget is spent (or, with
    `most`, once that many items have been handled since the loop was last free).
    `finish()` writes what is left (once at least: the request's audit event)."""

    def __init__(self, write: Callable[[], None] | None = None, most: int | None = None) -> None:
        self._write = write
        self._most = most
        self._pending = 0
        self._handled = 0
        self._write_cost = FIRST_WRITE_COST if write is not None else 0.0
        self._written = False
        self._started = time.monotonic()

    async def done(self, items: int) -> None:
        self._pending += items
        self._handled += items
        spent = time.monotonic() - self._started + self._pending * self._write_cost
        if spent < BUDGET and (self._most is None or self._handled < self._most):
            return
        self.finish()
        await bulk_turn()
        self._handled = 0
        self._started = time.monotonic()

    def finish(self) -> None:
        if self._write is not None and (self._pending or not self._written):
            written = time.monotonic()
            self._write()
            self._write_cost = (time.monotonic() - written) / max(self._pending, 1)
            self._written = True
        self._pending = 0


async def build_tasks(
    template: Job,
    indices: Sequence[int],
    cap: int | None,
    built: Callable[[list[Job]], None],
) -> list[Job]:
    """An array's tasks, built a slice at a time with the loop free between; `built` sees
    each slice (the scheduling loop builds their requests then, not all in its next pass)."""
    out: list[Job] = []
    common = arrays.common_fields(template)
    pacer = Pacer()
    for part in slices(indices):
        tasks = [arrays.task(common, template.id, k, cap) for k in part]
        built(tasks)
        out += tasks
        await pacer.done(len(tasks))
    return out


async def in_slices(items: Sequence[T], each: Callable[[Sequence[T]], None], most: int) -> None:
    """`each` on every slice of `items`, the loop let go at most every `most` items (work
    whose cost comes later, as the scheduling loop's look at jobs just queued)."""
    pacer = Pacer(most=most)
    for part in slices(items):
        each(part)
        await pacer.done(len(part))


@dataclass(frozen=True, slots=True)
class Cancelled:
    cancelled: tuple[str, ...]
    already_ended: tuple[str, ...]
    array: bool = False


class Jobs(Protocol):
    """What bulk work reads and changes of the controller (control/cluster.py)."""

    def get_job(self, job_id: str) -> Job | None: ...

    def active_tasks(self, array_id: str) -> list[Job]: ...

    def array_tasks(self, array_id: str) -> list[Job]: ...

    def array_pages(self, array_id: str, size: int) -> Iterator[list[tuple[str, str, str]]]: ...

    def cancel(self, job: Job, actor: str | None = None, address: str | None = None) -> bool: ...

    def cancel_tasks(
        self, rows: list[tuple[str, str]], actor: str | None
    ) -> tuple[list[str], list[str]]: ...

    def commit(self, event: Event | None, detail: str | None = None) -> None: ...


Action = Callable[[Job, Actor], Awaitable[Change]]
"""One job-control action on one job (control/jobctl.py)."""
Check = Callable[[Job, Actor], None]
"""Whether the asker may do the action on a job: NotAllowed if not, changing nothing."""


class _Writer:
    """Writes an array's changes, the request's audit event with the first write."""

    def __init__(self, jobs: Jobs, event: Event, detail: Callable[[], str]) -> None:
        self.jobs = jobs
        self.event: Event | None = event
        self.detail = detail

    def __call__(self) -> None:
        self.jobs.commit(self.event, f"every task of the array {self.detail()}".strip())
        self.event = None


class Bulk:
    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs

    async def cancel(self, job_id: str, actor: Actor) -> Cancelled:
        """Cancel a job, or every task of an array (its owner's or an admin's)."""
        job = self.jobs.get_job(job_id)
        if job is not None:
            actor.owns(job, "cancel")
            if self.jobs.cancel(job, actor=actor.user, address=actor.address):
                return Cancelled((job.id,), ())
            return Cancelled((), (job.id,))
        if not may_be_array_id(job_id):
            raise NotFound(job_id)
        # Pages of ids as tuples: the collector stops tracking a tuple of strings, where it
        # would walk a list of 100,000 ids in every full collection while this runs.
        cancelled: list[tuple[str, ...]] = []
        ended: list[tuple[str, ...]] = []
        event = ("cancel", actor.user, actor.address, job_id)
        pacer = Pacer(_Writer(self.jobs, event, lambda: ""))
        for rows in self.jobs.array_pages(job_id, SLICE):
            for task_id, _, user in rows:
                actor.check_owner(task_id, user, "cancel")
            done, gone = self.jobs.cancel_tasks([r[:2] for r in rows], actor.user)
            cancelled.append(tuple(done))
            ended.append(tuple(gone))
            await pacer.done(len(done))
        if not cancelled:
            raise NotFound(job_id)
        pacer.finish()
        return Cancelled(_by_task(cancelled), _by_task(ended), array=True)

    async def control(
        self, job_id: str, verb: str, actor: Actor, action: Action, check: Check
    ) -> list[Change]:
        """`action` on a job, or on every queued or running task of an array: on each a
        Change; a task it cannot change is a Change that says why (a job alone: Conflict).
        All or nothing: `check` is passed by every task before any is changed, so a task
        the asker may not change refuses the whole request (one NotAllowed, audited once
        by the edge), never after the others changed."""
        job = self.jobs.get_job(job_id)
        tasks = self.jobs.active_tasks(job_id) if job is None and may_be_array_id(job_id) else []
        if job is None and not tasks:
            if job_id and self.jobs.array_tasks(job_id):
                raise Conflict(f"array {job_id} has no queued or running task to {verb}")
            raise NotFound(job_id)
        try:
            if job is not None:
                return [await action(actor.owns(job, verb), actor)]
            for part in slices(tasks):
                for task in part:
                    check(task, actor)
                await bulk_turn()
            return await self._each_task(job_id, tasks, verb, replace(actor, audit=False), action)
        except NotAllowed as e:
            e.target = e.target or f"{verb} {job_id}"
            raise

    async def _each_task(
        self, array_id: str, tasks: list[Job], verb: str, actor: Actor, action: Action
    ) -> list[Change]:
        done: list[Change] = []

        def detail() -> str:
            return next((c.detail for c in done if c.detail), "")

        pacer = Pacer(_Writer(self.jobs, (verb, actor.user, actor.address, array_id), detail))
        for part in slices(tasks):
            for task in part:
                try:
                    done.append(await action(task, actor))
                except Conflict as e:
                    done.append(Change(task.id, False, str(e)))
            await pacer.done(len(part))
        pacer.finish()
        return done


def _by_task(pages: list[tuple[str, ...]]) -> tuple[str, ...]:
    """Array task ids in index order: the store pages them in text order, which within one
    length is index order, so a stable sort by length is all it takes (and is quick)."""
    return tuple(sorted((i for page in pages for i in page), key=len))
