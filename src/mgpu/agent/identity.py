"""The agent's side of node identity: the node secret and its private directory.

The master hands a node its secret at its first join (mgpu.master.security.nodeauth); the agent
keeps it in `STATE_DIR/node-ID/node-secret` (0600, in a 0700 directory) and proves its
node id with it in every later hello.  A lock on the same directory keeps a second agent
from running as the same node from the same state dir: two processes holding one secret
would take the node from each other.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mgpu.privatefile import write_private

SECRET_FILE = "node-secret"


class NodeIdentityError(RuntimeError):
    """The agent cannot keep or use its node identity; the message is one sentence."""


class NodeIdentity:
    def __init__(self, node_dir: Path, node_id: str) -> None:
        self.node_dir = node_dir
        self.node_id = node_id
        self.secret: str | None = None
        self._lock_fd: int | None = None

    @property
    def path(self) -> Path:
        return self.node_dir / SECRET_FILE

    def open(self) -> None:
        """Make the directory private, take the lock, read the secret if there is one."""
        try:
            self.node_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.node_dir.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.node_dir, 0o700)  # also one made before node secrets existed
            fd = os.open(self.node_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise NodeIdentityError(f"cannot use the state dir {self.node_dir}: {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise NodeIdentityError(
                f"another agent already runs as node {self.node_id} "
                f"with the state dir {self.node_dir.parent}"
            ) from None
        self._lock_fd = fd  # held (and the lock with it) until this process ends
        try:
            self.secret = self.path.read_text().strip() or None
        except FileNotFoundError:
            self.secret = None
        except OSError as e:
            raise NodeIdentityError(f"cannot read the node secret {self.path}: {e}") from None

    def save(self, secret: str) -> None:
        """Keep the secret the master issued (written whole or not at all)."""
        try:
            write_private(self.path, (secret + "\n").encode())
        except OSError as e:
            raise NodeIdentityError(
                f"cannot keep the node secret in {self.path} ({e.strerror}); the master "
                f"now expects it: fix the state dir, then run `mgpu node remove "
                f"{self.node_id}` on the master"
            ) from None
        self.secret = secret
