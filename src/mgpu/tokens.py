"""What a token looks like and what is kept of it: shared by the master, which stores only
hashes, and by job records written by older versions, which held a token in clear."""

from __future__ import annotations

import hashlib

TOKEN_PREFIX = "mgpu_"
JOB_TOKEN_PREFIX = "mgpujob_"
"""A job's own credential, `mgpujob_<job id>_<secret>.<fingerprint>`: set as $MGPU_TOKEN
inside the job so `mgpu rsh`, `mgpu queue` or `mgpu cancel` there act as the job's user,
and valid only while that run of the job is running (like Slurm's job credential).  As
with user tokens, only its hash is stored (`Job.job_token_hashes`)."""


def split_token(token: str) -> tuple[str, str | None]:
    """(secret, CA fingerprint or None)."""
    token = token.strip()
    secret, _, fp = token.partition(".")
    return secret, (fp or None)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_hash(token: str) -> str:
    """What the master keeps of a token: the SHA-256 of its secret part."""
    return hash_secret(split_token(token)[0])
