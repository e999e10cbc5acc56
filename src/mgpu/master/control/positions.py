"""Queued jobs' places in the queue, for the followers of queued jobs (`logs -f`).

A job's place is one more than the queued jobs submitted before it: counting it walks the
whole queue.  Counted per follower per second, 30 followers of a job behind 100,000 tasks
held a core (issue 25 item 7).  So one walk counts every queued job at once, a slice of
the queue per turn of the loop (`bulk_turn`), and its table is shared by every follower
until it is `MAX_AGE` seconds old; a walk runs only while someone asks, and `moved` is set
when a new table is ready, so followers wake then rather than poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from itertools import islice

from mgpu.master.runtime.loop import running_loop
from mgpu.master.runtime.turns import bulk_turn
from mgpu.model import Job, JobState

__all__ = ["MAX_AGE", "QueuePositions", "count_positions"]

MAX_AGE = 5.0
"""Seconds a table of positions is shown before a new walk is started (on the next ask)."""
SLICE = 5_000
"""Jobs looked at per turn of the loop."""


def count_positions(jobs: Iterable[Job], start: int = 0, into: dict[str, int] | None = None) -> int:
    """Number each queued job of `jobs` (in their order) from `start` + 1 into `into`;
    the last number given."""
    queued = JobState.QUEUED
    n = start
    table = into if into is not None else {}
    for job in jobs:
        if job.state is queued:
            n += 1
            table[job.id] = n
    return n


class QueuePositions:
    """The last walk's positions of the queued jobs of `jobs` (submit order)."""

    def __init__(self, jobs: Mapping[str, Job]) -> None:
        self._jobs = jobs
        self._table: dict[str, int] = {}
        self._made_at = -MAX_AGE - 1.0
        self._walk: asyncio.Task[None] | None = None
        self.moved = asyncio.Event()
        """Set when a new table is ready (then made anew)."""
        self.walks = 0

    def of(self, job_id: str, now: float) -> int | None:
        """Queued `job_id`'s place as last counted (None: not counted yet); a walk is
        started when the table is older than `MAX_AGE` at `now` (monotonic seconds), or
        does not hold the job (queued since: one walk at a time, so at most one more)."""
        place = self._table.get(job_id)
        stale = now - self._made_at > MAX_AGE or place is None
        if stale and self._walk is None:
            self._made_at = now
            loop = running_loop()
            if loop is None:  # no loop (tests/controller): count now
                self._swap(self._count_now())
            else:
                self._walk = loop.create_task(self.walk())
            place = self._table.get(job_id)
        return place

    def _count_now(self) -> dict[str, int]:
        table: dict[str, int] = {}
        count_positions(self._jobs.values(), 0, table)
        return table

    async def walk(self) -> None:
        """Count every queued job, a slice a turn (a copy of the order: the queue may
        change between slices; a job submitted meanwhile is counted at the next walk)."""
        try:
            jobs = list(self._jobs.values())
            table: dict[str, int] = {}
            n = 0
            it = iter(jobs)
            for _ in range(0, len(jobs), SLICE):
                n = count_positions(islice(it, SLICE), n, table)
                await bulk_turn()
            self._swap(table)
        finally:
            self._walk = None

    def _swap(self, table: dict[str, int]) -> None:
        self._table = table
        self.walks += 1
        moved, self.moved = self.moved, asyncio.Event()
        moved.set()
