"""Group commit for submits: the jobs submitted in one event-loop turn, written in one
transaction.

A submit is answered only once its job is on disk, and a commit costs far more than the
row (SQLite writes every page the transaction touched: the table's, three indexes', the
audit log's).  Clients that submit concurrently have their requests handled in the same
turn, so their jobs share one commit: `write` queues a submit's jobs and its audit event,
the first one of a turn arms one `flush` at the end of the turn, and each submit goes on
when its jobs are written.  `then`, what makes the jobs known to the controller, runs in
the flush right after the commit, whatever becomes of the request that waits: a job on
disk is a job in memory.  If the write fails, every submit of the batch fails with it and
nothing of it is stored (one transaction).  Without a running loop (the controller tests
drive a submit by hand) the write happens at once, as a lone submit's always did.

The write goes to the store's thread (store/dbthread.py); the loop goes on meanwhile.  A
submit waits `answer_within` for it at most: past that (the database paused or cut) it is
answered StoreStalled (a 503: try again), and its jobs, if the write commits later, become
known then all the same (`then` runs at the commit, whoever waits).  The client's retry
with the same Idempotency-Key finds that job.  While the database does not answer, a new
submit is refused at once.

A batch whose write fails because one of its submits' keys is stored already (KeyTaken:
a submit sent again, control/submitkeys.py) is sorted out: each such submit gets
KeyTaken (its caller answers with the stored job), the others are written again.  If a
key is found stored with its own job, the batch's write had committed (a retry after a
lost answer): every submit of it is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from mgpu.master.runtime.loop import running_loop
from mgpu.master.store.base import KeyTaken, Store, StoreStalled
from mgpu.model import Job

__all__ = ["SubmitBatch"]

Keys = list[tuple[str, str]]
"""A submit's idempotency key with its first job's id (none, or one)."""
Event = tuple[str, str | None, str | None, str]
"""The submit's audit event: (kind, actor, address, target)."""
ArrayRow = tuple[Job, list[int], int | None, "Event", str | None]
"""An array's submit as `Store.save_array` takes it: template, indices, its %N cap, the
audit event, the idempotency key."""
Entry = tuple[list[Job], Event, Keys, Callable[[], None], "asyncio.Future[None]"]
"""A submit waiting for the turn's write: its jobs, event, key, what makes them known, and
the future it waits on."""


class SubmitBatch:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._batch: list[Entry] = []
        self.ids: set[str] = set()
        """Ids of jobs queued for the next write: taken, though not in the store yet."""

    async def write(
        self, jobs: list[Job], event: Event, then: Callable[[], None], key: str | None = None
    ) -> None:
        """Store `jobs` with `event` (this turn's batch, one transaction), then `then()`.
        `key`: the submit's idempotency key, stored with them for its first job."""
        keys = [] if key is None or not jobs else [(key, jobs[0].id)]
        loop = running_loop()
        if loop is None:
            self.store.save_jobs(jobs, event=event, keys=keys)
            then()
            return
        if not self.store.answering():
            raise StoreStalled()
        done: asyncio.Future[None] = loop.create_future()
        if not self._batch:
            loop.call_soon(self.flush)
        self._batch.append((jobs, event, keys, then, done))
        self.ids.update(job.id for job in jobs)
        within = self.store.answer_within  # past it: StoreStalled, the write goes on
        timer = None if within is None else loop.call_later(within, _stalled, done)
        try:
            await done  # not through wait_for and shield: each costs the loop a turn
        finally:
            if timer is not None:
                timer.cancel()

    async def write_array(
        self, row: ArrayRow, then: Callable[[], Awaitable[None]], undo: Callable[[], Any]
    ) -> None:
        """Store an array (one row, its own transaction), then `await then()`; `undo()` if
        the write fails.  Past `answer_within`, StoreStalled, and `then` runs at the commit
        all the same (as a submit's, above)."""
        if not self.store.answering():
            raise StoreStalled()
        later = self.store.save_array_later(*row)
        try:
            await later.result(self.store.answer_within)
        except StoreStalled:
            later.then(lambda error: _background(then() if error is None else _undone(undo)))
            raise
        except BaseException:
            undo()
            raise
        await then()

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        ids = {job.id for jobs, *_ in batch for job in jobs}
        try:
            later = self.store.save_jobs_later(
                [job for jobs, *_ in batch for job in jobs],
                events=[b[1] for b in batch],
                keys=[key for b in batch for key in b[2]],
                new_jobs=True,  # nothing else writes them before: beside the other writes
            )
        except Exception as e:
            self._written(batch, ids, e)
            return
        later.then(lambda error: self._written(batch, ids, error))

    def _written(self, batch: list[Entry], ids: set[str], error: BaseException | None) -> None:
        self.ids -= ids
        if isinstance(error, KeyTaken):
            try:
                if not self._sort_out(batch):
                    return  # each submit answered, or in the next batch
                error = None
            except Exception as e:  # the lookups failed too: every submit of it fails
                error = e
        if error is not None:
            for *_, done in batch:
                if not done.done():
                    done.set_exception(error)
                    done.exception()  # retrieved: its submit may have stopped waiting
            return
        for *_, then, done in batch:
            try:
                then()
            except Exception as e:  # this submit's bug: the others of the batch go on
                if not done.done():
                    done.set_exception(e)
                    done.exception()
                continue
            if not done.done():
                done.set_result(None)

    def _sort_out(self, batch: list[Entry]) -> bool:
        """After KeyTaken: True if the batch had committed after all; else each submit
        whose key is taken fails with KeyTaken, the others go in the next batch."""
        keyed = [(entry, entry[0][0].user, entry[2][0]) for entry in batch if entry[2]]
        stored = {
            (user, key): self.store.job_of_submit_key(key, user) for _, user, (key, _) in keyed
        }  # a key is its user's (submitkeys.py)
        if any(stored[user, key] == own for _, user, (key, own) in keyed):
            return True  # its own job: the transaction committed, its answer was lost
        again: list[Entry] = []
        for entry in batch:
            done, keys = entry[4], entry[2]
            if keys and stored[entry[0][0].user, keys[0][0]] is not None:
                if not done.done():
                    done.set_exception(KeyTaken(keys[0][0]))
                    done.exception()
            else:
                again.append(entry)
        if again:
            if not self._batch:
                asyncio.get_running_loop().call_soon(self.flush)
            self._batch += again
            self.ids.update(job.id for jobs, *_ in again for job in jobs)
        return False


def _stalled(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_exception(StoreStalled())


async def _undone(undo: Callable[[], Any]) -> None:
    undo()


_tasks: set[asyncio.Task[None]] = set()
"""What runs after a late commit (held: the loop keeps weak references only)."""


def _background(work: Awaitable[None]) -> None:
    async def run() -> None:
        await work

    task = asyncio.get_running_loop().create_task(run())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
