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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mgpu.master.store.base import Store
from mgpu.model import Job

__all__ = ["SubmitBatch"]

Keys = list[tuple[str, str]]
"""A submit's idempotency key with its first job's id (none, or one)."""
Event = tuple[str, str | None, str | None, str]
"""The submit's audit event: (kind, actor, address, target)."""
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
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.store.save_jobs(jobs, event=event, keys=keys)
            then()
            return
        done: asyncio.Future[None] = loop.create_future()
        if not self._batch:
            loop.call_soon(self.flush)
        self._batch.append((jobs, event, keys, then, done))
        self.ids.update(job.id for job in jobs)
        await done

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            self.store.save_jobs(
                [job for jobs, *_ in batch for job in jobs],
                events=[b[1] for b in batch],
                keys=[key for b in batch for key in b[2]],
            )
        except Exception as e:
            for *_, done in batch:
                if not done.done():
                    done.set_exception(e)
            return
        finally:
            self.ids.clear()
        for *_, then, done in batch:
            try:
                then()
            except Exception as e:  # this submit's bug: the others of the batch go on
                if not done.done():
                    done.set_exception(e)
                continue
            if not done.done():
                done.set_result(None)
