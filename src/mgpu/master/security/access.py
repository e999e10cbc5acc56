"""Who a request acts for, and what they may use: tokens, root grants, node access rules."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import replace

from mgpu.config import ClusterConfig
from mgpu.master.security.auth import Identity, TokenStore, job_of_token, matches_any
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job, JobState

__all__ = ["Access", "is_uid0", "unix_groups"]


class Access:
    def __init__(
        self,
        config: ClusterConfig,
        tokens: TokenStore,
        jobs: Mapping[str, Job],
        nodes: Mapping[str, NodeRecord],
        owner: str,
    ) -> None:
        self.config = config
        self.tokens = tokens
        self.jobs = jobs
        self.nodes = nodes
        self.owner = owner
        """The master's own account: the admin token's user, and a submit's default."""
        self._restricted = config.security.restricted_nodes()
        self._allowed_cache: dict[str, frozenset[str] | None] = {}

    def identify(self, token: str | None) -> Identity | None:
        """Who a token acts for: a user token, or a running job's own credential."""
        if not token:
            return None
        job_id = job_of_token(token)
        if job_id is None:
            ident = self.tokens.user(token)
            if ident is not None and ident.allow_root and not ident.owner:
                # An --allow-root grant counts only while the config allows grants.
                return replace(ident, allow_root=self.config.security.allow_root_jobs)
            return ident
        job = self.jobs.get(job_id)
        if job is None or job.state != JobState.RUNNING:
            return None
        if not matches_any(token, job.job_token_hashes):
            return None
        # A job acts as its user, with the root grant its submitter had (a root job may
        # submit root jobs), never as an admin.
        return Identity(
            user=job.user, admin=False, token_id=f"job:{job.id}", allow_root=job.allow_root
        )

    @staticmethod
    def root_grant(ident: Identity) -> bool:
        """May jobs this identity submits run as uid 0?  The owner's admin token may; a token
        with an `--allow-root` grant while `security.allow_root_jobs` is on (see identify);
        a job's credential as its job may."""
        return ident.owner or ident.allow_root

    def root_name(self, user: str) -> str | None:
        """Why `user` is reserved to the owner (a token for it, or a submit as it, would be a
        way to root jobs), or None: the master's own account, or uid 0 on this machine."""
        if user == self.owner:
            return "the master's own account"
        return "root on the master's machine" if is_uid0(user) else None

    def known_user(self, user: str) -> bool:
        """Whether `user` is someone this cluster knows (`mgpu reserve create --users`): the
        owner, a user with a token, one with a job in the queue, or an account here."""
        if user == self.owner or any(j.user == user for j in self.jobs.values()):
            return True
        if any(t["user"] == user and not t.get("revoked") for t in self.tokens.list()):
            return True
        import pwd

        try:
            pwd.getpwnam(user)
        except KeyError:
            return False
        return True

    def allowed_nodes(self, user: str) -> frozenset[str] | None:
        """Nodes `user` may use under the access rules; None = every node."""
        if not self._restricted:
            return None
        if user not in self._allowed_cache:
            groups = unix_groups(user)
            known = set(self.nodes) | set(self._restricted)
            self._allowed_cache[user] = frozenset(
                n
                for n in known
                if n not in self._restricted
                or user in self._restricted[n][0]
                or groups & self._restricted[n][1]
            )
        allowed = self._allowed_cache[user]
        if allowed is None:
            return None
        # Nodes that joined since and are not restricted are open too.
        return allowed | frozenset(n for n in self.nodes if n not in self._restricted)


@functools.lru_cache(maxsize=1024)
def is_uid0(user: str) -> bool:
    """Whether `user` is uid 0 on this machine (cached: looked up on every submit)."""
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid == 0
    except KeyError:
        return False


def unix_groups(user: str) -> set[str]:
    """The Unix groups `user` is in, as this (master) machine knows them."""
    import grp
    import pwd

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return set()
    names = set()
    for gid in os.getgrouplist(user, pw.pw_gid):
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return names
