"""Fencing: a master writes to a shared database only while it holds the leader's lease.

Several masters on one PostgreSQL database elect a leader through one row, `mgpu_lease`
(`store/lease.py` takes and renews it).  Each time a master takes the lease the row's
`generation` grows by one.  The leader's every write transaction first reads that row with
`FOR KEY SHARE` and goes on only if the generation is still its own: a standby's takeover
(which locks the row `FOR UPDATE` first, store/lease.py) waits for a write in flight to
commit, and every write after it sees the new generation and is refused.  The leader's
own renewals (an UPDATE of the row's expiry, which locks it `FOR NO KEY UPDATE`) neither
wait for its writes nor hold them up: with `FOR SHARE`, a renewal waited for a moment
when no write held the row (10 ms a renewal on a busy leader, longer the busier it is:
a lease that could run out for want of a gap) and then stopped every write until it
committed.  The check is one statement (`statement()`) that fails unless the generation
is this master's, so a transaction of a few rows is sent as one query, the check first:
one round trip, one implicit transaction (postgres.py).  A deposed leader that wakes up
(SIGSTOP, a long pause, a network cut healed) therefore cannot change anything, whatever
it believes.

SQLite has one master: its store never fences (`Fence.generation` stays None).
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

LEASE_TABLE = "mgpu_lease"

REFUSED = "mgpu-fenced"
"""What `statement()` fails with (in the error's message) when the lease is not this
master's."""

LEASE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation BIGINT NOT NULL,
    holder TEXT NOT NULL,
    address TEXT,
    expires_at TIMESTAMPTZ NOT NULL
)
"""
"""One row (id 1) once any master has led; times are the database's (`now()`), so the
masters' clocks need not agree."""


class Fenced(RuntimeError):
    """This master's lease is gone: another master leads, this one must not write."""


class Executes(Protocol):
    def execute(self, query: Any, params: Any = ...) -> Any: ...


class Fence:
    """The generation this master leads with (None: not fenced), checked in each write
    transaction through `check(conn)`."""

    def __init__(self) -> None:
        self.generation: int | None = None
        self.lost = False
        """Set once a check failed: the master steps down (never writes again)."""

    def statement(self) -> str | None:
        """The check as one statement to send first in a write transaction's query (None:
        nothing to check).  It fails (PostgreSQL's invalid_text_representation naming
        REFUSED, `refused`) unless the row carries this master's generation, and holds the
        row FOR KEY SHARE until the transaction ends.  Fenced at once once a check failed."""
        if self.lost:
            self.deny(None)
        if self.generation is None:
            return None
        return (
            f"SELECT CAST(COALESCE((SELECT CASE WHEN generation = {int(self.generation)} "
            f"THEN '1' END FROM {LEASE_TABLE} WHERE id = 1 FOR KEY SHARE), '{REFUSED}') AS integer)"
        )

    @staticmethod
    def refused(error: BaseException) -> bool:
        """Whether `error` is `statement()`'s refusal."""
        return getattr(error, "sqlstate", None) == "22P02" and REFUSED in str(error)

    def deny(self, conn: Executes | None) -> NoReturn:
        """Raise Fenced, for good (`conn`, out of any transaction: to say which generation
        leads now)."""
        row = None
        if conn is not None:
            try:
                row = conn.execute(f"SELECT generation FROM {LEASE_TABLE} WHERE id = 1").fetchone()
            except Exception:
                row = None
        raise self.fenced(None if row is None else row[0])

    def fenced(self, leading: object) -> Fenced:
        """The error to raise, for good, now that a check failed (`leading`: the
        generation the lease row carries, None if unknown)."""
        self.lost = True
        return Fenced(
            f"another master leads now (generation {leading}, "
            f"this master's {self.generation}): this master stopped writing"
        )

    def check(self, conn: Executes) -> None:
        """Inside a write transaction, before its first write: raise Fenced unless the
        lease row still carries this master's generation."""
        if self.generation is None and not self.lost:
            return
        row = conn.execute(
            f"SELECT generation FROM {LEASE_TABLE} WHERE id = 1 FOR KEY SHARE"
        ).fetchone()
        if self.lost or row is None or int(row[0]) != self.generation:
            raise self.fenced(None if row is None else row[0])
