"""The cluster's identity, shared by every master of a database: its CA and tokens.

A SQLite master keeps its CA key and certificate (`tlsutil.ensure_ca`) and the join and
owner's admin tokens (`TokenStore.bootstrap`) as 0600 files in its state dir.  Masters on
one PostgreSQL database must be one cluster: agents pin one CA, tokens work on every
master.  So the first master stores those four files in the database, in one row, sealed
with AES-256-GCM under a key derived (scrypt) from the cluster secret every master is given
(`--cluster-secret-file` or `$MGPU_CLUSTER_SECRET`), as k3s encrypts its bootstrap data in
its datastore with its token.  Every other master opens the row and writes the same files
into its own state dir; each issues its own server certificate from that CA.  A master with
another secret cannot open it (GCM's tag fails) and refuses to start.  The database alone
never holds the CA key or a token in clear.  Its tokens are kept unmarked: each master
marks its own copies for the mode it serves in (`.tls`, mgpu.tokens).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu.dbaddress import describe
from mgpu.errors import MgpuError
from mgpu.master.store import identity as rows
from mgpu.master.store.identity import SealedIdentity
from mgpu.privatefile import TooOpen, read_private, write_private
from mgpu.tlsutil import CA_CERT, CA_KEY, ensure_ca, fingerprint_pem
from mgpu.tokens import TOKEN_PREFIX, parse_token, remarked

__all__ = [
    "FILES",
    "SECRET_ENV",
    "ensure_identity",
    "import_hook",
    "import_identity",
    "read_secret",
    "seal",
    "unseal",
]

SECRET_ENV = "MGPU_CLUSTER_SECRET"
TOKEN_FILES = ("join-token", "admin-token")
FILES = (CA_CERT, CA_KEY, *TOKEN_FILES)
"""The state dir's files that make a cluster's identity."""
VERSION = 1
AAD = b"mgpu cluster identity v1"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 15, 8, 1
"""scrypt's cost (32 MiB, ~0.1 s): paid once per master start."""
MIN_SECRET = 16
"""Bytes a cluster secret has at least."""


class IdentityError(MgpuError):
    """The identity cannot be used: a wrong secret, a missing secret, missing files."""


def read_secret(secret_file: str | None, environ: dict[str, str] | None = None) -> bytes:
    """The cluster secret: the file's content (one trailing newline dropped), else
    `$MGPU_CLUSTER_SECRET`; IdentityError when neither gives one, or when the file is one
    the group or other accounts may read (as ssh refuses such a key)."""
    env = os.environ if environ is None else environ
    if secret_file:
        try:
            secret = read_private(Path(secret_file).expanduser(), "the cluster secret file")
        except TooOpen as e:
            raise IdentityError(str(e)) from None
        except OSError as e:
            raise IdentityError(
                f"cannot read the cluster secret file {secret_file}: {e.strerror}"
            ) from None
        secret = secret[:-1] if secret.endswith(b"\n") else secret
    else:
        secret = env.get(SECRET_ENV, "").encode()
    if not secret:
        raise IdentityError(
            "a master on a PostgreSQL database needs the cluster secret every master of the "
            f"cluster shares: give --cluster-secret-file FILE or set ${SECRET_ENV}"
        )
    if len(secret) < MIN_SECRET:
        raise IdentityError(
            f"the cluster secret is {len(secret)} bytes long; use at least {MIN_SECRET} "
            "(e.g. `openssl rand -hex 32 > FILE`)"
        )
    return secret


def _key(secret: bytes, salt: bytes) -> bytes:
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    return Scrypt(salt=salt, length=32, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P).derive(secret)


def seal(files: dict[str, str], secret: bytes) -> SealedIdentity:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt, nonce = secrets.token_bytes(16), secrets.token_bytes(12)
    plain = json.dumps(files, sort_keys=True).encode()
    sealed = AESGCM(_key(secret, salt)).encrypt(nonce, plain, AAD)
    return SealedIdentity(VERSION, salt, nonce, sealed)


def unseal(identity: SealedIdentity, secret: bytes) -> dict[str, str]:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if identity.version != VERSION:
        raise IdentityError(
            f"the database's cluster identity is of version {identity.version}, which this "
            f"mgpu does not know (it knows {VERSION}): upgrade this master"
        )
    try:
        plain = AESGCM(_key(secret, identity.salt)).decrypt(identity.nonce, identity.sealed, AAD)
    except InvalidTag:
        raise IdentityError(
            "the cluster secret does not open the cluster identity stored in the database: "
            "give this master the same --cluster-secret-file as the other masters"
        ) from None
    files = json.loads(plain)
    if not isinstance(files, dict) or sorted(files) != sorted(FILES):
        raise IdentityError("the database's cluster identity is damaged (not the four files)")
    return {str(k): str(v) for k, v in files.items()}


def _local_identity(state_dir: Path) -> dict[str, str]:
    """This state dir's identity, made now where missing: its CA (kept if there), its tokens
    (kept if there, else new ones bearing the CA's fingerprint; the leader registers their
    hashes when it opens the cluster, `TokenStore.bootstrap`)."""
    fingerprint = ensure_ca(state_dir)
    files = {CA_CERT: (state_dir / CA_CERT).read_text(), CA_KEY: (state_dir / CA_KEY).read_text()}
    for name in TOKEN_FILES:
        path = state_dir / name
        token = path.read_text().strip() if path.exists() else ""
        if parse_token(token).fingerprint != fingerprint:
            token = f"{TOKEN_PREFIX}{secrets.token_urlsafe(32)}.{fingerprint}"
        files[name] = token + "\n"
    return _unmarked(files)


def _unmarked(files: dict[str, str]) -> dict[str, str]:
    """The identity's files as the database keeps them: tokens without the TLS mark."""
    return {
        name: remarked(text, False) + "\n" if name in TOKEN_FILES else text
        for name, text in files.items()
    }


def _write_files(state_dir: Path, files: dict[str, str], tls: bool) -> None:
    """The identity's files in the state dir (0600), tokens marked for `tls`; a server
    certificate of another CA is removed, so that one is issued from this CA."""
    for name in FILES:
        path = state_dir / name
        text = remarked(files[name], tls) + "\n" if name in TOKEN_FILES else files[name]
        data = text.encode()
        try:
            same = path.read_bytes() == data
        except OSError:
            same = False
        if not same:
            write_private(path, data)
            if name == CA_CERT:
                for stale in ("server.crt", "server.key"):
                    (state_dir / stale).unlink(missing_ok=True)


def ensure_identity(state_dir: Path, conn: Any, secret: bytes, tls: bool = False) -> str:
    """At a master's start, before it serves: the database's identity in the state dir
    (stored there first from this state dir's if the database has none), its tokens marked
    for `tls` (the master serves TLS); the CA's fingerprint.  IdentityError when the
    secret does not open it."""
    rows.ensure_table(conn)
    stored = rows.read(conn)
    if stored is None:
        rows.insert_if_absent(conn, seal(_local_identity(state_dir), secret))
        stored = rows.read(conn)  # this one, or the one a master racing this one stored
        assert stored is not None
    files = unseal(stored, secret)
    _write_files(state_dir, files, tls)
    return fingerprint_pem(files[CA_CERT].encode())


def import_identity(state_dir: Path, conn: Any, secret: bytes) -> bool:
    """`mgpu db import`: a SQLite cluster's identity (its state dir's CA and tokens) into
    the database, so its agents and tokens keep working with the masters that use it.
    True if stored; False if the database holds this same identity already;
    IdentityError if it holds another one, or the state dir lacks a file."""
    missing = [n for n in FILES if not (state_dir / n).exists()]
    if missing:
        raise IdentityError(
            f"{state_dir} is not a master's state dir with an identity: no {', '.join(missing)}"
        )
    files = _unmarked({name: (state_dir / name).read_text() for name in FILES})
    rows.ensure_table(conn)
    if rows.insert_if_absent(conn, seal(files, secret)):
        return True
    stored = rows.read(conn)
    assert stored is not None
    if _unmarked(unseal(stored, secret)) != files:
        raise IdentityError(
            "the database already holds another cluster's identity (CA and tokens): "
            "import into an empty database"
        )
    return False


def import_hook(secret: bytes) -> Callable[[Path, Any], dict[str, int]]:
    """`mgpu db import`'s step for the identity (store/dbimport.py's hooks): the state
    dir's CA and tokens sealed into the database, in the import's transaction."""

    def hook(state_dir: Path, conn: Any) -> dict[str, int]:
        import_identity(state_dir, conn, secret)
        return {"identity": 1}

    return hook


def load_identity(
    state_dir: Path, database: str, secret: bytes, wait: float = 0.0, tls: bool = False
) -> str:
    """`ensure_identity` on a connection of its own, waiting up to `wait` seconds for the
    database to answer (0: one try; a supervisor starts the master again)."""
    import logging
    import time

    import psycopg

    from mgpu.master.store.pglink import params

    log = logging.getLogger("mgpu.master")
    deadline = time.monotonic() + wait
    while True:
        try:
            link = params(database, connect_timeout=5)  # keepalives: store/pglink.py
            with psycopg.connect(**link, autocommit=True) as conn:
                return ensure_identity(state_dir, conn, secret, tls)
        except psycopg.OperationalError as e:
            if time.monotonic() >= deadline:
                first = str(e).strip().splitlines()[0] if str(e).strip() else "no answer"
                raise IdentityError(
                    f"cannot reach the database {describe(database)}: {first}"
                ) from None
            log.warning("waiting for the database %s to answer", describe(database))
            time.sleep(1.0)
