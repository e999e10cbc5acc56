"""What a token looks like and what is kept of it: shared by the master, which stores only
hashes, by job records written by older versions, which held a token in clear, and by
clients and agents, which read from it how to dial the cluster.

A token is `<secret>.<CA fingerprint>`, and a TLS master's ends with `.tls` as well
(`<secret>.<CA fingerprint>.tls`): its cluster speaks TLS, so whoever holds it dials that
cluster only in TLS, from the first contact (mgpu.masters.Transport).  Only the secret is
hashed and stored, so the master re-marks its token files when its mode changes and every
token, marked or not, keeps working.

Imports nothing at module level: the client reads tokens on its start-up path.
"""

from __future__ import annotations

TOKEN_PREFIX = "mgpu_"
JOB_TOKEN_PREFIX = "mgpujob_"
"""A job's own credential, `mgpujob_<job id>_<secret>.<fingerprint>[.tls]`: set as
$MGPU_TOKEN inside the job so `mgpu rsh`, `mgpu queue` or `mgpu cancel` there act as the
job's user, and valid only while that run of the job is running (like Slurm's job
credential).  As with user tokens, only its hash is stored (`Job.job_token_hashes`)."""
TLS_MARK = "tls"
"""The last field of a TLS master's tokens."""


class TokenParts:
    """A token read: `secret` (what is hashed), `fingerprint` (the cluster CA's, or None)
    and `tls` (marked: its cluster speaks TLS)."""

    __slots__ = ("fingerprint", "secret", "tls")

    def __init__(self, secret: str, fingerprint: str | None, tls: bool) -> None:
        self.secret = secret
        self.fingerprint = fingerprint
        self.tls = tls


def parse_token(token: str) -> TokenParts:
    """The one reading of a token's form (any text: a missing part is None or False)."""
    secret, _, rest = token.strip().partition(".")
    fingerprint, _, mark = rest.partition(".")
    return TokenParts(secret, fingerprint or None, mark.lower() == TLS_MARK)


def split_token(token: str) -> tuple[str, str | None]:
    """(secret, CA fingerprint or None)."""
    parts = parse_token(token)
    return parts.secret, parts.fingerprint


def token_suffix(fingerprint: str, tls: bool) -> str:
    """What follows a new token's secret and its '.': the fingerprint, marked if `tls`."""
    return f"{fingerprint}.{TLS_MARK}" if tls else fingerprint


def remarked(token: str, tls: bool) -> str:
    """`token` marked for a TLS master (`tls`) or unmarked for a plain one; the secret and
    fingerprint as they were (a token naming no CA is left as it is)."""
    parts = parse_token(token)
    if parts.fingerprint is None:
        return token.strip()
    return f"{parts.secret}.{token_suffix(parts.fingerprint, tls)}"


def hash_secret(secret: str) -> str:
    import hashlib  # here: the client's start-up path reads tokens but hashes none

    return hashlib.sha256(secret.encode()).hexdigest()


def token_hash(token: str) -> str:
    """What the master keeps of a token: the SHA-256 of its secret part."""
    return hash_secret(parse_token(token).secret)
