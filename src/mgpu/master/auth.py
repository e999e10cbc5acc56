"""Tokens: who may join as an agent, and who a client acts for.

A token is `mgpu_<secret>.<ca fingerprint>`.  Only the SHA-256 of the secret is
stored (the secret has 256 random bits, so a fast hash is enough).  The master
writes `join-token` and `admin-token` (mode 0600) in its state dir at first
start; the admin token acts for the account that started the master.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_PREFIX = "mgpu_"
JOB_TOKEN_PREFIX = "mgpujob_"
"""A job's own credential, `mgpujob_<job id>_<secret>.<fingerprint>`: set as $MGPU_TOKEN
inside the job so `mgpu rsh`, `mgpu queue` or `mgpu cancel` there act as the job's user,
and valid only while that run of the job is running (like Slurm's job credential)."""
JOIN = "join"

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    admin INTEGER NOT NULL,
    kind TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    revoked REAL
);
"""


@dataclass(frozen=True)
class Identity:
    user: str
    admin: bool
    token_id: str


def split_token(token: str) -> tuple[str, str | None]:
    """(secret, CA fingerprint or None)."""
    token = token.strip()
    secret, _, fp = token.partition(".")
    return secret, (fp or None)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    def __init__(self, db: sqlite3.Connection, state_dir: Path, fingerprint: str) -> None:
        self.db = db
        self.state_dir = state_dir
        self.fingerprint = fingerprint
        db.executescript(SCHEMA)
        self._cache: dict[str, Identity | None] = {}

    def _new(self, user: str, admin: bool, kind: str) -> tuple[str, str]:
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = secrets.token_hex(4)
        self.db.execute(
            "INSERT INTO tokens(id, user, admin, kind, hash, created) VALUES (?,?,?,?,?,?)",
            (token_id, user, int(admin), kind, _hash(secret), time.time()),
        )
        return token_id, f"{secret}.{self.fingerprint}"

    def bootstrap(self, owner: str) -> None:
        """First start: the join token and the owner's admin token, as 0600 files."""
        for name, kind, admin in (("join-token", JOIN, False), ("admin-token", "user", True)):
            path = self.state_dir / name
            if path.exists():
                continue
            _, token = self._new(owner if kind != JOIN else "-", admin, kind)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")

    def create(self, user: str, admin: bool) -> tuple[str, str]:
        self._cache.clear()
        return self._new(user, admin, "user")

    def revoke(self, token_id: str) -> bool:
        cur = self.db.execute(
            "UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (time.time(), token_id)
        )
        self._cache.clear()
        return cur.rowcount > 0

    def list(self) -> list[dict[str, Any]]:
        cur = self.db.execute(
            "SELECT id, user, admin, kind, created, revoked FROM tokens ORDER BY created"
        )
        keys = ("id", "user", "admin", "kind", "created", "revoked")
        return [dict(zip(keys, r, strict=True)) for r in cur]

    def _lookup(self, secret: str, kind: str) -> Identity | None:
        key = f"{kind}:{secret}"
        if key in self._cache:
            return self._cache[key]
        digest = _hash(secret)
        row = self.db.execute(
            "SELECT id, user, admin, hash FROM tokens WHERE hash=? AND kind=? AND revoked IS NULL",
            (digest, kind),
        ).fetchone()
        ident = None
        if row is not None and hmac.compare_digest(row[3], digest):
            ident = Identity(user=row[1], admin=bool(row[2]), token_id=row[0])
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[key] = ident
        return ident

    def user(self, token: str | None) -> Identity | None:
        if not token:
            return None
        return self._lookup(split_token(token)[0], "user")

    def join(self, token: str | None) -> bool:
        if not token:
            return False
        return self._lookup(split_token(token)[0], JOIN) is not None


class BadTokenThrottle:
    """Slow down an address that keeps presenting bad tokens (exponential, capped)."""

    def __init__(self, free: int = 3, cap: float = 2.0) -> None:
        self.free = free
        self.cap = cap
        self._fails: dict[str, tuple[int, float]] = {}

    def delay(self, address: str) -> float:
        count, last = self._fails.get(address, (0, 0.0))
        if time.monotonic() - last > 300:
            return 0.0
        over = count - self.free
        return 0.0 if over < 0 else min(self.cap, 0.05 * 2 ** min(over, 20))  # no overflow

    def failed(self, address: str) -> None:
        count, last = self._fails.get(address, (0, 0.0))
        if time.monotonic() - last > 300:
            count = 0
        self._fails[address] = (count + 1, time.monotonic())
        if len(self._fails) > 10000:
            self._fails.clear()

    def succeeded(self, address: str) -> None:
        self._fails.pop(address, None)


def new_job_token(job_id: str, fingerprint: str) -> str:
    # Hex, so the last "_" always separates the secret from the job id (array tasks have one).
    return f"{JOB_TOKEN_PREFIX}{job_id}_{secrets.token_hex(24)}.{fingerprint}"


def job_of_token(token: str) -> str | None:
    """The job id a job token names, or None for any other token."""
    secret, _ = split_token(token)
    if not secret.startswith(JOB_TOKEN_PREFIX):
        return None
    job_id, sep, _ = secret[len(JOB_TOKEN_PREFIX) :].rpartition("_")
    return job_id if sep else None


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(split_token(a)[0].encode(), split_token(b)[0].encode())
