"""Tokens: who may join as an agent, and who a client acts for.

A token is `mgpu_<secret>.<ca fingerprint>`, and a TLS master's ends with `.tls`
(mgpu.tokens).  Only the SHA-256 of the secret is stored (the secret has 256 random
bits, so a fast hash is enough).  The master writes `join-token` and `admin-token`
(mode 0600) in its state dir at first start, and at each start marks them for the
mode it serves in; the admin token acts for the account that started the master and
is the *owner's* token: the only one whose jobs may run as uid 0, besides tokens
given an explicit `--allow-root` grant (which only the owner can make).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu.master.store.base import Store
from mgpu.privatefile import write_private
from mgpu.tokens import (
    JOB_TOKEN_PREFIX,
    TOKEN_PREFIX,
    hash_secret,
    remarked,
    split_token,
    token_hash,
    token_suffix,
)

JOIN = "join"


@dataclass(frozen=True)
class Identity:
    user: str
    admin: bool
    token_id: str
    owner: bool = False
    """The owner's admin token (the bootstrap `admin-token`)."""
    allow_root: bool = False
    """May its jobs run as uid 0: the owner, an `--allow-root` grant (Cluster.identify
    drops it while `security.allow_root_jobs` is off), a job's credential as its job."""


def user_of(kind: str, owner: str) -> str:
    """Whom a bootstrap token acts for: the join token for no one, the admin token for the
    owner."""
    return owner if kind != JOIN else "-"


class TokenStore:
    def __init__(self, store: Store, state_dir: Path, fingerprint: str, tls: bool = False) -> None:
        self.store = store
        self.state_dir = state_dir
        self.fingerprint = fingerprint
        self.tls = tls
        """The master serves TLS: every token it hands out says so (mgpu.tokens.TLS_MARK)."""
        self.suffix = token_suffix(fingerprint, tls)
        """What follows a new token's secret and its '.'."""
        self._cache: dict[str, Identity | None] = {}

    def _new(
        self, user: str, admin: bool, kind: str, owner: bool = False, allow_root: bool = False
    ) -> tuple[str, str]:
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = secrets.token_hex(4)
        self.store.insert_token(
            token_id, user, admin, kind, hash_secret(secret), time.time(), owner, allow_root
        )
        return token_id, f"{secret}.{self.suffix}"

    def bootstrap(self, owner: str) -> None:
        """First start: the join token and the owner's admin token, as 0600 files; at each
        start they are marked for the mode this master serves in (`mark_token_file`)."""
        for name, kind, admin in (("join-token", JOIN, False), ("admin-token", "user", True)):
            path = self.state_dir / name
            if path.exists():
                self._adopt(path, user_of(kind, owner), admin, kind)
                mark_token_file(path, self.tls)
                continue
            _, token = self._new(user_of(kind, owner), admin, kind, owner=admin, allow_root=admin)
            write_private(path, (token + "\n").encode())  # never seen empty or half
        self._mark_owner()

    def _adopt(self, path: Path, user: str, admin: bool, kind: str) -> None:
        """A token file whose token the database does not know: registered.  Masters on one
        database share the cluster's identity (master/ha/identity.py): the files come from
        the database's sealed identity, and the first master to lead registers them."""
        try:
            token = path.read_text().strip()
        except OSError:
            return
        secret, _ = split_token(token)
        if not secret.startswith(TOKEN_PREFIX):
            return
        digest = hash_secret(secret)
        if self.store.token_by_hash(digest, kind) is not None:
            return  # known (the usual case)
        if admin and self.store.has_owner_token():
            return  # the owner's token is another one
        if not admin and any(t["kind"] == kind for t in self.store.list_tokens()):
            return  # a join token was made here, and perhaps revoked: never revived
        if admin and any(t["kind"] == "user" and t["admin"] for t in self.store.list_tokens()):
            return  # a state dir from before the owner mark: `_mark_owner` marks it
        self.store.insert_token(
            secrets.token_hex(4), user, admin, kind, digest, time.time(), admin, admin
        )

    def _mark_owner(self) -> None:
        """State dirs made before the owner mark: the token in `admin-token` is the owner's."""
        if self.store.has_owner_token():
            return
        try:
            token = (self.state_dir / "admin-token").read_text().strip()
        except OSError:
            return
        self.store.mark_owner_token(token_hash(token))

    def create(self, user: str, admin: bool, allow_root: bool = False) -> tuple[str, str]:
        # Only the secrets found unknown may have changed; the known ones stay, so that
        # they are still served while the database does not answer (store/dbthread.py).
        self._cache = {k: v for k, v in self._cache.items() if v is not None}
        return self._new(user, admin, "user", allow_root=allow_root)

    def guarded(self, token_id: str) -> str | None:
        """What a token is if only the owner may revoke it (the owner's admin token, the
        join token: another admin who revoked them would lock the owner, or every new node,
        out), else None."""
        row = self.store.token_guard(token_id)
        if row is None:
            return None
        if row[0]:
            return "the owner's admin token"
        return "the join token" if row[1] == JOIN else None

    def revoke(self, token_id: str) -> bool:
        revoked = self.store.revoke_token(token_id, time.time())
        self._cache.clear()
        return revoked

    def list(self) -> list[dict[str, Any]]:
        return self.store.list_tokens()

    def _lookup(self, secret: str, kind: str) -> Identity | None:
        key = f"{kind}:{secret}"
        if key in self._cache:
            return self._cache[key]
        digest = hash_secret(secret)
        row = self.store.token_by_hash(digest, kind)
        ident = None
        if row is not None and hmac.compare_digest(row[3], digest):
            ident = Identity(
                user=row[1],
                admin=bool(row[2]),
                token_id=row[0],
                owner=bool(row[4]),
                allow_root=bool(row[5]),
            )
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


def new_job_token(job_id: str, suffix: str) -> str:
    """A job's credential; `suffix`: the CA's fingerprint, marked on a TLS master."""
    # Hex, so the last "_" always separates the secret from the job id (array tasks have one).
    return f"{JOB_TOKEN_PREFIX}{job_id}_{secrets.token_hex(24)}.{suffix}"


def mark_token_file(path: Path, tls: bool) -> None:
    """A token file (`join-token`, `admin-token`) marked for a TLS master (`tls`) or
    unmarked for a plain one, so that a master moved to or from `--tls` hands out tokens
    that say how to dial it (only the secret is hashed: each one keeps working).  Rewritten
    only if that changes it."""
    try:
        token = path.read_text().strip()
    except OSError:
        return  # not made yet: it is written marked
    if split_token(token)[0].startswith(TOKEN_PREFIX) and remarked(token, tls) != token:
        write_private(path, (remarked(token, tls) + "\n").encode())


def job_of_token(token: str) -> str | None:
    """The job id a job token names, or None for any other token."""
    secret, _ = split_token(token)
    if not secret.startswith(JOB_TOKEN_PREFIX):
        return None
    job_id, sep, _ = secret[len(JOB_TOKEN_PREFIX) :].rpartition("_")
    return job_id if sep else None


def matches_any(token: str, hashes: list[str]) -> bool:
    """Whether the token's secret hashes to one of `hashes` (a job's credentials)."""
    digest = token_hash(token)
    return any(hmac.compare_digest(digest, h) for h in hashes)
