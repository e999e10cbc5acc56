"""Node identity: which agent may speak for a node id (k3s's node password is the model).

The join token lets a machine join; it does not say which node it is.  So at a node's
first join the master hands it a node secret (256 random bits, in the Welcome), which
the agent keeps 0600 in its state dir; the master stores only its SHA-256.  From then
on a hello for that node id must carry the secret.  A node without a stored secret
(new, listed in the config, or known from before secrets existed) gets one at its next
join: trust on first use, as k3s does.  `mgpu node remove ID` forgets the secret, so a
node whose agent lost its state dir can join afresh.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from mgpu.master.store.base import Store

NODE_SECRET_PREFIX = "mgpunode_"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class HelloVerdict:
    """What the master makes of a hello's claim to a node id."""

    refusal: str | None = None
    """One sentence for the agent, or None: it may join."""
    new_secret: str | None = None
    """First join: the secret to hand over in the Welcome (its hash is stored already)."""
    replaces_link: bool = False
    """The proven owner while an older connection still looks open: that one is dropped."""
    bad_secret: bool = False
    """A wrong or missing secret: counted against the address like a bad token."""


class NodeSecrets:
    """The hashes of the node secrets, in the master's database."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _stored(self, node_id: str) -> str | None:
        return self.store.node_secret_hash(node_id)

    def known(self, node_id: str) -> bool:
        return self._stored(node_id) is not None

    def verify(self, node_id: str, given: str | None, connected: bool) -> HelloVerdict:
        """Judge a hello for `node_id` carrying `given`; `connected`: a link is open for it.

        A hello that proves the secret while an older link still looks open is the node
        itself (the secret never leaves its state dir): most often an agent restarted
        after a crash whose old connection the master has not seen die yet.  It replaces
        that link.  Anything else never disturbs a connected node."""
        stored = self._stored(node_id)
        if stored is None:
            if connected:
                return HelloVerdict(refusal=f"node {node_id} is already connected")
            secret = NODE_SECRET_PREFIX + secrets.token_urlsafe(32)
            self.store.set_node_secret(node_id, _hash(secret), time.time())
            return HelloVerdict(new_secret=secret)
        if given and hmac.compare_digest(stored, _hash(given)):
            return HelloVerdict(replaces_link=connected)
        what = "no node secret" if not given else "a wrong node secret"
        return HelloVerdict(
            refusal=(
                f"node {node_id} has joined before and this agent has {what} for it: "
                f"restore the agent's state dir (node-{node_id}/node-secret), or run "
                f"`mgpu node remove {node_id}` on the master to let it join afresh"
            ),
            bad_secret=True,
        )

    def forget(self, node_id: str) -> bool:
        return self.store.forget_node_secret(node_id)
