"""The PostgreSQL output store's tables (store/pgoutputs.py), how its flushes write them
(`write_rows`: a few records as one query, one round trip; many through COPY), and `mgpu
db import`'s copy of a SQLite cluster's output files into them.

- `job_output(job_id, n, line)`: record `n` of a job, the JSON line readers send as is.
- `job_output_size(job_id, records, bytes, marked)`: a job's count and size (read once
  when a master first appends to the job; summed per user once at start), and whether its
  last record is a cap's marker.
- `job_output_run(job_id, epoch, node, stream, at)`: how far each run's stream is stored:
  the resume point a new leader gives a reconnecting agent (Welcome.resume).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from mgpu.master.store.fence import Fence
from mgpu.master.store.outputs import CHUNK, RUN_TAIL, is_marker
from mgpu.master.store.pgwith import statement

Run = tuple[int, str, str]
"""A run's stream: (epoch, node, stream)."""

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

STAGE = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS job_output_stage "
    "(LIKE job_output INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
FROM_STAGE = "INSERT INTO job_output SELECT * FROM job_output_stage ON CONFLICT DO NOTHING"
SIZE_UPSERT = (
    "INSERT INTO job_output_size (job_id, records, bytes, marked) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (job_id) DO UPDATE SET records = excluded.records, bytes = excluded.bytes, "
    "marked = excluded.marked"
)
RUN_UPSERT = (
    "INSERT INTO job_output_run (job_id, epoch, node, stream, at) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (job_id, epoch, node, stream) "
    "DO UPDATE SET at = GREATEST(job_output_run.at, excluded.at)"
)


ONE_QUERY_ENV = "MGPU_TEST_OUTPUT_ONE_QUERY_ROWS"
ONE_QUERY_ROWS = int(os.environ.get(ONE_QUERY_ENV) or 64)
"""Records a flush sends as one query; more go through COPY.  `$MGPU_TEST_OUTPUT_ONE_QUERY_ROWS`
is a test hook (0: every flush through COPY, for the HA test that stops a leader inside a
transaction of several round trips)."""
ROWS_INSERT = "INSERT INTO job_output (job_id, n, line) VALUES"


def write_rows(
    conn: psycopg.Connection[Any],
    fence: Fence,
    rows: list[tuple[str, int, str]],
    sizes: list[tuple[str, int, int, bool]],
    runs: list[tuple[str, int, str, str, int]],
) -> None:
    """One flush of the output store: records, each job's size and its runs' offsets, in
    one transaction after the fence's check.  Rows a lost commit may have stored already
    are skipped, sizes and offsets are values: written twice, the same."""
    if len(rows) <= ONE_QUERY_ROWS:
        _write_one(conn, fence, rows, sizes, runs)
        return
    with conn.transaction():
        fence.check(conn)
        with conn.cursor() as cur:
            # COPY is several times faster than INSERTs; through a temporary table,
            # so that rows a lost commit may have stored already are skipped.
            cur.execute(STAGE)
            with cur.copy("COPY job_output_stage (job_id, n, line) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(FROM_STAGE)
            cur.executemany(SIZE_UPSERT, sizes)
            if runs:
                cur.executemany(RUN_UPSERT, runs)


def _write_one(
    conn: psycopg.Connection[Any],
    fence: Fence,
    rows: list[tuple[str, int, str]],
    sizes: list[tuple[str, int, int, bool]],
    runs: list[tuple[str, int, str, str, int]],
) -> None:
    """A few rows as one query, the fence's check first: one round trip, one implicit
    transaction (a job that prints a line or two: most flushes)."""
    check = fence.statement()
    inserts: list[tuple[str, list[Any]]] = [
        (f"{ROWS_INSERT} (%s,%s,%s) ON CONFLICT DO NOTHING", list(rows)),
        (SIZE_UPSERT, list(sizes)),
        (RUN_UPSERT, list(runs)),
    ]
    single = statement(inserts, check)  # one, prepared once its shape is known: pgwith.py
    try:
        if single is not None:  # bound by the server: a ClientCursor's is never prepared
            conn.execute(single[0], single[1])
            return
        with psycopg.ClientCursor(conn) as cur:  # the statements one by one, as one query
            parts = [] if check is None else [check]
            if rows:
                values = ",".join(cur.mogrify("(%s,%s,%s)", row) for row in rows)
                parts.append(f"{ROWS_INSERT} {values} ON CONFLICT DO NOTHING")
            parts += [cur.mogrify(SIZE_UPSERT, size) for size in sizes]
            parts += [cur.mogrify(RUN_UPSERT, run) for run in runs]
            cur.execute(";".join(parts))
    except psycopg.errors.InvalidTextRepresentation as e:
        if fence.refused(e):
            fence.deny(conn)  # raises Fenced
        raise


def create_output_tables(conn: psycopg.Connection[Any]) -> None:
    """The output tables, if missing (two masters starting at once: one waits, both pass)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('mgpu job_output schema'))")
        for statement in SCHEMA:
            conn.execute(statement)


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
        cur.execute(SIZE_UPSERT, (job_id, records, size, is_marker(last)))
        if runs:
            cur.executemany(RUN_UPSERT, [(job_id, *run, at) for run, at in runs.items()])


def _whole_lines(path: Path) -> Iterator[bytes]:
    """A file's whole lines, a chunk read at a time (a last line cut by a crash is not)."""
    with open(path, "rb") as f:
        tail = b""
        while block := f.read(CHUNK):
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            yield from (line for line in lines if line)
