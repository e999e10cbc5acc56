"""Every query of the master's store, written once for both SQL backends.

`SqlStore` holds the queries, in SQLite's spelling with `?` placeholders; its `dialect`
(dialect.py) turns each into its backend's.  A subclass only connects and runs them
(`SqliteStore`: sqlite.py; `PostgresStore`: postgres.py) through four primitives:
`_read` (a read on the store's connection), `_read_apart` (a read on a connection of its
own, from a thread), `_write` (work in one write transaction after the fence's check;
`one_query`: one statement) and `_write_rows` (statements over rows in one transaction);
and `_later`, which hands writes to the store's thread (PostgreSQL: store/dbthread.py)
or runs them at once (SQLite).
A write may run again after its connection was lost (PostgreSQL), so each is an upsert,
ignores a row already there, or is harmless twice.
"""

from __future__ import annotations

import contextlib
import json
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mgpu.master.store import arrays, steps
from mgpu.master.store.base import (
    ACTIVE_STATES,
    LAST_JOB_ID,
    TOKEN_KEYS,
    Event,
    KeyTaken,
    Store,
    StoreStalled,
    TokenRow,
)
from mgpu.master.store.dbthread import Later
from mgpu.master.store.dialect import Dialect, many
from mgpu.model import Job

__all__ = ["SqlStore"]

T = TypeVar("T")

UPSERT_JOB = (
    'INSERT INTO jobs(id, seq, state, "user", submit_time, end_time, record) '
    "VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
    "state=excluded.state, end_time=excluded.end_time, record=excluded.record"
)  # seq keeps the first insert's order: it is submit order for the queue
SAVE_NODE = (
    "INSERT INTO nodes(node_id, record) VALUES (?, ?) "
    "ON CONFLICT(node_id) DO UPDATE SET record=excluded.record"
)
SET_META = (
    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value"
)
EVENT = "INSERT INTO events(time, kind, actor, address, target, detail) VALUES (?,?,?,?,?,?)"
SUBMIT_KEY = 'INSERT INTO submit_keys("user", key, job_id, time) VALUES (?,?,?,?)'
REQUEST_KEY = (
    'INSERT INTO request_keys("user", key, answer, time) VALUES (?,?,?,?) '
    'ON CONFLICT("user", key) DO NOTHING'
)  # the first answer stays: a request sent again is told what the first one was
EVENT_KEYS = ("time", "kind", "actor", "address", "target", "detail")


class SqlStore(Store):
    dialect: Dialect

    # ---- what a backend provides ------------------------------------------

    @abstractmethod
    def _read(self, work: Callable[[Any], T]) -> T:
        """`work(connection)`, reads only, on the store's connection."""

    @abstractmethod
    def _read_apart(self, work: Callable[[Any], T]) -> T:
        """`work(connection)`, reads only, on a connection of its own (from a thread)."""

    @abstractmethod
    def _write(self, work: Callable[[Any], T], one_query: bool = False) -> T:
        """`work(connection)` in one write transaction, after the fence's check
        (`one_query`: it runs one statement)."""

    @abstractmethod
    def _write_rows(self, parts: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        """Each statement of `parts` (in the dialect) for each of its rows, in one write
        transaction."""

    def _later(
        self, work: Callable[[], T], after: Callable[[], None] | None = None, new_jobs: bool = False
    ) -> Later[T]:
        """`work` (which calls the primitives above) in the store's thread, `after` on the
        caller's once it is done (store/dbthread.py); here: at once.  `new_jobs`: it writes
        only jobs never written before (a submit's), which may go beside the other writes."""
        return Later.now(work, after)

    # ---- running queries written once ---------------------------------------

    def _q(self, sql: str) -> str:
        return self.dialect.sql(sql)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        text = self._q(sql)
        row = self._read(lambda c: c.execute(text, params).fetchone())
        return None if row is None else tuple(row)

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        text = self._q(sql)
        return [tuple(r) for r in self._read(lambda c: c.execute(text, params).fetchall())]

    def _all_in(
        self, sql: str, column: str, values: Sequence[Any], tail: str = ""
    ) -> list[tuple[Any, ...]]:
        """`sql` WHERE `column` is one of `values` (`tail` after it), each chunk the
        dialect needs in turn."""
        out: list[tuple[Any, ...]] = []
        for where, params in self.dialect.in_list(column, values):
            out += self._all(f"{sql} WHERE {where} {tail}", params)
        return out

    def _rows(self, parts: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        self._write_rows([(self._q(sql), rows) for sql, rows in parts if rows])

    def _change(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement that writes; the rows it changed."""
        text = self._q(sql)
        return int(self._write(lambda c: c.execute(text, params).rowcount, one_query=True))

    def schema_version(self) -> int:
        row = self._one("SELECT MAX(version) FROM schema_version")
        return int(row[0] or 0) if row else 0

    def _load_seqs(self) -> tuple[int, dict[str, int]]:
        row = self._one(
            f"SELECT {self.dialect.greatest}(COALESCE((SELECT MAX(seq) FROM jobs), 0), "
            "COALESCE((SELECT MAX(seq) FROM arrays), 0))"
        )
        rows = self._all("SELECT id, seq FROM arrays WHERE active=1")
        return int(row[0]) if row else 0, {str(r[0]): int(r[1]) for r in rows}

    def _digit_ids_above(self, counter: int) -> set[str]:
        low = f"{max(counter + 1, 10_000_000):08d}"
        if len(low) > 8:
            return set()
        digits = self.dialect.eight_digits  # a range of the primary key, then 8 digits
        rows = self._all(
            f"SELECT id FROM jobs WHERE id >= ? AND id <= '99999999' AND {digits} "
            f"UNION SELECT id FROM arrays WHERE id >= ? AND id <= '99999999' AND {digits}",
            (low, low),
        )
        return {str(r[0]) for r in rows}

    # ---- jobs -------------------------------------------------------------

    def save_jobs(
        self,
        jobs: list[Job],
        event: Event | None = None,
        detail: str | None = None,
        meta: tuple[str, str] | None = None,
        events: Sequence[Event] = (),
        keys: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.save_jobs_later(jobs, event, detail, meta, events, keys).wait(self._bound())

    def save_jobs_later(
        self,
        jobs: list[Job],
        event: Event | None = None,
        detail: str | None = None,
        meta: tuple[str, str] | None = None,
        events: Sequence[Event] = (),
        keys: Sequence[tuple[str, str]] = (),
        ended_steps: Sequence[steps.StepRow] = (),
        new_jobs: bool = False,
        live_steps: Sequence[steps.LiveRow] = (),
        gone_steps: Sequence[str] = (),
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> Later[None]:
        rows = self._job_rows(jobs)  # here: the seq counter is the caller's thread's
        top = self._top_id(jobs)
        now = time.time()
        metas = [m for m in (meta, None if top is None else (LAST_JOB_ID, str(top))) if m]
        all_events: list[tuple[Any, ...]] = [(now, *e, None) for e in events]
        if event is not None:
            all_events.insert(0, (now, *event, detail))
        users = {job.id: job.user for job in jobs}
        key_rows = [(users.get(job_id, ""), key, job_id, now) for key, job_id in keys]
        parts: list[tuple[str, Sequence[Sequence[Any]]]] = [
            (UPSERT_JOB, rows),
            (EVENT, all_events),
            (SET_META, metas),
            (SUBMIT_KEY, key_rows),
            (REQUEST_KEY, [(user, key, answer, now) for user, key, answer in answers]),
        ]
        if ended_steps or live_steps or gone_steps:
            parts += self._step_parts(ended_steps, live_steps, gone_steps)

        def after() -> None:
            self._counted(top)
            self._remember_ended(jobs)

        return self._later_rows(parts, after, new_jobs)

    def _later_rows(
        self,
        parts: Sequence[tuple[str, Sequence[Sequence[Any]]]],
        after: Callable[[], None],
        new_jobs: bool,
    ) -> Later[None]:
        """A submit's or a change's rows handed to `_later` (a store may write new jobs
        its own way: PostgreSQL's submit lane)."""
        return self._later(lambda: _keyed(lambda: self._rows(parts)), after, new_jobs)

    def save_array(
        self,
        template: Job,
        indices: list[int],
        max_running: int | None,
        event: Event | None = None,
        key: str | None = None,
    ) -> None:
        self.save_array_later(template, indices, max_running, event, key).wait(self._bound())

    def save_array_later(
        self,
        template: Job,
        indices: list[int],
        max_running: int | None,
        event: Event | None = None,
        key: str | None = None,
    ) -> Later[None]:
        self._seq += 1
        seq = self._seq
        record = json.dumps(template.to_record(), separators=(",", ":"))
        top = self._top_id([template], max(indices, default=0))
        now = time.time()
        q = self._q

        def work(c: Any) -> None:
            # A retry after a commit whose answer was lost finds the row: nothing to add.
            cur = c.execute(
                q(
                    "INSERT INTO arrays(id, seq, active, indices, max_running, record) "
                    "VALUES (?,?,1,?,?,?) ON CONFLICT(id) DO NOTHING"
                ),
                (template.id, seq, arrays.encode_indices(indices), max_running, record),
            )
            if cur.rowcount == 0:
                return
            if event is not None:
                c.execute(q(EVENT), (now, *event, None))
            if top is not None:
                c.execute(q(SET_META), (LAST_JOB_ID, str(top)))
            if key is not None:
                c.execute(q(SUBMIT_KEY), (template.user, key, template.id, now))

        def after() -> None:
            self._counted(top)
            self._array_seq[template.id] = seq

        return self._later(lambda: _keyed(lambda: self._write(work)), after, new_jobs=True)

    def get_array(self, array_id: str) -> tuple[Job, tuple[int, ...], int | None] | None:
        row = self._one("SELECT record, indices, max_running FROM arrays WHERE id=?", (array_id,))
        if row is None:
            return None
        template = Job.from_record(json.loads(row[0]))
        return template, tuple(arrays.decode_indices(row[1])), row[2]

    def _array_record(self, array_id: str, reader: Any) -> str | None:
        sql = "SELECT record FROM arrays WHERE id=?"
        if reader is not None:  # read_finished's own connection
            row = reader.execute(self._q(sql), (array_id,)).fetchone()
        else:
            row = self._one(sql, (array_id,))
        return None if row is None else str(row[0])

    def load_active_jobs(self) -> list[Job]:
        found: list[tuple[int, int, Job]] = []
        for seq, record in self._all(
            "SELECT seq, record FROM jobs WHERE state IN (?, ?)", ACTIVE_STATES
        ):
            job = self._job(record)
            found.append((seq, -1 if job.array_task_id is None else job.array_task_id, job))
        for array_id, seq, indices, cap, record in self._all(
            "SELECT id, seq, indices, max_running, record FROM arrays WHERE active=1"
        ):
            rowed = {r[0] for r in self.job_rows_with_prefix(array_id + "_", limit=-1)}
            template = Job.from_record(json.loads(record))
            left = [i for i in arrays.decode_indices(indices) if f"{array_id}_{i}" not in rowed]
            if not left:  # every task has its row: the array row is history only
                self._change("UPDATE arrays SET active=0 WHERE id=?", (array_id,))
                self._array_seq.pop(array_id, None)
                continue
            found += [(seq, t.array_task_id or 0, t) for t in arrays.tasks(template, left, cap)]
        found.sort(key=lambda f: (f[0], f[1]))
        return [f[2] for f in found]

    def has_job(self, job_id: str) -> bool:
        row = self._one(
            "SELECT 1 FROM jobs WHERE id=? UNION ALL SELECT 1 FROM arrays WHERE id=? LIMIT 1",
            (job_id, job_id),
        )
        return row is not None

    def array_below(self, number: int) -> str | None:
        d = self.dialect
        if d.max_int is not None:  # a bigger one is below no stored id either
            number = min(number, d.max_int)
        row = self._one(
            f"SELECT id FROM (SELECT id, CASE WHEN {d.positive_number} THEN {d.as_number} END "
            "AS n FROM arrays) a WHERE n < ? ORDER BY n DESC LIMIT 1",
            (number,),
        )
        return None if row is None else str(row[0])

    def _job_record(self, job_id: str) -> str | None:
        row = self._one("SELECT record FROM jobs WHERE id=?", (job_id,))
        return None if row is None else str(row[0])

    def _job_records(self, job_ids: list[str]) -> list[tuple[str, str]]:
        rows = self._all_in("SELECT id, record FROM jobs", "id", job_ids)
        return [(str(r[0]), str(r[1])) for r in rows]

    def job_rows_with_prefix(
        self, prefix: str, after: str = "", limit: int = 5000
    ) -> list[tuple[str, str, str]]:
        rows = self._all(
            'SELECT id, state, "user" FROM jobs WHERE id > ? AND id < ? ORDER BY id LIMIT ?',
            (
                max(prefix, after),
                prefix + "\U0010ffff",
                self.dialect.no_limit if limit < 0 else limit,
            ),
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def finished_jobs(self, since: float | None = None, limit: int = 1000) -> list[Job]:
        rows = self._all(
            "SELECT record FROM jobs WHERE state NOT IN (?, ?) AND end_time >= ? "
            "ORDER BY end_time DESC LIMIT ?",
            (*ACTIVE_STATES, since or 0.0, limit),
        )
        return [self._job(r[0]) for r in rows]

    def count_by_state(self) -> dict[str, int]:
        rows = self._all("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {str(state): int(n) for state, n in rows}

    def read_finished(
        self,
        since: float,
        user: str | None = None,
        states: set[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """On a connection of the backend's own (`_read_apart`): a thread reads while the
        master writes."""
        where = ["state NOT IN (?, ?)", "end_time >= ?"]
        params: list[Any] = [*ACTIVE_STATES, since]
        if user:
            where.append('"user" = ?')
            params.append(user)
        if states:
            ((among, values),) = self.dialect.in_list("state", sorted(states))
            where.append(among)
            params += values
        sql = f"SELECT record FROM jobs WHERE {' AND '.join(where)} ORDER BY end_time DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        text = self._q(sql)
        return self._read_apart(
            lambda c: [self._job(r[0], c) for r in c.execute(text, params).fetchall()]
        )

    def jobs_with_prefix(self, prefix: str) -> list[Job]:
        rows = self._all(
            "SELECT record FROM jobs WHERE id >= ? AND id < ? ORDER BY seq",
            (prefix, prefix + "\U0010ffff"),
        )
        return [self._job(r[0]) for r in rows]

    # ---- srun steps (steps.py) --------------------------------------------

    def save_steps(
        self,
        rows: Sequence[steps.StepRow],
        live: Sequence[steps.LiveRow] = (),
        gone: Sequence[str] = (),
    ) -> None:
        """Store steps that ended, and prune their jobs to their last STEPS_KEPT; the
        running jobs' steps as they are now, and those of jobs that ended gone."""
        self._rows(self._step_parts(rows, live, gone))

    @staticmethod
    def _step_parts(
        rows: Sequence[steps.StepRow],
        live: Sequence[steps.LiveRow] = (),
        gone: Sequence[str] = (),
    ) -> list[tuple[str, Sequence[Sequence[Any]]]]:
        return [
            (steps.UPSERT, steps.upsert_rows(rows)),
            (steps.PRUNE, steps.prune_rows(rows)),
            (steps.LIVE_GONE, [(job_id,) for job_id in dict.fromkeys(gone)]),
            (steps.LIVE_UPSERT, steps.live_rows(live)),
        ]

    def live_steps(self) -> list[steps.LiveRow]:
        rows = self._all(steps.LIVE_ALL)
        return [(str(i), str(j), json.loads(r)) for i, j, r in rows]

    def steps_of(self, job_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The stored steps of these jobs, oldest first (jobs without any are left out)."""
        ids = list(dict.fromkeys(job_ids))
        sql = "SELECT job_id, record FROM job_steps"
        return steps.grouped(self._all_in(sql, "job_id", ids, "ORDER BY job_id, number"))

    def last_step_number(self, job_id: str) -> int | None:
        """The highest step number stored for the job (None: none)."""
        row = self._one(steps.LAST, (job_id,))
        return None if row is None or row[0] is None else int(row[0])

    def delete_steps(self, job_ids: Sequence[str]) -> None:
        """Forget the steps of these jobs (their rows were deleted)."""
        self._delete_in("job_steps", "job_id", job_ids)

    def _delete_in(self, table: str, column: str, values: Sequence[Any]) -> None:
        parts = self.dialect.in_list(column, values)
        if parts:
            q = self._q

            def work(c: Any) -> None:
                for where, params in parts:
                    c.execute(q(f"DELETE FROM {table} WHERE {where}"), params)

            self._write(work, one_query=len(parts) == 1)

    # ---- nodes and meta ---------------------------------------------------

    def save_node(self, node_id: str, record: dict[str, Any]) -> None:
        self._rows([(SAVE_NODE, [(node_id, json.dumps(record))])])

    def delete_node(self, node_id: str) -> None:
        self._change("DELETE FROM nodes WHERE node_id=?", (node_id,))

    def load_nodes(self) -> dict[str, dict[str, Any]]:
        return {r[0]: json.loads(r[1]) for r in self._all("SELECT node_id, record FROM nodes")}

    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key=?", (key,))
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._rows([(SET_META, [(key, value)])])

    # ---- audit events -----------------------------------------------------

    def record_event(
        self,
        kind: str,
        actor: str | None = None,
        address: str | None = None,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.record_events([(kind, actor, address, target, detail)])

    def record_events(
        self, rows: list[tuple[str, str | None, str | None, str | None, str | None]]
    ) -> None:
        """In line to be written when the database does not answer (StoreStalled): an
        audit row never fails what it records."""
        now = time.time()
        with contextlib.suppress(StoreStalled):
            self._rows([(EVENT, [(now, *row) for row in rows])])

    def events(self, since: float = 0.0, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT time, kind, actor, address, target, detail FROM events "
            "WHERE time >= ? ORDER BY id DESC LIMIT ?",
            (since, limit),
        )
        return [dict(zip(EVENT_KEYS, r, strict=True)) for r in rows]

    # ---- retention --------------------------------------------------------

    def users_of(self, job_ids: Sequence[str]) -> dict[str, str]:
        rows = self._all_in('SELECT id, "user" FROM jobs', "id", list(job_ids))
        return {str(i): str(u) for i, u in rows}

    def ended_between(
        self, after: tuple[float, str], before: float, limit: int
    ) -> list[tuple[str, str, float]]:
        end, job_id = after
        rows = self._all(
            'SELECT id, "user", end_time FROM jobs WHERE end_time >= ? AND end_time < ? '
            "AND (end_time > ? OR id > ?) AND state NOT IN (?, ?) "
            "ORDER BY end_time, id LIMIT ?",
            (end, before, end, job_id, *ACTIVE_STATES, limit),
        )
        return [(str(i), str(u), float(t)) for i, u, t in rows]

    def delete_ended_jobs(self, before: float, limit: int) -> list[tuple[str, str]]:
        select = self._q(
            'SELECT id, "user" FROM jobs WHERE end_time < ? AND state NOT IN (?, ?) '
            "ORDER BY end_time, id LIMIT ?"
        )
        delete = self._q("DELETE FROM jobs WHERE id=?")

        def work(c: Any) -> list[tuple[str, str]]:
            found = c.execute(select, (before, *ACTIVE_STATES, limit)).fetchall()
            rows = [(str(i), str(u)) for i, u in found]
            many(c, delete, [(i,) for i, _ in rows])
            return rows

        rows = self._write(work)
        for job_id, _ in rows:
            self._ended.pop(job_id, None)
        return rows

    def job_of_submit_key(self, key: str, user: str) -> str | None:
        row = self._one('SELECT job_id FROM submit_keys WHERE "user"=? AND key=?', (user, key))
        return None if row is None else str(row[0])

    def request_answer(self, user: str, key: str) -> str | None:
        row = self._one('SELECT answer FROM request_keys WHERE "user"=? AND key=?', (user, key))
        return None if row is None else str(row[0])

    def delete_request_keys_before(self, before: float, limit: int) -> int:
        return self._change(
            'DELETE FROM request_keys WHERE ("user", key) IN (SELECT "user", key '
            "FROM request_keys WHERE time < ? ORDER BY time LIMIT ?)",
            (before, limit),
        )

    def delete_submit_keys_before(self, before: float, limit: int) -> int:
        return self._change(
            'DELETE FROM submit_keys WHERE ("user", key) IN (SELECT "user", key '
            "FROM submit_keys WHERE time < ? ORDER BY time LIMIT ?)",
            (before, limit),
        )

    def delete_events_before(self, before: float, limit: int) -> int:
        return self._change(
            "DELETE FROM events WHERE id IN "
            "(SELECT id FROM events WHERE time < ? ORDER BY id LIMIT ?)",
            (before, limit),
        )

    # ---- reservations -----------------------------------------------------

    def save_reservation(
        self, name: str, record: dict[str, Any], event: tuple[str, str | None, str | None]
    ) -> None:
        insert = self._q("INSERT INTO reservations(name, record) VALUES (?, ?)")
        text, row, q = json.dumps(record), (time.time(), *event, name, None), self._q

        def work(c: Any) -> None:
            c.execute(insert, (name, text))
            c.execute(q(EVENT), row)

        self._write(work)

    def delete_reservations(
        self, names: list[str], event: tuple[str, str | None, str | None] | None = None
    ) -> None:
        now, delete, q = time.time(), self._q("DELETE FROM reservations WHERE name=?"), self._q

        def work(c: Any) -> None:
            many(c, delete, [(name,) for name in names])
            if event is not None:
                many(c, q(EVENT), [(now, *event, name, None) for name in names])

        self._write(work)

    def load_reservations(self) -> list[dict[str, Any]]:
        return [
            json.loads(r[0]) for r in self._all("SELECT record FROM reservations ORDER BY name")
        ]

    # ---- tokens -----------------------------------------------------------

    def insert_token(
        self,
        token_id: str,
        user: str,
        admin: bool,
        kind: str,
        digest: str,
        created: float,
        owner: bool = False,
        allow_root: bool = False,
    ) -> None:
        self._change(
            'INSERT INTO tokens(id, "user", admin, kind, hash, created, owner, allow_root) '
            "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
            (token_id, user, int(admin), kind, digest, created, int(owner), int(allow_root)),
        )

    def token_by_hash(self, digest: str, kind: str) -> TokenRow | None:
        row = self._one(
            'SELECT id, "user", admin, hash, owner, allow_root FROM tokens '
            "WHERE hash=? AND kind=? AND revoked IS NULL",
            (digest, kind),
        )
        return None if row is None else (str(row[0]), str(row[1]), *row[2:])

    def token_guard(self, token_id: str) -> tuple[bool, str] | None:
        row = self._one(
            "SELECT owner, kind FROM tokens WHERE id=? AND revoked IS NULL", (token_id,)
        )
        return None if row is None else (bool(row[0]), str(row[1]))

    def revoke_token(self, token_id: str, when: float) -> bool:
        sql = "UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL"
        return self._change(sql, (when, token_id)) > 0

    def list_tokens(self) -> list[dict[str, Any]]:
        rows = self._all(
            'SELECT id, "user", admin, kind, created, revoked, owner, allow_root FROM tokens '
            "ORDER BY created"
        )
        return [
            {**dict(zip(TOKEN_KEYS, r, strict=True)), "owner": bool(r[6]), "allow_root": bool(r[7])}
            for r in rows
        ]

    def has_owner_token(self) -> bool:
        return self._one("SELECT 1 FROM tokens WHERE owner=1 LIMIT 1") is not None

    def mark_owner_token(self, digest: str) -> None:
        self._change(
            "UPDATE tokens SET owner=1, allow_root=1 WHERE hash=? AND kind='user' AND admin=1",
            (digest,),
        )

    # ---- node secrets -----------------------------------------------------

    def node_secret_hash(self, node_id: str) -> str | None:
        row = self._one("SELECT hash FROM node_secrets WHERE node_id=?", (node_id,))
        return None if row is None else str(row[0])

    def set_node_secret(self, node_id: str, digest: str, created: float) -> None:
        self._change(
            "INSERT INTO node_secrets(node_id, hash, created) VALUES (?,?,?) "
            "ON CONFLICT(node_id) DO UPDATE SET hash=excluded.hash, created=excluded.created",
            (node_id, digest, created),
        )

    def forget_node_secret(self, node_id: str) -> bool:
        return self._change("DELETE FROM node_secrets WHERE node_id=?", (node_id,)) > 0


def _keyed(write: Callable[[], T]) -> T:
    """`write()`, a submit's transaction: a key stored already (its row's unique
    constraint; the backends' own errors) raises KeyTaken, nothing of it written."""
    try:
        return write()
    except Exception as e:
        taken = key_taken(e)
        if taken is e:
            raise
        raise taken from None


def key_taken(error: Exception) -> Exception:
    """KeyTaken for a submit's write that failed on its key's unique constraint (the
    backends' own errors); else `error` itself."""
    if "submit_keys" in str(error) and type(error).__name__ in (
        "IntegrityError",
        "UniqueViolation",
    ):
        return KeyTaken(str(error).splitlines()[0])
    return error
