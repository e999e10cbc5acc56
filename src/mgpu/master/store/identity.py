"""The cluster's identity in a shared database: one row, sealed by the ha layer.

The CA's key and certificate and the join and admin tokens are the same on every master of
a cluster (master/ha/identity.py seals them with a key derived from the cluster secret and
opens them).  This module is the SQL: the row is written once, insert-if-absent, so two
masters starting at once make one identity (each reads back the one that won).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

__all__ = ["IDENTITY_TABLE", "SealedIdentity", "ensure_table", "insert_if_absent", "read"]

IDENTITY_TABLE = "mgpu_identity"

IDENTITY_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {IDENTITY_TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL,
    salt BYTEA NOT NULL,
    nonce BYTEA NOT NULL,
    sealed BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class SealedIdentity:
    version: int
    salt: bytes
    nonce: bytes
    sealed: bytes


def ensure_table(conn: Any) -> None:
    import psycopg

    # CREATE TABLE IF NOT EXISTS is not atomic: the loser of a race meets the winner's
    # row type (DuplicateObject) or catalogue row (UniqueViolation), all harmless.
    duplicate = (
        psycopg.errors.UniqueViolation,
        psycopg.errors.DuplicateTable,
        psycopg.errors.DuplicateObject,
    )
    with contextlib.suppress(*duplicate):
        conn.execute(IDENTITY_SCHEMA)


def insert_if_absent(conn: Any, identity: SealedIdentity) -> bool:
    """Store the identity unless one is there already; True if this one was stored.

    Written before any master leads (a standby needs the CA to serve), so no lease
    generation fences it: the row is only ever inserted once, never changed."""
    row = conn.execute(
        f"INSERT INTO {IDENTITY_TABLE} (id, version, salt, nonce, sealed) "
        "VALUES (1, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING id",
        (identity.version, identity.salt, identity.nonce, identity.sealed),
    ).fetchone()
    return row is not None


def read(conn: Any) -> SealedIdentity | None:
    row = conn.execute(
        f"SELECT version, salt, nonce, sealed FROM {IDENTITY_TABLE} WHERE id = 1"
    ).fetchone()
    if row is None:
        return None
    return SealedIdentity(int(row[0]), bytes(row[1]), bytes(row[2]), bytes(row[3]))
