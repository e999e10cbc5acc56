"""Reading a job's output from PostgreSQL (store/pgoutputs.py): stored rows, a page at a
time, then the records still in the leader's buffer."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol

from mgpu.master.store.outputs import CHUNK, OutputReader


class Rows(Protocol):
    """What a reader needs of the store (PgOutputStore)."""

    def buffered(self, job_id: str, pos: int, limit: int, end: int | None) -> list[str] | None:
        """Buffered records from `pos`; [] at the end; None: they are in the table."""

    def page(self, job_id: str, pos: int, end: int | None) -> list[str]:
        """Stored records from `pos` on, a page at most."""

    def left_at(self, job_id: str) -> int:
        """A stamp that changes when the job enters or leaves the store's memory."""

    def stored_count(self, job_id: str) -> int | None:
        """Records stored for good of a job in memory (None: not in memory, all stored)."""


class PgOutputReader(OutputReader):
    """Stored rows from record `start` on, a page at a time, then the master's buffer.

    Rows reach the table only from this master's buffers (one leader writes), and a job
    leaves memory only once its rows are stored: so a job whose rows were read to their end
    and which has neither entered nor left memory since has nothing new.  That end is
    found without the database, with no await before the return, as the file reader
    finds it (a follower then looks whether the job ended)."""

    _DB = b"db"  # what _local returns when the next records are in the database

    def __init__(self, store: Rows, job_id: str, start: int, end: int | None) -> None:
        self.store = store
        self.job_id = job_id
        self._pos = start
        self._end = end
        self._rows: deque[str] = deque()
        self._read_out: tuple[int, int] | None = None
        """(position, the job's stamp: store.left_at) when the table had nothing more."""

    def _local(self, limit: int) -> bytes | None:
        """Records from fetched rows or the buffer; None at the end; _DB: fetch rows."""
        if self._end is not None and self._pos >= self._end:
            return None
        lines: list[str] = []
        if self._rows:
            size = 0
            while self._rows and (not lines or size + len(self._rows[0]) < limit):
                lines.append(self._rows.popleft())
                size += len(lines[-1]) + 1
        else:
            buffered = self.store.buffered(self.job_id, self._pos, limit, self._end)
            if buffered is None:
                if self._read_out == (self._pos, self.store.left_at(self.job_id)):
                    return None  # read to the table's end, and nothing stored since
                return self._DB
            lines = buffered
            if not lines:
                return None
        self._pos += len(lines)
        return ("\n".join(lines) + "\n").encode()

    def _fetch(self, stamp: int) -> None:
        """A page of rows from the database (`stamp`: the job's, taken before)."""
        rows = self.store.page(self.job_id, self._pos, self._end)
        self._rows.extend(rows)
        if not rows:
            self._read_out = (self._pos, stamp)

    def step(self, limit: int = CHUNK) -> bytes | None:
        while (got := self._local(limit)) is self._DB:
            self._fetch(self.store.left_at(self.job_id))
        return got

    async def chunks(self) -> AsyncIterator[bytes]:
        """As OutputReader's, pages of rows read in a worker thread."""
        while True:
            got = self._local(CHUNK)
            if got is self._DB:
                await asyncio.to_thread(self._fetch, self.store.left_at(self.job_id))
                continue
            if got is None:
                return
            yield got

    def stored(self) -> int:
        """Where this reader stands, or below it the records not yet stored: a leader's
        follower is sent them from its memory, and a master that dies before storing them
        loses them (the agent sends that output again to the next, cut into other records)."""
        stored = self.store.stored_count(self.job_id)
        return self._pos if stored is None else min(self._pos, stored)

    def close(self) -> None:
        self._rows.clear()
