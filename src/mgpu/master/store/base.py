"""The master's store: one interface, two implementations (SQLite, PostgreSQL).

The rest of the master calls only what `Store` declares here; `sqlite.py` (the default,
a file in the state dir) and `postgres.py` (`--database postgresql://...`, several masters
on one database) implement it with the same meaning, and the same tests run against both
(tests/stores.py).  They are the only modules with SQL.

What both keep in memory is here too: the submit order counter (`seq`), the job id
counter (`LAST_JOB_ID`), the jobs last written as ended (`RECENTLY_ENDED`), the scripts of
arrays read back lately.  A write updates that memory only once its transaction committed.

Each job is one row: a few indexed columns for queries plus the whole record as JSON.  The
srun steps a job ran are rows of their own (store/steps.py), never in its record.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from mgpu import spec as specs
from mgpu.master.runtime.loop import running_loop
from mgpu.master.store.errors import (  # re-exported: the store's callers catch them here
    ANSWER_WITHIN,
    RETRY_AFTER_S,
    KeyTaken,
    StoreError,
    StoreStalled,
    StoreUnavailable,
)
from mgpu.master.store.fence import Fence
from mgpu.model import Job

if TYPE_CHECKING:
    from mgpu.master.store.dbthread import Later

__all__ = [
    "ACTIVE_STATES",
    "ANSWER_WITHIN",
    "LAST_JOB_ID",
    "RECENTLY_ENDED",
    "RETRY_AFTER_S",
    "SCHEMA_VERSION",
    "SCRIPT_OF_ARRAY",
    "Event",
    "KeyTaken",
    "Store",
    "StoreError",
    "StoreStalled",
    "StoreUnavailable",
    "TokenRow",
]

ACTIVE_STATES = ("queued", "running")

SCRIPT_OF_ARRAY = "script_of_array"
"""In a task's stored record: its script is its array's (kept once, in the array's row)."""
SCRIPT_CACHE = 16
"""Arrays whose scripts are kept in memory for reading tasks back (each ≤ 1 MiB)."""

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

SCHEMA_VERSION = 4
"""The schema this mgpu writes (2 added `submit_keys`, 3 `job_steps`: store/steps.py, 4
`live_steps`, `request_keys` and submit keys by user: schema.py); the
store migrates an older database up to it at open (schema.py, `schema_version` table).  A database
from before versions existed counts as version 0."""

Event = tuple[str, str | None, str | None, str]
"""An audit event written with jobs: (kind, actor, address, target)."""

TokenRow = tuple[str, str, int, str, int, int]
"""A live token found by its hash: (id, user, admin, hash, owner, allow_root)."""

TOKEN_KEYS = ("id", "user", "admin", "kind", "created", "revoked", "owner", "allow_root")


def task_record(job: Job) -> dict[str, Any]:
    """A job's record to store: an array task's script (up to 1 MiB) is not copied into
    each of its up to 100,000 rows: the array's row holds it."""
    record = job.to_record()
    if job.array_job_id is not None and record.get("script") is not None:
        record["script"], record[SCRIPT_OF_ARRAY] = None, True
    return record


def encode(record: dict[str, Any]) -> str:
    """A job record as JSON: orjson, ten times quicker than json on these records (cancelling
    100,000 tasks writes 100,000 of them).  What orjson refuses (a lone surrogate in some
    string) is written by json as before; orjson writes an infinite float as null, which a
    record reads back as "no limit", its meaning anyway."""
    try:
        return orjson.dumps(record).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(record, separators=(",", ":"))


class Store(ABC):
    """The master's durable state.  Writes are transactions (all of it or nothing); every
    write first checks `fence` (a shared database: only the leader writes)."""

    fence: Fence

    answer_within: float | None = None
    """Seconds a caller on an event loop's thread waits for the database at most, then
    StoreStalled (None: as long as it takes; `mgpu master` sets it once it serves)."""

    def __init__(self) -> None:
        self.fence = Fence()
        self._scripts: dict[str, str | None] = {}
        """Scripts of arrays whose tasks were read back lately (SCRIPT_CACHE of them)."""
        self._ended: OrderedDict[str, Job] = OrderedDict()
        """The last RECENTLY_ENDED jobs written as ended, oldest first."""
        self._seq = 0
        self._array_seq: dict[str, int] = {}
        """Arrays with tasks that have no row yet: a task's first row takes the array's
        seq, so it keeps its place in the queue."""
        self._stored_id = specs.FIRST_JOB_ID - 1
        """The counter as stored (LAST_JOB_ID)."""
        self._last_id = self._stored_id
        """The highest id handed out (`new_job_id`), stored or not yet."""
        self._legacy_ids: set[str] = set()
        """`_digit_ids_above` the counter, read at open."""

    def reload(self) -> None:
        """Read again what the store keeps in memory (counters, active arrays) and forget
        its caches: at open, and when a standby master becomes the leader."""
        self._scripts.clear()
        self._ended.clear()
        self._seq, self._array_seq = self._load_seqs()
        self._stored_id = int(self.get_meta(LAST_JOB_ID) or specs.FIRST_JOB_ID - 1)
        self._last_id = self._stored_id
        self._legacy_ids = self._digit_ids_above(self._stored_id)

    @abstractmethod
    def _load_seqs(self) -> tuple[int, dict[str, int]]:
        """The highest seq stored, and the seq of each active array."""

    @abstractmethod
    def _digit_ids_above(self, counter: int) -> set[str]:
        """Ids an older mgpu stored (8 hex characters) that are all digits and above the
        counter: the only stored ids `new_job_id` could hand out again (every id this mgpu
        stores moves the counter in the same transaction)."""

    @abstractmethod
    def close(self) -> None:
        """Close the database (connections, background threads)."""

    def _bound(self) -> float | None:
        """How long this caller may wait for the database: `answer_within` on an event
        loop's thread (the master's), else as long as it takes."""
        if self.answer_within is None or running_loop() is None:
            return None
        return self.answer_within

    def answering(self) -> bool:
        """Whether the database answers now (False: it has kept a statement for longer
        than `answer_within`; reads are refused until it answers again)."""
        return True

    @abstractmethod
    def schema_version(self) -> int:
        """The version of the schema the database holds (SCHEMA_VERSION once opened)."""

    # ---- jobs -------------------------------------------------------------

    def new_job_id(self, block: int = 1) -> str:
        """The next job id of the cluster: one more than the last handed out, skipping an
        id an older mgpu stored (8 hex characters can all be digits).  `block`: ids taken
        from it on (an array's tasks each have a job number: `specs.task_job_number`)."""
        number = self._last_id + 1
        while specs.format_job_id(number) in self._legacy_ids:  # no query a submit
            number += 1
        self._last_id = number + max(block, 1) - 1
        return specs.format_job_id(number)

    def _top_id(self, jobs: Sequence[Job], top_index: int = 0) -> int | None:
        """The counter to store with `jobs` (an array's: past its block; `top_index` is its
        highest task index), or None if it does not move."""
        top = self._stored_id
        for job in jobs:
            base = job.array_job_id or job.id
            index = top_index if job.array_job_id is None else job.array_task_id or 0
            number = specs.task_job_number(base, index)
            if number is not None and number > top:
                top = number
        return top if top > self._stored_id else None

    def _counted(self, top: int | None) -> None:
        """After the commit that stored the counter `top`."""
        if top is not None:
            self._stored_id = max(self._stored_id, top)
            self._last_id = max(self._last_id, top)

    def _job_rows(self, jobs: list[Job]) -> list[tuple[Any, ...]]:
        """(id, seq, state, user, submit_time, end_time, record) of each job to write."""
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
                    encode(task_record(job)),
                )
            )
        return rows

    @abstractmethod
    def save_jobs(
        self,
        jobs: list[Job],
        event: Event | None = None,
        detail: str | None = None,
        meta: tuple[str, str] | None = None,
        events: Sequence[Event] = (),
        keys: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Write jobs in one transaction (a whole array is stored or nothing), with an
        optional audit event (kind, actor, address, target; detail), more `events` without
        a detail, a meta value (key, value) and submits' idempotency `keys` (key, job id)
        in the same one: one commit, not one each.
        A job's first row keeps its place (`seq`): submit order for the queue."""

    @abstractmethod
    def save_jobs_later(
        self,
        jobs: list[Job],
        event: Event | None = None,
        detail: str | None = None,
        meta: tuple[str, str] | None = None,
        events: Sequence[Event] = (),
        keys: Sequence[tuple[str, str]] = (),
        ended_steps: Sequence[tuple[str, dict[str, Any]]] = (),
        new_jobs: bool = False,
        live_steps: Sequence[tuple[str, str, dict[str, Any]]] = (),
        gone_steps: Sequence[str] = (),
        answers: Sequence[tuple[str, str, str]] = (),
    ) -> Later[None]:
        """`save_jobs` (and `save_steps`' rows: `ended_steps`, the running jobs' `live_steps`
        and the ended jobs' `gone_steps`; keyed requests' `answers`, (user, key, answer),
        a first one staying: in one transaction) handed to the store's thread:
        the group commits go on meanwhile and follow up once it is done (store/dbthread.py).
        `new_jobs`: only jobs never written before, which nothing else writes until this is
        done (a submit's): PostgreSQL writes them beside the other writes.  SQLite writes at
        once."""

    def _remember_ended(self, jobs: list[Job]) -> None:
        """After the commit: the ended jobs just written, for get_job(s)."""
        ended = self._ended
        for job in jobs[-RECENTLY_ENDED:]:  # 100,000 tasks cancelled: the last few
            if job.state.terminal:
                ended[job.id] = job
                ended.move_to_end(job.id)
        while len(ended) > RECENTLY_ENDED:
            ended.popitem(last=False)

    @abstractmethod
    def save_array(
        self,
        template: Job,
        indices: list[int],
        max_running: int | None,
        event: Event | None = None,
        key: str | None = None,
    ) -> None:
        """Store an array as one row (`mgpu.master.store.arrays`): its tasks are the template at
        each index until they change; with the audit event and the submit's idempotency
        `key`, in one transaction."""

    @abstractmethod
    def save_array_later(
        self,
        template: Job,
        indices: list[int],
        max_running: int | None,
        event: Event | None = None,
        key: str | None = None,
    ) -> Later[None]:
        """`save_array` handed to the store's thread (SQLite: at once)."""

    @abstractmethod
    def job_of_submit_key(self, key: str, user: str) -> str | None:
        """The job `user`'s submit with this idempotency key stored (None: none did, or it
        was pruned): a client that lost the answer and asks again gets that job, not a new
        one.  A key is its user's: another user's same key is another submit."""

    @abstractmethod
    def delete_submit_keys_before(self, before: float, limit: int) -> int:
        """Forget up to `limit` idempotency keys stored before `before`; how many went."""

    @abstractmethod
    def request_answer(self, user: str, key: str) -> str | None:
        """The answer stored for `user`'s request with this idempotency key (a job-control
        request, a step's start: control/requestkeys.py), or None."""

    @abstractmethod
    def delete_request_keys_before(self, before: float, limit: int) -> int:
        """Forget up to `limit` request keys stored before `before`; how many went."""

    # ---- srun steps (store/steps.py; the queries: sqlstore.py) ---------------------------

    @abstractmethod
    def save_steps(
        self,
        rows: Sequence[tuple[str, dict[str, Any]]],
        live: Sequence[tuple[str, str, dict[str, Any]]] = (),
        gone: Sequence[str] = (),
    ) -> None:
        """Store steps that ended (job id, step), one row each, in one transaction; each of
        their jobs keeps its last `steps.STEPS_KEPT`.  In the same one: the running jobs'
        steps as they stand now (`live`: step id, job id, record) and the jobs whose steps
        are all forgotten (`gone`: they ended)."""

    @abstractmethod
    def live_steps(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The running jobs' steps as last stored (step id, job id, record), in no order."""

    @abstractmethod
    def steps_of(self, job_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The stored steps of these jobs, oldest first (jobs without any are left out)."""

    @abstractmethod
    def last_step_number(self, job_id: str) -> int | None:
        """The highest step number stored for the job (None: none)."""

    @abstractmethod
    def delete_steps(self, job_ids: Sequence[str]) -> None:
        """Forget the steps of these jobs (their rows were deleted)."""

    @abstractmethod
    def get_array(self, array_id: str) -> tuple[Job, tuple[int, ...], int | None] | None:
        """An array stored as one row: (template, task indices, running cap).  The indices
        are a tuple, which the cyclic collector stops tracking."""

    def _job(self, text: str, reader: Any = None) -> Job:
        """A stored job record read back, an array task's script from its array's row
        (`reader`: the connection to read it through, else the store's own)."""
        record = json.loads(text)
        if record.pop(SCRIPT_OF_ARRAY, False):
            record["script"] = self._array_script(record["array_job_id"], reader)
        return Job.from_record(record)

    def _array_script(self, array_id: str, reader: Any) -> str | None:
        script = self._scripts.get(array_id)
        if script is None:
            text = self._array_record(array_id, reader)
            script = None if text is None else json.loads(text).get("script")
            if len(self._scripts) >= SCRIPT_CACHE:
                self._scripts.pop(next(iter(self._scripts)), None)
            self._scripts[array_id] = script
        return script

    @abstractmethod
    def _array_record(self, array_id: str, reader: Any) -> str | None:
        """The stored template record of an array (JSON), or None."""

    @abstractmethod
    def load_active_jobs(self) -> list[Job]:
        """Queued and running jobs in submit order: stored rows, and the tasks of arrays
        that have no row of their own yet (made from the array's template)."""

    @abstractmethod
    def has_job(self, job_id: str) -> bool:
        """Whether the id is taken (by a job, or by an array)."""

    @abstractmethod
    def array_below(self, number: int) -> str | None:
        """The numeric array id nearest below `number`: the only array whose block of task
        numbers (`specs.task_job_number`) can hold it."""

    def get_job(self, job_id: str) -> Job | None:
        """A job by id (a job just ended: from memory), or None."""
        job = self._ended.get(job_id)
        if job is not None:
            return job
        text = self._job_record(job_id)
        return None if text is None else self._job(text)

    @abstractmethod
    def _job_record(self, job_id: str) -> str | None:
        """A job's stored record (JSON), or None."""

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
        if unique:
            out.update((i, self._job(text)) for i, text in self._job_records(unique))
        return out

    @abstractmethod
    def _job_records(self, job_ids: list[str]) -> list[tuple[str, str]]:
        """(id, record) of those of these (distinct) ids that are stored."""

    @abstractmethod
    def job_rows_with_prefix(
        self, prefix: str, after: str = "", limit: int = 5000
    ) -> list[tuple[str, str, str]]:
        """(id, state, user) of jobs whose id starts with `prefix`, in id order (bytes of
        the text) from just after `after`: a page at a time, so a 100,000-task array is
        never read at once.  A negative limit: all of them."""

    @abstractmethod
    def finished_jobs(self, since: float | None = None, limit: int = 1000) -> list[Job]:
        """Ended jobs that ended at or after `since`, newest first."""

    @abstractmethod
    def count_by_state(self) -> dict[str, int]:
        """How many stored rows each job state has."""

    @abstractmethod
    def read_finished(
        self,
        since: float,
        user: str | None = None,
        states: set[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs that ended at or after `since`, newest first, through a connection of their
        own: safe to call from a thread, so that a long history does not hold up the
        event loop."""

    @abstractmethod
    def jobs_with_prefix(self, prefix: str) -> list[Job]:
        """Jobs whose id starts with `prefix`, in submit order."""

    # ---- nodes and meta ---------------------------------------------------

    @abstractmethod
    def save_node(self, node_id: str, record: dict[str, Any]) -> None:
        """Store (or replace) a node's record."""

    @abstractmethod
    def delete_node(self, node_id: str) -> None:
        """Forget a node's record."""

    @abstractmethod
    def load_nodes(self) -> dict[str, dict[str, Any]]:
        """Every stored node record by node id."""

    @abstractmethod
    def get_meta(self, key: str) -> str | None:
        """A meta value, or None."""

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None:
        """Store a meta value."""

    # ---- audit events -----------------------------------------------------

    @abstractmethod
    def record_event(
        self,
        kind: str,
        actor: str | None = None,
        address: str | None = None,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        """One audit event."""

    @abstractmethod
    def record_events(
        self, rows: list[tuple[str, str | None, str | None, str | None, str | None]]
    ) -> None:
        """Several events (kind, actor, address, target, detail) in one transaction."""

    @abstractmethod
    def events(self, since: float = 0.0, limit: int = 1000) -> list[dict[str, Any]]:
        """Audit events at or after `since`, newest first."""

    # ---- retention (master/control/retention.py): small slices, oldest first ------------

    @abstractmethod
    def users_of(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The user of each of these jobs that has a row."""

    @abstractmethod
    def ended_between(
        self, after: tuple[float, str], before: float, limit: int
    ) -> list[tuple[str, str, float]]:
        """(id, user, end time) of ended jobs that ended before `before` and after `after`
        (the end time and id of the previous slice's last row), in that order."""

    @abstractmethod
    def delete_ended_jobs(self, before: float, limit: int) -> list[tuple[str, str]]:
        """Delete up to `limit` rows of jobs that ended before `before`, oldest first:
        their (id, user)."""

    @abstractmethod
    def delete_events_before(self, before: float, limit: int) -> int:
        """Delete up to `limit` audit events older than `before`; how many went."""

    # ---- reservations -----------------------------------------------------

    @abstractmethod
    def save_reservation(
        self, name: str, record: dict[str, Any], event: tuple[str, str | None, str | None]
    ) -> None:
        """Store a new reservation with its audit event (kind, actor, address) at once."""

    @abstractmethod
    def delete_reservations(
        self, names: list[str], event: tuple[str, str | None, str | None] | None = None
    ) -> None:
        """Forget reservations (deleted, or ended), with one audit event each if given."""

    @abstractmethod
    def load_reservations(self) -> list[dict[str, Any]]:
        """Every stored reservation, by name."""

    # ---- tokens (master/security/auth.py) ---------------------------------

    @abstractmethod
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
        """Store a new token (only the hash of its secret)."""

    @abstractmethod
    def token_by_hash(self, digest: str, kind: str) -> TokenRow | None:
        """The live (not revoked) token of this kind with this hash."""

    @abstractmethod
    def token_guard(self, token_id: str) -> tuple[bool, str] | None:
        """(owner, kind) of a live token, or None."""

    @abstractmethod
    def revoke_token(self, token_id: str, when: float) -> bool:
        """Mark a live token revoked; whether one was."""

    @abstractmethod
    def list_tokens(self) -> list[dict[str, Any]]:
        """Every token (TOKEN_KEYS; owner and allow_root as bools), oldest first."""

    @abstractmethod
    def has_owner_token(self) -> bool:
        """Whether a token is marked as the owner's."""

    @abstractmethod
    def mark_owner_token(self, digest: str) -> None:
        """Mark the admin user token with this hash as the owner's (state dirs made before
        the owner mark)."""

    # ---- node secrets (master/security/nodeauth.py) -----------------------

    @abstractmethod
    def node_secret_hash(self, node_id: str) -> str | None:
        """The stored hash of a node's secret, or None."""

    @abstractmethod
    def set_node_secret(self, node_id: str, digest: str, created: float) -> None:
        """Store (or replace) the hash of a node's secret."""

    @abstractmethod
    def forget_node_secret(self, node_id: str) -> bool:
        """Forget a node's secret; whether there was one."""
