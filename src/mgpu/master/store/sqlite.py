"""The master's durable state: SQLite in WAL mode under the state dir.

Each job is one row: a few indexed columns for queries plus the whole record as
JSON.  The master writes a job here after every state change and before acting
on it.  `synchronous=NORMAL` in WAL mode survives a crash or kill -9 of the
master (the WAL is in the OS page cache); only a power loss can drop the last
transactions, which is the trade-off Slurm's own state save makes too.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from mgpu import spec as specs
from mgpu.master.store import arrays
from mgpu.master.store.walcheckpoint import Checkpointer
from mgpu.model import Job

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    user TEXT NOT NULL,
    submit_time REAL NOT NULL,
    end_time REAL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time);
CREATE TABLE IF NOT EXISTS arrays (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    active INTEGER NOT NULL,
    indices TEXT NOT NULL,
    max_running INTEGER,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reservations (
    name TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT,
    address TEXT,
    target TEXT,
    detail TEXT
);
"""

ACTIVE_STATES = ("queued", "running")


SCRIPT_OF_ARRAY = "script_of_array"
"""In a task's stored record: its script is its array's (kept once, in the array's row)."""
SCRIPT_CACHE = 16
"""Arrays whose scripts are kept in memory for reading tasks back (each ≤ 1 MiB)."""


def _task_record(job: Job) -> dict[str, Any]:
    """A job's record to store: an array task's script (up to 1 MiB) is not copied into
    each of its up to 100,000 rows: the array's row holds it."""
    record = job.to_record()
    if job.array_job_id is not None and record.get("script") is not None:
        record["script"], record[SCRIPT_OF_ARRAY] = None, True
    return record


def _encode(record: dict[str, Any]) -> str:
    """A job record as JSON: orjson, ten times quicker than json on these records (cancelling
    100,000 tasks writes 100,000 of them).  What orjson refuses (a lone surrogate in some
    string) is written by json as before; orjson writes an infinite float as null, which a
    record reads back as "no limit", its meaning anyway."""
    try:
        return orjson.dumps(record).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(record, separators=(",", ":"))


RECENTLY_ENDED = 4096
"""Jobs kept in memory as written when they end (a bounded cache in front of `get_job(s)`):
whoever waits for a job (`mgpu srun`, `mgpu wait`, a client's wait_all) asks for it just
after it ended, and reading one back costs ~0.15 ms (the JSON, Job.from_record).  An ended
job does not change any more."""

LAST_JOB_ID = "last_job_id"
"""The meta row of the job id counter: the highest id stored, written in the transaction
that stores the job, so an id shown to anyone is never handed out again (a restart, a
crash).  An id handed out for a submit that was refused or never written may be given
again: nobody saw it."""

MEMORY = ":memory:"
"""A store that lives in memory only (the controller tests)."""


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = path
        if path != MEMORY:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._checkpointer: Checkpointer | None = None
        if path != MEMORY:  # checkpoints off the event loop (walcheckpoint.py)
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = Checkpointer(path)
            self._checkpointer.start()
        self.db.executescript(SCHEMA)
        row = self.db.execute(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM jobs), 0), "
            "COALESCE((SELECT MAX(seq) FROM arrays), 0))"
        ).fetchone()
        self._seq = int(row[0])
        cur = self.db.execute("SELECT id, seq FROM arrays WHERE active=1")
        self._array_seq: dict[str, int] = {str(r[0]): int(r[1]) for r in cur}
        """Arrays with tasks that have no row yet: a task's first row takes the array's
        seq, so it keeps its place in the queue."""
        self._scripts: dict[str, str | None] = {}
        """Scripts of arrays whose tasks were read back lately (SCRIPT_CACHE of them)."""
        self._ended: OrderedDict[str, Job] = OrderedDict()
        """The last RECENTLY_ENDED jobs written as ended, oldest first."""
        self._stored_id = int(self.get_meta(LAST_JOB_ID) or specs.FIRST_JOB_ID - 1)
        """The counter as stored (LAST_JOB_ID)."""
        self._last_id = self._stored_id
        """The highest id handed out (`new_job_id`), stored or not yet."""

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.db.close()

    # ---- jobs -------------------------------------------------------------

    def new_job_id(self, block: int = 1) -> str:
        """The next job id of the cluster: one more than the last handed out, skipping an
        id an older mgpu stored (8 hex characters can all be digits).  `block`: ids taken
        from it on (an array's tasks each have a job number: `specs.task_job_number`)."""
        number = self._last_id + 1
        while self.has_job(specs.format_job_id(number)):
            number += 1
        self._last_id = number + max(block, 1) - 1
        return specs.format_job_id(number)

    def _count_ids(self, jobs: Sequence[Job], top_index: int = 0) -> None:
        """In a transaction storing `jobs`: move the stored counter past their ids (an
        array's past its block: `top_index` is its highest task index)."""
        top = self._stored_id
        for job in jobs:
            base = job.array_job_id or job.id
            index = top_index if job.array_job_id is None else job.array_task_id or 0
            number = specs.task_job_number(base, index)
            if number is not None and number > top:
                top = number
        if top > self._stored_id:
            self._set_meta(LAST_JOB_ID, str(top))
            self._stored_id = top
            self._last_id = max(self._last_id, top)

    def save_jobs(
        self,
        jobs: list[Job],
        event: tuple[str, str | None, str | None, str] | None = None,
        detail: str | None = None,
        meta: tuple[str, str] | None = None,
        events: Sequence[tuple[str, str | None, str | None, str]] = (),
    ) -> None:
        """Write jobs in one transaction (a whole array is stored or nothing), with an
        optional audit event (kind, actor, address, target; detail), more `events` without
        a detail, and a meta value (key, value) in the same one: one commit, not one each."""
        rows = []
        for job in jobs:
            self._seq += 1
            rows.append(
                (
                    job.id,
                    self._array_seq.get(job.array_job_id or "", self._seq),
                    job.state.value,
                    job.user,
                    job.submit_time,
                    job.end_time,
                    _encode(_task_record(job)),
                )
            )
        with self._tx():
            # seq keeps the first insert's order: it is submit order for the queue.
            self.db.executemany(
                "INSERT INTO jobs(id, seq, state, user, submit_time, end_time, record) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
                "state=excluded.state, end_time=excluded.end_time, record=excluded.record",
                rows,
            )
            if event is not None:
                self.db.execute(
                    "INSERT INTO events(time, kind, actor, address, target, detail) "
                    "VALUES (?,?,?,?,?,?)",
                    (time.time(), *event, detail),
                )
            if events:
                now = time.time()
                self.db.executemany(
                    "INSERT INTO events(time, kind, actor, address, target) VALUES (?,?,?,?,?)",
                    [(now, *e) for e in events],
                )
            if meta is not None:
                self._set_meta(*meta)
            self._count_ids(jobs)
        self._remember_ended(jobs)

    def _remember_ended(self, jobs: list[Job]) -> None:
        """After the commit: the ended jobs just written, for get_job(s)."""
        ended = self._ended
        for job in jobs[-RECENTLY_ENDED:]:  # 100,000 tasks cancelled: the last few
            if job.state.terminal:
                ended[job.id] = job
                ended.move_to_end(job.id)
        while len(ended) > RECENTLY_ENDED:
            ended.popitem(last=False)

    def save_array(
        self,
        template: Job,
        indices: list[int],
        max_running: int | None,
        event: tuple[str, str | None, str | None, str] | None = None,
    ) -> None:
        """Store an array as one row (`mgpu.master.store.arrays`): its tasks are the template at
        each index until they change; with the audit event, in one transaction."""
        self._seq += 1
        record = json.dumps(template.to_record(), separators=(",", ":"))
        with self._tx():
            self.db.execute(
                "INSERT INTO arrays(id, seq, active, indices, max_running, record) "
                "VALUES (?,?,1,?,?,?)",
                (template.id, self._seq, arrays.encode_indices(indices), max_running, record),
            )
            if event is not None:
                self.db.execute(
                    "INSERT INTO events(time, kind, actor, address, target) VALUES (?,?,?,?,?)",
                    (time.time(), *event),
                )
            self._count_ids([template], max(indices, default=0))
        self._array_seq[template.id] = self._seq

    def get_array(self, array_id: str) -> tuple[Job, tuple[int, ...], int | None] | None:
        """An array stored as one row: (template, task indices, running cap).  The indices
        are a tuple, which the cyclic collector stops tracking (a list of 100,000 ints it
        would walk in every full collection while a request pages through them)."""
        row = self.db.execute(
            "SELECT record, indices, max_running FROM arrays WHERE id=?", (array_id,)
        ).fetchone()
        if row is None:
            return None
        template = Job.from_record(json.loads(row[0]))
        return template, tuple(arrays.decode_indices(row[1])), row[2]

    def _job(self, text: str, db: sqlite3.Connection | None = None) -> Job:
        """A stored job record read back, an array task's script from its array's row."""
        record = json.loads(text)
        if record.pop(SCRIPT_OF_ARRAY, False):
            record["script"] = self._array_script(record["array_job_id"], db or self.db)
        return Job.from_record(record)

    def _array_script(self, array_id: str, db: sqlite3.Connection) -> str | None:
        script = self._scripts.get(array_id)
        if script is None:
            row = db.execute("SELECT record FROM arrays WHERE id=?", (array_id,)).fetchone()
            script = None if row is None else json.loads(row[0]).get("script")
            if len(self._scripts) >= SCRIPT_CACHE:
                self._scripts.pop(next(iter(self._scripts)), None)
            self._scripts[array_id] = script
        return script

    def load_active_jobs(self) -> list[Job]:
        """Queued and running jobs in submit order: stored rows, and the tasks of arrays
        that have no row of their own yet (made from the array's template)."""
        found: list[tuple[int, int, Job]] = []
        cur = self.db.execute("SELECT seq, record FROM jobs WHERE state IN (?, ?)", ACTIVE_STATES)
        for seq, record in list(cur):
            job = self._job(record)
            found.append((seq, -1 if job.array_task_id is None else job.array_task_id, job))
        cur = self.db.execute(
            "SELECT id, seq, indices, max_running, record FROM arrays WHERE active=1"
        )
        for array_id, seq, indices, cap, record in list(cur):
            rowed = {r[0] for r in self.job_rows_with_prefix(array_id + "_", limit=-1)}
            template = Job.from_record(json.loads(record))
            left = [i for i in arrays.decode_indices(indices) if f"{array_id}_{i}" not in rowed]
            if not left:  # every task has its row: the array row is history only
                with self._tx():
                    self.db.execute("UPDATE arrays SET active=0 WHERE id=?", (array_id,))
                self._array_seq.pop(array_id, None)
                continue
            found += [(seq, t.array_task_id or 0, t) for t in arrays.tasks(template, left, cap)]
        found.sort(key=lambda f: (f[0], f[1]))
        return [f[2] for f in found]

    def has_job(self, job_id: str) -> bool:
        """Whether the id is taken (by a job, or by an array)."""
        row = self.db.execute(
            "SELECT 1 FROM jobs WHERE id=? UNION ALL SELECT 1 FROM arrays WHERE id=?",
            (job_id, job_id),
        ).fetchone()
        return row is not None

    def array_below(self, number: int) -> str | None:
        """The numeric array id nearest below `number`: the only array whose block of task
        numbers (`specs.task_job_number`) can hold it.  A scan of the arrays' ids, for the
        rare lookup of a task by its own number."""
        row = self.db.execute(
            "SELECT id FROM arrays WHERE id GLOB '[1-9]*' AND id NOT GLOB '*[^0-9]*' "
            "AND CAST(id AS INTEGER) < ? ORDER BY CAST(id AS INTEGER) DESC LIMIT 1",
            (number,),
        ).fetchone()
        return None if row is None else str(row[0])

    def get_job(self, job_id: str) -> Job | None:
        job = self._ended.get(job_id)
        if job is not None:
            return job
        row = self.db.execute("SELECT record FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else self._job(row[0])

    def get_jobs(self, job_ids: list[str]) -> dict[str, Job]:
        """Many jobs by id in a few queries (not one per id); unknown ids are left out."""
        out: dict[str, Job] = {}
        ended = self._ended
        unique = []
        for job_id in dict.fromkeys(job_ids):
            job = ended.get(job_id)
            if job is None:
                unique.append(job_id)
            else:
                out[job_id] = job
        for i in range(0, len(unique), 500):  # well under SQLite's bound-parameter limit
            part = unique[i : i + 500]
            cur = self.db.execute(
                f"SELECT id, record FROM jobs WHERE id IN ({','.join('?' * len(part))})", part
            )
            out.update((r[0], self._job(r[1])) for r in list(cur))
        return out

    def job_rows_with_prefix(
        self, prefix: str, after: str = "", limit: int = 5000
    ) -> list[tuple[str, str, str]]:
        """(id, state, user) of jobs whose id starts with `prefix`, in id order from just
        after `after`: a page at a time, so a 100,000-task array is never read at once."""
        cur = self.db.execute(
            "SELECT id, state, user FROM jobs WHERE id > ? AND id < ? ORDER BY id LIMIT ?",
            (max(prefix, after), prefix + "\U0010ffff", limit),
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in cur]

    def finished_jobs(self, since: float | None = None, limit: int = 1000) -> list[Job]:
        cur = self.db.execute(
            "SELECT record FROM jobs WHERE state NOT IN (?, ?) AND end_time >= ? "
            "ORDER BY end_time DESC LIMIT ?",
            (*ACTIVE_STATES, since or 0.0, limit),
        )
        return [self._job(r[0]) for r in cur.fetchall()]

    def count_by_state(self) -> dict[str, int]:
        cur = self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {str(state): int(n) for state, n in cur}

    def read_finished(
        self,
        since: float,
        user: str | None = None,
        states: set[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs that ended at or after `since`, newest first, through a read-only connection
        of their own (SQLite in WAL mode lets it read while the master writes): safe to call
        from a thread, so that a long history does not hold up the event loop."""
        where = ["state NOT IN (?, ?)", "end_time >= ?"]
        params: list[Any] = [*ACTIVE_STATES, since]
        if user:
            where.append("user = ?")
            params.append(user)
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params += sorted(states)
        sql = f"SELECT record FROM jobs WHERE {' AND '.join(where)} ORDER BY end_time DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        if self.path == MEMORY:
            return [self._job(r[0]) for r in self.db.execute(sql, params).fetchall()]
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=10)
        try:
            return [self._job(r[0], conn) for r in conn.execute(sql, params).fetchall()]
        finally:
            conn.close()

    def jobs_with_prefix(self, prefix: str) -> list[Job]:
        cur = self.db.execute(
            "SELECT record FROM jobs WHERE id >= ? AND id < ? ORDER BY seq",
            (prefix, prefix + "\U0010ffff"),
        )
        return [self._job(r[0]) for r in cur.fetchall()]

    # ---- nodes and meta ---------------------------------------------------

    def save_node(self, node_id: str, record: dict[str, Any]) -> None:
        with self._tx():
            self.db.execute(
                "INSERT INTO nodes(node_id, record) VALUES (?, ?) "
                "ON CONFLICT(node_id) DO UPDATE SET record=excluded.record",
                (node_id, json.dumps(record)),
            )

    def delete_node(self, node_id: str) -> None:
        with self._tx():
            self.db.execute("DELETE FROM nodes WHERE node_id=?", (node_id,))

    def load_nodes(self) -> dict[str, dict[str, Any]]:
        cur = self.db.execute("SELECT node_id, record FROM nodes")
        return {r[0]: json.loads(r[1]) for r in cur}

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx():
            self._set_meta(key, value)

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    def record_event(
        self,
        kind: str,
        actor: str | None = None,
        address: str | None = None,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        with self._tx():
            self.db.execute(
                "INSERT INTO events(time, kind, actor, address, target, detail) "
                "VALUES (?,?,?,?,?,?)",
                (time.time(), kind, actor, address, target, detail),
            )

    def record_events(
        self, rows: list[tuple[str, str | None, str | None, str | None, str | None]]
    ) -> None:
        """Several events (kind, actor, address, target, detail) in one transaction."""
        now = time.time()
        with self._tx():
            self.db.executemany(
                "INSERT INTO events(time, kind, actor, address, target, detail) "
                "VALUES (?,?,?,?,?,?)",
                [(now, *row) for row in rows],
            )

    def events(self, since: float = 0.0, limit: int = 1000) -> list[dict[str, Any]]:
        cur = self.db.execute(
            "SELECT time, kind, actor, address, target, detail FROM events "
            "WHERE time >= ? ORDER BY id DESC LIMIT ?",
            (since, limit),
        )
        keys = ("time", "kind", "actor", "address", "target", "detail")
        return [dict(zip(keys, r, strict=True)) for r in cur]

    # ---- retention (master/control/retention.py): small slices, oldest first ------------

    def users_of(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The user of each of these jobs that has a row."""
        marks = ",".join("?" * len(job_ids))
        cur = self.db.execute(f"SELECT id, user FROM jobs WHERE id IN ({marks})", list(job_ids))
        return {str(i): str(u) for i, u in cur}

    def ended_between(
        self, after: tuple[float, str], before: float, limit: int
    ) -> list[tuple[str, str, float]]:
        """(id, user, end time) of ended jobs that ended before `before` and after `after`
        (the end time and id of the previous slice's last row), in that order."""
        end, job_id = after
        cur = self.db.execute(
            "SELECT id, user, end_time FROM jobs WHERE end_time >= ? AND end_time < ? "
            "AND (end_time > ? OR id > ?) AND state NOT IN (?, ?) "
            "ORDER BY end_time, id LIMIT ?",
            (end, before, end, job_id, *ACTIVE_STATES, limit),
        )
        return [(str(i), str(u), float(t)) for i, u, t in cur]

    def delete_ended_jobs(self, before: float, limit: int) -> list[tuple[str, str]]:
        """Delete up to `limit` rows of jobs that ended before `before`: their (id, user)."""
        with self._tx():
            rows = [
                (str(i), str(u))
                for i, u in self.db.execute(
                    "SELECT id, user FROM jobs WHERE end_time < ? AND state NOT IN (?, ?) "
                    "ORDER BY end_time LIMIT ?",
                    (before, *ACTIVE_STATES, limit),
                )
            ]
            self.db.executemany("DELETE FROM jobs WHERE id=?", [(i,) for i, _ in rows])
        for job_id, _ in rows:
            self._ended.pop(job_id, None)
        return rows

    def delete_events_before(self, before: float, limit: int) -> int:
        """Delete up to `limit` audit events older than `before`; how many went."""
        with self._tx():
            cur = self.db.execute(
                "DELETE FROM events WHERE id IN "
                "(SELECT id FROM events WHERE time < ? ORDER BY id LIMIT ?)",
                (before, limit),
            )
        return int(cur.rowcount)

    # ---- reservations -----------------------------------------------------

    def save_reservation(
        self, name: str, record: dict[str, Any], event: tuple[str, str | None, str | None]
    ) -> None:
        """Store a new reservation with its audit event (kind, actor, address) at once."""
        with self._tx():
            self.db.execute(
                "INSERT INTO reservations(name, record) VALUES (?, ?)", (name, json.dumps(record))
            )
            self._event(*event, name, None)

    def delete_reservations(
        self, names: list[str], event: tuple[str, str | None, str | None] | None = None
    ) -> None:
        """Forget reservations (deleted, or ended), with one audit event each if given."""
        with self._tx():
            for name in names:
                self.db.execute("DELETE FROM reservations WHERE name=?", (name,))
                if event is not None:
                    self._event(*event, name, None)

    def load_reservations(self) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT record FROM reservations ORDER BY name")
        return [json.loads(r[0]) for r in cur]

    def _event(
        self,
        kind: str,
        actor: str | None,
        address: str | None,
        target: str | None,
        detail: str | None,
    ) -> None:
        self.db.execute(
            "INSERT INTO events(time, kind, actor, address, target, detail) VALUES (?,?,?,?,?,?)",
            (time.time(), kind, actor, address, target, detail),
        )

    # ---- helpers ----------------------------------------------------------

    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> None:
            self.db.execute("BEGIN")

        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")

    def _tx(self) -> Store._Tx:
        return Store._Tx(self.db)
