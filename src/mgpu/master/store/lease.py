"""The leader's lease in a shared PostgreSQL database: take it, renew it, read it, let it go.

One row (`fence.LEASE_TABLE`, id 1).  Every time is the database's `clock_timestamp()`,
never a master's clock: masters on different machines need not agree on the time, only
the database's clock decides when a lease has run out.  Each statement runs on its own
(autocommit), but a take: it locks the row `FOR UPDATE`, then one `INSERT ... ON CONFLICT
DO UPDATE ... WHERE` bumps the generation by one only when no row exists or the row's lease
has expired, so two standbys racing for it cannot both win (the row is locked by the
first; the second sees its new expiry and gets no row back).  The lock makes the take wait
for every write transaction of the old leader in flight (they hold the row `FOR KEY
SHARE`: `fence.Fence.check`), so no write of an older generation lands after a newer one
began.  A renewal changes no key and takes no such lock: it does not wait for the leader's
writes, nor they for it.

That wait is bounded (`lock_timeout`): a leader stopped (SIGSTOP), paused or cut off inside
a write transaction would otherwise hold the row, and every standby's take behind it, for
as long as its session lives: for ever while stopped, two hours after a network cut.  A
take that times out on the lock while the lease has expired by the database's clock ends
the expired holder's backends (`end_expired`: every connection of a master is tagged with
its holder, store/pglink.py), which releases the row; the next take gets it.

The election and its timing are the `ha` layer's (master/ha/leadership.py); this module is
the SQL.
"""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass
from typing import Any

from mgpu.master.store.fence import LEASE_SCHEMA, LEASE_TABLE

__all__ = ["LeaseRow", "end_expired", "ensure_table", "read", "release", "renew", "take"]


@dataclass(frozen=True)
class LeaseRow:
    generation: int
    holder: str
    address: str | None
    expires_at: datetime.datetime
    live: bool
    """Whether the lease is still held by the database's clock (expires_at > now)."""


def ensure_table(conn: Any) -> None:
    """Create the lease table if it is not there (two masters may race: the loser's
    duplicate is harmless)."""
    import psycopg

    # CREATE TABLE IF NOT EXISTS is not atomic: the loser of a race meets the winner's
    # row type (DuplicateObject) or catalogue row (UniqueViolation), all harmless.
    duplicate = (
        psycopg.errors.UniqueViolation,
        psycopg.errors.DuplicateTable,
        psycopg.errors.DuplicateObject,
    )
    with contextlib.suppress(*duplicate):
        conn.execute(LEASE_SCHEMA)


def take(
    conn: Any, holder: str, address: str | None, ttl: float, lock_timeout: float | None = None
) -> int | None:
    """Take the lease if no one holds it (absent or expired): the new generation, else None.
    `lock_timeout`: seconds to wait for the row's lock at most (then
    psycopg.errors.LockNotAvailable; `conn` in autocommit: the take is one transaction)."""
    with conn.transaction():
        if lock_timeout is not None:
            conn.execute(f"SET LOCAL lock_timeout = {max(1, round(lock_timeout * 1000))}")
        # The upsert's own lock (FOR NO KEY UPDATE) would not wait for the writes' FOR KEY
        # SHARE: this one does.
        conn.execute(f"SELECT 1 FROM {LEASE_TABLE} WHERE id = 1 FOR UPDATE")
        return _take(conn, holder, address, ttl)


def _take(conn: Any, holder: str, address: str | None, ttl: float) -> int | None:
    row = conn.execute(
        f"""
        INSERT INTO {LEASE_TABLE} AS l (id, generation, holder, address, expires_at)
        VALUES (1, 1, %(holder)s, %(address)s,
                clock_timestamp() + %(ttl)s * interval '1 second')
        ON CONFLICT (id) DO UPDATE
            SET generation = l.generation + 1,
                holder = EXCLUDED.holder,
                address = EXCLUDED.address,
                expires_at = clock_timestamp() + %(ttl)s * interval '1 second'
            WHERE l.expires_at <= clock_timestamp()
        RETURNING generation
        """,
        {"holder": holder, "address": address, "ttl": ttl},
    ).fetchone()
    return None if row is None else int(row[0])


def renew(conn: Any, holder: str, generation: int, address: str | None, ttl: float) -> bool:
    """Extend the lease by `ttl` from now, only while it is still this holder's
    generation (an expired lease no one took is renewed too: no other master wrote
    meanwhile, as none had a newer generation).  False: lost."""
    row = conn.execute(
        f"""
        UPDATE {LEASE_TABLE}
           SET expires_at = clock_timestamp() + %(ttl)s * interval '1 second',
               address = %(address)s
         WHERE id = 1 AND holder = %(holder)s AND generation = %(generation)s
        RETURNING generation
        """,
        {"holder": holder, "generation": generation, "address": address, "ttl": ttl},
    ).fetchone()
    return row is not None


def read(conn: Any) -> LeaseRow | None:
    """The lease as the database has it now (None: no master has led yet)."""
    row = conn.execute(
        f"SELECT generation, holder, address, expires_at, expires_at > clock_timestamp() "
        f"FROM {LEASE_TABLE} WHERE id = 1"
    ).fetchone()
    if row is None:
        return None
    return LeaseRow(int(row[0]), str(row[1]), row[2], row[3], bool(row[4]))


def end_expired(conn: Any, row: LeaseRow, tag: str) -> list[int]:
    """End every backend whose application_name starts with `tag` (the tag of `row`'s
    holder, store/pglink.py), if the lease is still `row`'s generation and has expired by
    the database's clock: the pids ended.  Checked in the same statement, so a lease its
    holder renewed meanwhile leaves its backends alone; never this connection's own."""
    rows = conn.execute(
        f"""
        WITH expired AS MATERIALIZED (
            SELECT a.pid FROM pg_stat_activity a
             WHERE starts_with(a.application_name, %(tag)s)
               AND a.pid <> pg_backend_pid()
               AND a.datname = current_database()
               AND EXISTS (SELECT 1 FROM {LEASE_TABLE} l
                            WHERE l.id = 1 AND l.generation = %(generation)s
                              AND l.holder = %(holder)s
                              AND l.expires_at <= clock_timestamp()))
        SELECT pid FROM expired WHERE pg_terminate_backend(pid)
        """,
        {"tag": tag, "generation": row.generation, "holder": row.holder},
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


def release(conn: Any, holder: str, generation: int) -> bool:
    """Give the lease up at once (a leader shutting down cleanly, after its last write):
    a standby takes it at its next try instead of after the TTL."""
    row = conn.execute(
        f"""
        UPDATE {LEASE_TABLE} SET expires_at = clock_timestamp() - interval '1 second'
         WHERE id = 1 AND holder = %(holder)s AND generation = %(generation)s
        RETURNING generation
        """,
        {"holder": holder, "generation": generation},
    ).fetchone()
    return row is not None
