"""Job output in PostgreSQL: every job's output readable from any master after a failover.

The records, their order, the caps and the runs' resume points are the file store's
(store/outputs.py); only where they live differs:

- `job_output(job_id, n, line)`: record `n` of a job, the JSON line readers send as is.
- `job_output_size(job_id, records, bytes, marked)`: a job's count and size (read once
  when a master first appends to the job; summed per user once at start), and whether its
  last record is a cap's marker.
- `job_output_run(job_id, epoch, node, stream, at)`: how far each run's stream is stored:
  the resume point a new leader gives a reconnecting agent (Welcome.resume).

Appends come on the event loop, thousands a second from a chatty job, so none waits on
the database: a record takes its number and goes into its job's in-memory buffer, and a
flusher thread writes every buffer in one transaction every FLUSH_INTERVAL (sooner past
FLUSH_RECORDS), then drops what it wrote from memory.  A reader takes stored rows below
the buffer, then the buffer itself: followers on this master see a record when it is
appended.  A master that dies loses its buffer, but the resume point in job_output_run is
written in the same transaction as the rows, so it is behind what was lost and the agent
re-sends that to the next leader; the agent forgets a run only after `when_stored`.

Every write transaction checks the fence first (store/fence.py): a deposed master's flush
gets Fenced and the store writes nothing more.  A lost connection is reconnected and the
write retried for RETRY_FOR seconds (then again at the next flush): rows go in with ON
CONFLICT DO NOTHING and sizes as values, not increments, so a commit whose answer was lost
may be written again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from mgpu.master.store.fence import Fence, Fenced
from mgpu.master.store.outputs import (
    ALL_SENT,
    CHUNK,
    RUN_TAIL,
    FileOutputStore,
    OutputReader,
    OutputStore,
    is_marker,
)

log = logging.getLogger("mgpu.master")

T = TypeVar("T")
Run = tuple[int, str, str]
"""A run's stream: (epoch, node, stream)."""

FLUSH_INTERVAL = 0.05
"""Seconds between flushes: how long a record may wait in memory."""
FLUSH_RECORDS = 2000
"""Buffered records that start a flush before the interval is up."""
BATCH_ROWS = 20000
"""Rows one transaction writes at most (a buffer grown during an outage goes in parts)."""
PAGE = 256
"""Rows a reader fetches per query: its memory, whatever the job's size."""
RETRY_FOR = 10.0
"""Seconds a write retries a lost connection before it gives up (until the next flush)."""

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS job_output (
        job_id TEXT COLLATE "C" NOT NULL,
        n BIGINT NOT NULL,
        line TEXT NOT NULL,
        PRIMARY KEY (job_id, n))""",
    """CREATE TABLE IF NOT EXISTS job_output_size (
        job_id TEXT COLLATE "C" PRIMARY KEY,
        records BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        marked BOOLEAN NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS job_output_run (
        job_id TEXT COLLATE "C" NOT NULL,
        epoch BIGINT NOT NULL,
        node TEXT NOT NULL,
        stream TEXT NOT NULL,
        at BIGINT NOT NULL,
        PRIMARY KEY (job_id, epoch, node, stream))""",
)
"""The output tables (created if missing; a line is ASCII: JSON escapes the rest)."""

_INSERT = "INSERT INTO job_output (job_id, n, line) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
_SIZE = (
    "INSERT INTO job_output_size (job_id, records, bytes, marked) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (job_id) DO UPDATE SET records = excluded.records, bytes = excluded.bytes, "
    "marked = excluded.marked"
)
_RUN = (
    "INSERT INTO job_output_run (job_id, epoch, node, stream, at) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (job_id, epoch, node, stream) "
    "DO UPDATE SET at = GREATEST(job_output_run.at, excluded.at)"
)


def create_output_tables(conn: psycopg.Connection[Any]) -> None:
    """The output tables, if missing (two masters starting at once: one waits, both pass)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('mgpu job_output schema'))")
        for statement in SCHEMA:
            conn.execute(statement)


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


@dataclass
class _Batch:
    rows: list[tuple[str, int, str]]
    sizes: list[tuple[str, int, int, bool]]
    runs: list[tuple[str, int, str, str, int]]
    taken: dict[str, int]
    """Records written of each job (its buffer's first ones)."""


class PgOutputReader(OutputReader):
    """Stored rows from record `start` on, a page at a time, then the master's buffer."""

    _DB = b"db"  # a marker step() returns internally: the next records are in the database

    def __init__(self, store: PgOutputStore, job_id: str, start: int, end: int | None) -> None:
        self.store = store
        self.job_id = job_id
        self._pos = start
        self._end = end
        self._rows: deque[str] = deque()

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
            buffered = self.store._buffered(self.job_id, self._pos, limit, self._end)
            if buffered is None:
                return self._DB
            lines = buffered
            if not lines:
                return None
        self._pos += len(lines)
        return ("\n".join(lines) + "\n").encode()

    def _fetch(self) -> bool:
        """A page of rows from the database; whether there was any."""
        rows = self.store._page(self.job_id, self._pos, self._end)
        self._rows.extend(rows)
        return bool(rows)

    def step(self, limit: int = CHUNK) -> bytes | None:
        while True:
            got = self._local(limit)
            if got is not self._DB:
                return got
            removals = self.store._removals
            if not self._fetch() and removals == self.store._removals:
                return None

    async def chunks(self) -> AsyncIterator[bytes]:
        """As OutputReader's, the database read in a worker thread; the end is found in
        memory, with no await between it and the return."""
        while True:
            got = self._local(CHUNK)
            if got is self._DB:
                removals = self.store._removals
                if await asyncio.to_thread(self._fetch):
                    continue
                got = self._local(CHUNK)  # appended meanwhile?
                if got is self._DB:
                    if removals != self.store._removals:
                        continue  # a job's buffer was written and let go meanwhile: ask again
                    return
            if got is None:
                return
            yield got

    def close(self) -> None:
        self._rows.clear()


class PgOutputStore(OutputStore):
    """Job output in PostgreSQL (see the module docstring)."""

    def __init__(self, url: str, fence: Fence) -> None:
        super().__init__()
        self.url = url
        self.fence = fence
        self._jobs: dict[str, _Job] = {}
        self._dirty: set[str] = set()
        """Jobs with buffered records."""
        self._lock = threading.Lock()
        """Guards _jobs and their buffers: the loop appends, the flusher trims."""
        self._write_lock = threading.Lock()
        """One writer at a time on the write connection (a flush, a delete)."""
        self._conns: dict[str, psycopg.Connection[Any]] = {}
        self._conn_lock = threading.Lock()
        self._removals = 0
        """Jobs let go from memory so far (a reader that raced one asks the database again)."""
        self._waiting: list[
            tuple[dict[str, int], asyncio.AbstractEventLoop | None, Callable[[], None]]
        ]
        self._waiting = []
        """when_stored's callbacks: the records each waits for (job -> count), its loop."""
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
                    self.url, autocommit=True, connect_timeout=5
                )
            return conn

    def _retry(self, work: Callable[[psycopg.Connection[Any]], T], which: str = "read") -> T:
        """`work` on a connection, reconnecting after a lost one for RETRY_FOR seconds."""
        deadline = time.monotonic() + RETRY_FOR
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
        job = self._open(job_id, node_id)
        if job.full:
            return
        lines, full = self._bounded(job.bytes, rec, node_id, job.owner)
        with self._lock:
            for line in lines.rstrip(b"\n").split(b"\n"):  # the record (maybe cut), a marker
                self._add(job_id, job, line, run, end or 0)
            job.full = job.full or full
        self._wake(job_id)

    def _add(self, job_id: str, job: _Job, line: bytes, run: Run | None, at: int) -> None:
        """One record into the job's buffer (under the lock)."""
        if run is not None and not line.endswith(b',"at":%d}' % at):
            run = None  # a marker, not the record: no run offset
        job.buf.append((line.decode("ascii"), run, at))
        job.records += 1
        job.bytes += len(line) + 1
        job.marked = is_marker(line)
        self._dirty.add(job_id)
        if len(job.buf) == FLUSH_RECORDS:
            self._kick.set()

    def _open(self, job_id: str, node_id: str) -> _Job:
        """The job's state, read from the database at its first append on this master (a
        job at the cap is full; a lowered cap's marker is added)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                if not job.open:
                    job.open = True
                    job.owner = self.owner(job_id)
                return job
        row = self._retry(
            lambda c: c.execute(
                "SELECT records, bytes, marked FROM job_output_size WHERE job_id = %s",
                (job_id,),
            ).fetchone()
        )
        records, size, marked = row or (0, 0, False)
        full = self.cap is not None and size >= self.cap
        job = _Job(records, size, records, size, marked, full, self.owner(job_id))
        with self._lock:
            self._jobs[job_id] = job
            if full and not marked:
                self._add(job_id, job, self._marker(node_id, True).rstrip(b"\n"), None, 0)
        return job

    def close(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                job.open = False
                if not job.buf:
                    self._let_go(job_id)
                else:
                    self._kick.set()  # the ended job's last records: soon
        self._have.pop(job_id, None)
        self._wake(job_id)

    def _let_go(self, job_id: str) -> None:
        """A closed job whose records are all stored leaves memory (under the lock)."""
        del self._jobs[job_id]
        self._removals += 1

    def when_stored(self, then: Callable[[], None]) -> None:
        with self._lock:
            need = {job_id: self._jobs[job_id].records for job_id in self._dirty}
            if need:
                self._waiting.append((need, _running_loop(), then))
                self._kick.set()
        if not need:
            then()

    def _stored(self) -> list[tuple[asyncio.AbstractEventLoop | None, Callable[[], None]]]:
        """The when_stored callbacks now due (under the lock): each job they waited for is
        stored that far, or deleted."""
        ready = []
        due, self._waiting = self._waiting, []
        for need, loop, then in due:
            if all(
                (job := self._jobs.get(job_id)) is None or job.stored >= n
                for job_id, n in need.items()
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
            else:
                loop.call_soon_threadsafe(then)

    # ---- the flusher -----------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._kick.wait(FLUSH_INTERVAL)
            self._kick.clear()
            if self._stopping:
                return  # close_all writes the rest
            try:
                self.flush()
            except Fenced as e:
                log.error("job output: %s", e)
                return
            except Exception:
                log.exception("job output: writing failed; retrying")
                time.sleep(1.0)

    def flush(self) -> int:
        """Write buffered records in one transaction (the flusher calls it every
        FLUSH_INTERVAL; tests and shutdown too); how many were written."""
        with self._write_lock:
            if self.fenced:
                raise Fenced("this master's output store was fenced: it writes nothing")
            with self._lock:
                batch = self._take()
                ready = self._stored() if batch is None and self._waiting else []
            if batch is None:
                self._call(ready)  # waiting on a job deleted since
                return 0
            try:
                self._retry(lambda conn: self._write(conn, batch), "write")
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
        with conn.transaction():
            self.fence.check(conn)
            with conn.cursor() as cur:
                cur.executemany(_INSERT, batch.rows)
                cur.executemany(_SIZE, batch.sizes)
                if batch.runs:
                    cur.executemany(_RUN, batch.runs)

    # ---- reads -------------------------------------------------------------

    def _buffered(self, job_id: str, pos: int, limit: int, end: int | None) -> list[str] | None:
        """Buffered records from `pos` (at least one, about `limit` bytes); [] at the end
        of the job's records; None when they are in the database (or the job is not in
        this master's memory)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or pos < job.stored:
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

    def _page(self, job_id: str, pos: int, end: int | None) -> list[str]:
        """Stored records from `pos` on, PAGE at most, consecutive."""
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
                end = None if job is None else job.records
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

            size = self._retry(work, "write")
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


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def open_output_store(database: str | None, state_dir: Path, fence: Fence) -> OutputStore:
    """The output store of a master: in PostgreSQL with a `postgresql://` database,
    otherwise files under the state dir (the SQLite cluster's)."""
    if database and database.startswith(("postgresql://", "postgres://")):
        return PgOutputStore(database, fence)
    return FileOutputStore(state_dir / "output")


# ---- mgpu db import ------------------------------------------------------------


def import_output_files(
    output_dir: Path, target: str | psycopg.Connection[Any], fence: Fence | None = None
) -> int:
    """Copy a SQLite cluster's output files (STATE_DIR/output/JOB.jsonl) into the output
    tables, one transaction per job; a job already there is skipped (a second import
    adds only what is new).  Returns the jobs copied."""
    conn = psycopg.connect(target, autocommit=True) if isinstance(target, str) else target
    fence = fence or Fence()
    copied = 0
    try:
        create_output_tables(conn)
        for path in sorted(output_dir.glob("*.jsonl")) if output_dir.is_dir() else ():
            with conn.transaction():
                fence.check(conn)
                job_id = path.name[: -len(".jsonl")]
                if conn.execute(
                    "SELECT 1 FROM job_output_size WHERE job_id = %s", (job_id,)
                ).fetchone():
                    continue
                _copy_file(conn, job_id, path)
                copied += 1
    finally:
        if isinstance(target, str):
            conn.close()
    return copied


def _copy_file(conn: psycopg.Connection[Any], job_id: str, path: Path) -> None:
    records = size = 0
    runs: dict[Run, int] = {}
    last = b""
    with conn.cursor() as cur:
        with cur.copy("COPY job_output (job_id, n, line) FROM STDIN") as copy:
            for line in _whole_lines(path):
                copy.write_row((job_id, records, line.decode("ascii", errors="replace")))
                records += 1
                size += len(line) + 1
                last = line
                m = RUN_TAIL.search(line, max(0, len(line) - 512))
                if m is not None and line.startswith(b'{"s":"'):
                    run = (int(m.group(2)), json.loads(m.group(1)), chr(line[6]))
                    runs[run] = max(runs.get(run, 0), int(m.group(3)))
        cur.execute(_SIZE, (job_id, records, size, is_marker(last)))
        if runs:
            cur.executemany(_RUN, [(job_id, *run, at) for run, at in runs.items()])


def _whole_lines(path: Path) -> Iterator[bytes]:
    """A file's whole lines, a chunk read at a time (a last line cut by a crash is not)."""
    with open(path, "rb") as f:
        tail = b""
        while block := f.read(CHUNK):
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            yield from (line for line in lines if line)
