"""Secrets written whole or not at all, readable by their owner only.

A token, a key or a node secret written with a plain open-then-write can be seen empty (a
client reading `admin-token` while the master starts) or left empty by a crash between the
two (and a master that finds the file skips making it again).  So the data goes into a new
0600 file beside it, synced, then renamed over the name, and the directory synced so the
rename survives a power loss too.  Standard library only (the agent and the client use it).

A secret mgpu is given in a file (the cluster secret, a database's address) is read only
from a file no other account may read (`read_private`), as ssh refuses a private key that
others may read: the secret is already out if they may.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from mgpu.errors import MgpuError

__all__ = ["TooOpen", "read_private", "write_private"]


class TooOpen(MgpuError):
    """A secret's file that the group or other accounts may read."""


def read_private(path: Path, what: str) -> bytes:
    """The content of `path`, a file only its owner may read; TooOpen (one sentence, as
    ssh's "permissions 0644 for F are too open") if the group or others may, OSError if it
    cannot be read.  `what` says what the file is for."""
    with open(path, "rb") as f:  # the mode of the file read, not of one swapped in later
        mode = os.fstat(f.fileno()).st_mode & 0o777
        if mode & 0o077:
            raise TooOpen(
                f"permissions {mode:04o} for {path} are too open: {what} must be readable "
                f"by its owner only (chmod 600 {path})"
            )
        return f.read()


def write_private(path: Path, data: bytes) -> None:
    """`data` as the whole content of `path`, mode 0600, atomically (OSError on failure,
    nothing left behind)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a leftover keeps its own mode: start from a new 0600 file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
