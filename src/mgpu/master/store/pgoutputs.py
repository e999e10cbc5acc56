"""Job output in PostgreSQL: every job's output readable from any master after a failover.

The records, their order, the caps and the runs' resume points are the file store's
(store/outputs.py); the tables are in store/outputtables.py: one row per record, each
job's size, and each run's stored offsets (the resume point a new leader gives agents).

Appends come on the event loop, thousands a second from a chatty job, so none waits on
the database: a record takes its number and goes into its job's in-memory buffer, and a
flusher thread writes every buffer in one transaction every FLUSH_INTERVAL (sooner past
FLUSH_RECORDS), then drops what it wrote from memory.  A reader takes stored rows below
the buffer, then the buffer itself: followers on this master see a record when it is
appended.  A master that dies loses its buffer, but the resume point in job_output_run is
written in the same transaction as the rows, so it is behind what was lost and the agent
re-sends that to the next leader; the agent forgets a run only after `when_stored`.

The event loop never waits on the database here.  A job's stored size (a requeued job's
earlier runs, or another leader's) is looked up by the flusher before it writes the job's
first records: until then the job's counts are this master's alone, and a reader of it
reads the stored rows (a chatty job whose earlier runs reached the cap may pass it by
what it prints meanwhile, FLUSH_INTERVAL's worth).  A job that ends has its last records
written by the flusher at once (`close` wakes it; FLUSH_GAP after the flush before at the
soonest, so that jobs ending together share one); the controller orders the job's end
after them (`when_stored` with the job: state/unitofwork.py), so a master killed between
the two has the records, not an end without them.

Every write transaction checks the fence first (store/fence.py): a deposed master's flush
gets Fenced and the store writes nothing more.  A lost connection is reconnected and the
write retried for RETRY_FOR seconds (then again at the next flush): rows go in with ON
CONFLICT DO NOTHING and sizes as values, not increments, so a commit whose answer was lost
may be written again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from mgpu.master.runtime.loop import running_loop
from mgpu.master.store.base import StoreStalled
from mgpu.master.store.fence import Fence, Fenced
from mgpu.master.store.outputs import (
    ALL_SENT,
    FileOutputStore,
    OutputReader,
    OutputStore,
    is_marker,
)
from mgpu.master.store.outputtables import (
    Run,
    create_output_tables,
    write_rows,
)
from mgpu.master.store.pglink import Link, params
from mgpu.master.store.pgreader import PgOutputReader

log = logging.getLogger("mgpu.master")

T = TypeVar("T")

FLUSH_INTERVAL = 0.05
"""Seconds between flushes: how long a record may wait in memory."""
FLUSH_RECORDS = 2000
"""Buffered records that start a flush before the interval is up."""
FLUSH_GAP = 0.01
"""Seconds from one flush to the next at least.  Each job that ends wakes the flusher
(its end is written after its output): jobs ending a few ms apart then share a flush, one
transaction and one WAL flush for all, instead of one each (the jobs' ends, which wait on
it, are written together too).  Their ends wait this much longer at most, and only while
flushes follow each other this closely."""
BATCH_ROWS = 20000
"""Rows one transaction writes at most (a buffer grown during an outage goes in parts)."""
PAGE = 256
"""Rows a reader fetches per query: its memory, whatever the job's size."""
LEFT_KEPT = 10000
"""Departures from memory remembered (older ones: readers of those jobs ask again)."""
RETRY_FOR = 10.0
"""Seconds a write retries a lost connection before it gives up (until the next flush)."""
OPEN_WAIT = 0.5
"""Seconds a first append or a close off the event loop (tests, tools) waits for the
database (then the flusher does it)."""


@dataclass(eq=False)
class _Job:
    """A job this master appended to: the stored part's size and the buffer past it."""

    stored: int
    """Records in the database (numbers below this)."""
    stored_bytes: int
    records: int
    """Records in all, buffered ones included (the next record's number)."""
    bytes: int
    marked: bool
    full: bool
    owner: str | None = None
    open: bool = True
    """Between an append and close(): the job stays in memory while open or buffered."""
    buf: list[tuple[str, Run | None, int]] = field(default_factory=list)
    """Records `stored`.. not yet written: line (no newline), its run's stream and offset."""
    resolved: bool = True
    """False while the stored size is unknown (a first append on the event loop, or while
    the database was away): counts are then this master's alone, and readers wait for
    the flusher to find it."""
    node_id: str = ""
    """The node of the first append here (a marker the flusher finds due names it)."""
    appended: int = 0
    written: int = 0
    """Records appended by this master, and how many of them are written (when_stored)."""


@dataclass
class _Batch:
    rows: list[tuple[str, int, str]]
    sizes: list[tuple[str, int, int, bool]]
    runs: list[tuple[str, int, str, str, int]]
    taken: dict[str, int]
    """Records written of each job (its buffer's first ones)."""


class PgOutputStore(OutputStore):
    """Job output in PostgreSQL (see the module docstring)."""

    def __init__(self, url: str, fence: Fence, link: Link | None = None) -> None:
        super().__init__()
        self.url = url
        self.fence = fence
        self.link = (link or Link()).named("output")
        """How its connections are opened (the master's tag and keepalives: store/pglink.py)."""
        self._jobs: dict[str, _Job] = {}
        self._dirty: set[str] = set()
        """Jobs with buffered records."""
        self._lock = threading.Lock()
        """Guards _jobs and their buffers: the loop appends, the flusher trims."""
        self._write_lock = threading.Lock()
        """One writer at a time on the write connection (a flush, a delete)."""
        self._conns: dict[str, psycopg.Connection[Any]] = {}
        self._conn_lock = threading.Lock()
        self._stamp = 0
        self._left: dict[str, int] = {}
        """When recent jobs left memory (a stamp counting departures): a reader that
        found a job's rows at their end reads again only if the job left since."""
        self._pruned = 0
        """The last stamp dropped from _left (the stamp of every job not in it)."""
        self._waiting: list[
            tuple[list[tuple[str, _Job, int]], asyncio.AbstractEventLoop | None, Callable[[], None]]
        ]
        self._waiting = []
        """when_stored's callbacks: the records each waits for (job, appended), its loop."""
        self._unresolved: set[str] = set()
        """Jobs whose stored size is not known yet (see _Job.resolved)."""
        self._fresh: dict[str, None] = {}
        """Jobs whose first run this master started: nothing stored to look up (`fresh`)."""
        self.fenced = False
        """Set once a write was fenced: this master no longer leads and stores nothing more."""
        self._retry(create_output_tables, "write")
        self._kick = threading.Event()
        self._stopping = False
        self._flusher = threading.Thread(target=self._run, name="mgpu-output-flush", daemon=True)
        self._flusher.start()

    # ---- connections -----------------------------------------------------

    def _conn(self, which: str) -> psycopg.Connection[Any]:
        with self._conn_lock:
            conn = self._conns.get(which)
            if conn is None or conn.closed:
                conn = self._conns[which] = psycopg.connect(
                    **params(self.url, self.link, connect_timeout=5), autocommit=True
                )
            return conn

    def _retry(
        self,
        work: Callable[[psycopg.Connection[Any]], T],
        which: str = "read",
        wait: float = RETRY_FOR,
    ) -> T:
        """`work` on a connection, reconnecting after a lost one for `wait` seconds."""
        deadline = time.monotonic() + wait
        delay = 0.05
        while True:
            try:
                return work(self._conn(which))
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                with self._conn_lock:
                    conn = self._conns.pop(which, None)
                if conn is not None:
                    conn.close()
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("job output: database connection lost (%s); retrying", e)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    # ---- appends -----------------------------------------------------------

    def append(
        self,
        job_id: str,
        stream: str,
        data: str,
        node_id: str,
        epoch: int | None = None,
        end: int | None = None,
    ) -> None:
        if self.fenced:
            return  # deposed: the next leader has the agents now
        rec: dict[str, Any] = {"s": stream, "d": data, "n": node_id}
        run: Run | None = None
        if epoch is not None and end is not None:
            rec["ep"], rec["at"] = epoch, end  # where this run's stream stands, for restarts
            run = (epoch, node_id, stream)
        try:
            job = self._open(job_id, node_id)
        except Exception:
            self._have.pop(job_id, None)  # accept counted this chunk: not stored after all
            raise
        if job.full:
            return
        lines, full = self._bounded(job.bytes, rec, node_id, job.owner)
        with self._lock:
            for line in lines.rstrip(b"\n").split(b"\n"):  # the record (maybe cut), a marker
                self._add(job_id, job, line, run, end or 0)
            job.marked = full  # a full job's last line is its marker
            job.full = job.full or full
        self._wake(job_id)

    def _add(self, job_id: str, job: _Job, line: bytes, run: Run | None, at: int) -> None:
        """One record into the job's buffer (under the lock)."""
        if run is not None and not line.endswith(b',"at":%d}' % at):
            run = None  # a marker, not the record: no run offset
        job.buf.append((line.decode("ascii"), run, at))
        job.records += 1
        job.bytes += len(line) + 1
        job.appended += 1
        self._dirty.add(job_id)
        if len(job.buf) == FLUSH_RECORDS:
            self._kick.set()

    def _open(self, job_id: str, node_id: str) -> _Job:
        """The job's state, read from the database at its first append on this master (a
        job at the cap is full; a lowered cap's marker is added)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                if not job.open:  # a next run: full again only at the job's cap, as files
                    job.open = True
                    job.owner = self.owner(job_id)
                    job.full = self.cap is not None and job.bytes >= self.cap
                return job
            if job_id in self._fresh:  # its first run, started here: nothing stored
                del self._fresh[job_id]
                job = self._jobs[job_id] = _Job(0, 0, 0, 0, False, False, self.owner(job_id))
                self._moved(job_id)
                return job
        try:
            if running_loop() is not None:
                raise StoreStalled()  # the loop does not wait: the flusher finds the size
            records, size, marked = self._size(job_id, OPEN_WAIT)
        except (psycopg.OperationalError, psycopg.InterfaceError, StoreStalled) as e:
            # The flusher adds the stored size before it writes (module docstring).
            if not isinstance(e, StoreStalled):
                log.warning("job output: job %s's stored size unknown for now (%s)", job_id, e)
            owner = self.owner(job_id)
            job = _Job(0, 0, 0, 0, False, False, owner, resolved=False, node_id=node_id)
            with self._lock:
                self._jobs[job_id] = job
                self._moved(job_id)
                self._unresolved.add(job_id)
            return job
        full = self.cap is not None and size >= self.cap
        job = _Job(records, size, records, size, marked, full, self.owner(job_id))
        with self._lock:
            self._jobs[job_id] = job
            self._moved(job_id)
            if full and not marked:
                self._add(job_id, job, self._marker(node_id, True).rstrip(b"\n"), None, 0)
                job.marked = True
        return job

    def _size(self, job_id: str, wait: float = RETRY_FOR) -> tuple[int, int, bool]:
        """A job's stored records, bytes and whether its last one is a marker."""
        row = self._retry(
            lambda c: c.execute(
                "SELECT records, bytes, marked FROM job_output_size WHERE job_id = %s",
                (job_id,),
            ).fetchone(),
            wait=wait,
        )
        return (int(row[0]), int(row[1]), bool(row[2])) if row else (0, 0, False)

    def _resolve(self, wait: float, only: str | None = None) -> None:
        """Add the stored size to the counts of jobs first appended to on the event loop
        or while the database was away (in the flusher, before their records are numbered
        for good; or in a reader's thread, `only` its job): one query for all of them."""
        with self._lock:
            pending = [
                (job_id, self._jobs[job_id])
                for job_id in self._unresolved
                if only is None or job_id == only
            ]
        if not pending:
            return
        found = {
            job_id: (int(records), int(size), bool(marked))
            for job_id, records, size, marked in self._retry(
                lambda c: c.execute(
                    "SELECT job_id, records, bytes, marked FROM job_output_size "
                    "WHERE job_id = ANY(%s)",
                    ([job_id for job_id, _ in pending],),
                ).fetchall(),
                wait=wait,
            )
        }
        for job_id, job in pending:
            records, size, marked = found.get(job_id, (0, 0, False))
            with self._lock:
                if self._jobs.get(job_id) is not job or job.resolved:
                    continue  # deleted meanwhile
                job.stored, job.stored_bytes = records, size
                job.records += records
                job.bytes += size
                at_cap = self.cap is not None and size >= self.cap
                job.full = job.full or (self.cap is not None and job.bytes >= self.cap)
                job.resolved = True
                self._unresolved.discard(job_id)
                if at_cap and not marked and not job.marked:  # as _open would have
                    marker = self._marker(job.node_id, True).rstrip(b"\n")
                    self._add(job_id, job, marker, None, 0)
                    job.marked = True

    def fresh(self, job_id: str) -> None:
        with self._lock:
            self._fresh[job_id] = None
            if len(self._fresh) > LEFT_KEPT:  # jobs that print nothing: looked up, if ever
                for old in list(itertools.islice(self._fresh, LEFT_KEPT // 2)):
                    del self._fresh[old]

    def close(self, job_id: str) -> None:
        """The job ended: its last records are written now (FLUSH_GAP after the flush
        before at the latest), before its end is (the controller stores the end after
        them: `when_stored`): a master killed then
        has both, as with files, where the agent that forgot the run would not re-send
        them and a new leader would drop output of an ended run."""
        with self._lock:
            self._fresh.pop(job_id, None)
            job = self._jobs.get(job_id)
            if job is not None:
                job.open = False
                if not job.buf:
                    self._let_go(job_id)
        if job is not None and job.buf and not self.fenced:
            if running_loop() is None:  # tests, tools: written before this returns
                try:
                    self.flush(OPEN_WAIT)
                except Exception as e:  # the flusher tries again
                    log.warning("job output: job %s's last records not written yet: %s", job_id, e)
            else:
                self._kick.set()  # written now, by the flusher; the end waits (when_stored)
        self._have.pop(job_id, None)
        self._wake(job_id)

    def _let_go(self, job_id: str) -> None:
        """A closed job whose records are all stored leaves memory (under the lock)."""
        del self._jobs[job_id]
        self._moved(job_id)

    def _moved(self, job_id: str) -> None:
        """The job came into memory or left it (under the lock): a new stamp, so a reader
        that found the table read out before looks again (a new leader's follower may have
        read a job's rows before its agent re-sent the rest)."""
        self._stamp += 1
        self._left.pop(job_id, None)  # to the end: the oldest departures are dropped first
        self._left[job_id] = self._stamp
        if len(self._left) > LEFT_KEPT:
            for old in list(itertools.islice(self._left, LEFT_KEPT // 2)):
                self._pruned = max(self._pruned, self._left.pop(old))

    def left_at(self, job_id: str) -> int:
        """The job's last move into or out of memory, or a later stamp (store/pgreader.py)."""
        with self._lock:
            return self._left.get(job_id, self._pruned)

    def when_stored(
        self, then: Callable[[], None], ended: bool = False, in_thread: bool = False
    ) -> None:
        with self._lock:
            need = [
                (job_id, job, job.appended)
                for job_id in self._dirty
                if (job := self._jobs[job_id]) and not (ended and job.open)
            ]
            if need:
                self._waiting.append((need, None if in_thread else running_loop(), then))
                self._kick.set()
        if not need:
            then()

    def _stored(self) -> list[tuple[asyncio.AbstractEventLoop | None, Callable[[], None]]]:
        """The when_stored callbacks now due (under the lock): each job they waited for is
        stored that far, or deleted."""
        ready = []
        due, self._waiting = self._waiting, []
        for need, loop, then in due:
            # A job no longer in memory is all written (or deleted).
            if all(
                self._jobs.get(job_id) is not job or job.written >= n for job_id, job, n in need
            ):
                ready.append((loop, then))
            else:
                self._waiting.append((need, loop, then))
        return ready

    def _call(
        self, ready: list[tuple[asyncio.AbstractEventLoop | None, Callable[[], None]]]
    ) -> None:
        for loop, then in ready:
            if loop is None:
                then()
            elif not loop.is_closed():  # closed: the master is gone, and the agents' links
                loop.call_soon_threadsafe(then)

    # ---- the flusher -----------------------------------------------------

    def _run(self) -> None:
        last = 0.0
        while not self._stopping:
            self._kick.wait(FLUSH_INTERVAL)
            soon = FLUSH_GAP - (time.monotonic() - last)
            if soon > 0:  # woken right after a flush: what wakes it meanwhile comes along
                time.sleep(soon)
            self._kick.clear()
            last = time.monotonic()
            if self._stopping:
                return  # close_all writes the rest
            try:
                self.flush()
            except Fenced as e:
                log.error("job output: %s", e)
                with self._lock:  # nothing will be stored: what waits goes on (and is fenced)
                    due, self._waiting = self._waiting, []
                self._call([(loop, then) for _, loop, then in due])
                return
            except Exception:
                log.exception("job output: writing failed; retrying")
                time.sleep(1.0)

    def flush(self, wait: float = RETRY_FOR) -> int:
        """Write buffered records in one transaction (the flusher calls it every
        FLUSH_INTERVAL; close, tests and shutdown too); how many were written.  `wait`:
        for the writer before (0 if it does not come) and a lost connection."""
        if not self._write_lock.acquire(timeout=wait):
            return 0
        try:
            return self._flush(wait)
        finally:
            self._write_lock.release()

    def _flush(self, wait: float) -> int:
        if self.fenced:
            raise Fenced("this master's output store was fenced: it writes nothing")
        if self._unresolved:
            self._resolve(wait)
        with self._lock:
            batch = self._take()
            ready = self._stored() if batch is None and self._waiting else []
        if batch is None:
            self._call(ready)  # waiting on a job deleted since
            return 0
        try:
            self._retry(lambda conn: self._write(conn, batch), "write", wait)
        except Fenced:
            self.fenced = True
            raise
        with self._lock:
            for job_id, k in batch.taken.items():
                job = self._jobs[job_id]
                for line, _, _ in job.buf[:k]:
                    job.stored_bytes += len(line) + 1
                del job.buf[:k]
                job.stored += k
                job.written += k
                if not job.buf:
                    self._dirty.discard(job_id)
                    if not job.open:
                        self._let_go(job_id)
            ready = self._stored()
        self._call(ready)
        return len(batch.rows)

    def _take(self) -> _Batch | None:
        """What the next transaction writes: each buffered job's first records, BATCH_ROWS
        at most; sizes and run offsets as of the last record taken (under the lock)."""
        if not self._dirty:
            return None
        batch = _Batch([], [], [], {})
        for job_id in list(self._dirty):
            job = self._jobs[job_id]
            if not job.resolved:
                continue  # appended since _resolve: the next flush
            k = min(len(job.buf), BATCH_ROWS - len(batch.rows))
            if k <= 0:
                break
            size = job.stored_bytes
            runs: dict[Run, int] = {}
            for i, (line, run, at) in enumerate(job.buf[:k]):
                batch.rows.append((job_id, job.stored + i, line))
                size += len(line) + 1
                if run is not None:
                    runs[run] = max(runs.get(run, 0), at)
            marked = is_marker(job.buf[k - 1][0].encode())
            batch.sizes.append((job_id, job.stored + k, size, marked))
            batch.runs += [
                (job_id, ep, node, stream, at) for (ep, node, stream), at in runs.items()
            ]
            batch.taken[job_id] = k
        return batch

    def _write(self, conn: psycopg.Connection[Any], batch: _Batch) -> None:
        write_rows(conn, self.fence, batch.rows, batch.sizes, batch.runs)

    # ---- reads -------------------------------------------------------------

    def buffered(self, job_id: str, pos: int, limit: int, end: int | None) -> list[str] | None:
        """Buffered records from `pos` (at least one, about `limit` bytes); [] at the end
        of the job's records; None when they are in the database (or the job is not in
        this master's memory)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or pos < job.stored or not job.resolved:
                return None
            stop = job.records if end is None else min(end, job.records)
            out: list[str] = []
            size = 0
            for i in range(pos - job.stored, stop - job.stored):
                line = job.buf[i][0]
                if out and size + len(line) >= limit:
                    break
                out.append(line)
                size += len(line) + 1
            return out

    def stored_count(self, job_id: str) -> int | None:
        """A job's records stored for good, if it is in memory (None: all of them are)."""
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None or not job.resolved else job.stored

    def page(self, job_id: str, pos: int, end: int | None) -> list[str]:
        """Stored records from `pos` on, PAGE at most, consecutive (a job whose stored size
        is not known yet is looked up first: its buffer is readable then)."""
        if job_id in self._unresolved:
            self._resolve(RETRY_FOR, job_id)
        query = "SELECT n, line FROM job_output WHERE job_id = %s AND n >= %s"
        args: list[Any] = [job_id, pos]
        if end is not None:
            query += " AND n < %s"
            args.append(end)
        query += " ORDER BY n LIMIT %s"
        args.append(PAGE)
        rows = self._retry(lambda c: c.execute(query, args).fetchall())
        out: list[str] = []
        for n, line in rows:
            if n != pos + len(out):
                break  # a gap (deleted meanwhile): stop here
            out.append(line)
        return out

    def reader(self, job_id: str, start: int = 0, follow: bool = True) -> OutputReader:
        end = None
        if not follow:
            with self._lock:
                job = self._jobs.get(job_id)
                end = None if job is None or not job.resolved else job.records
        return PgOutputReader(self, job_id, start, end)

    def resume_point(self, job_id: str, epoch: int, node_id: str) -> tuple[int, int]:
        """As the file store's: from what the database holds (a new leader's view), and
        this master's buffer."""
        if self._at_cap(job_id):
            return ALL_SENT, ALL_SENT
        runs = self._have.get(job_id)
        if runs is None:
            rows = self._retry(
                lambda c: c.execute(
                    "SELECT node, stream, at FROM job_output_run WHERE job_id = %s AND epoch = %s",
                    (job_id, epoch),
                ).fetchall()
            )
            runs = {(epoch, node, stream): at for node, stream, at in rows}
            with self._lock:
                job = self._jobs.get(job_id)
                for _, run, at in job.buf if job is not None else ():
                    if run is not None and run[0] == epoch:
                        runs[run] = max(runs.get(run, 0), at)
            self._have[job_id] = runs
        return runs.get((epoch, node_id, "o"), 0), runs.get((epoch, node_id, "e"), 0)

    def _at_cap(self, job_id: str) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return job.full
        if self.cap is None:
            return False
        row = self._retry(
            lambda c: c.execute(
                "SELECT bytes FROM job_output_size WHERE job_id = %s", (job_id,)
            ).fetchone()
        )
        return row is not None and row[0] >= self.cap

    def file_sizes(self) -> dict[str, int]:
        """The stored sizes, with this master's buffers."""
        rows = self._retry(
            lambda c: c.execute("SELECT job_id, bytes FROM job_output_size").fetchall()
        )
        sizes = {job_id: size for job_id, size in rows}
        with self._lock:
            sizes.update((job_id, job.bytes) for job_id, job in self._jobs.items())
        return sizes

    # ---- retention and shutdown --------------------------------------------

    def delete(self, job_id: str, user: str) -> int:
        with self._write_lock:
            with self._lock:
                job = self._jobs.get(job_id)
                if job is not None:
                    if job.open:
                        return 0  # the job is not over
                    self._let_go(job_id)  # its buffer too: deleted with the rest
                    self._dirty.discard(job_id)
                    self._unresolved.discard(job_id)

            def work(conn: psycopg.Connection[Any]) -> int:
                with conn.transaction():
                    self.fence.check(conn)
                    row = conn.execute(
                        "DELETE FROM job_output_size WHERE job_id = %s RETURNING bytes",
                        (job_id,),
                    ).fetchone()
                    conn.execute("DELETE FROM job_output WHERE job_id = %s", (job_id,))
                    conn.execute("DELETE FROM job_output_run WHERE job_id = %s", (job_id,))
                    return 0 if row is None else int(row[0])

            try:
                size = self._retry(work, "write")
            except Fenced:
                self.fenced = True
                raise
        if job is not None:
            size = job.bytes
        if size:
            self._give_back(user, size)
        return size

    def close_all(self) -> None:
        """Stop the flusher and write what is left (shutdown)."""
        self._stopping = True
        self._kick.set()
        self._flusher.join(timeout=RETRY_FOR + 5)
        try:
            if not self.fenced:
                while self.flush():
                    pass
        except Exception:
            log.exception("job output: the last records could not be stored")
        with self._conn_lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()


def open_output_store(
    database: str | None, state_dir: Path, fence: Fence, link: Link | None = None
) -> OutputStore:
    """The output store of a master: in PostgreSQL with a database (its address, a URL or
    libpq's keyword form), otherwise files under the state dir (the SQLite cluster's)."""
    if database:
        return PgOutputStore(database, fence, link)
    return FileOutputStore(state_dir / "output")
