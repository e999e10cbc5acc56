"""Secrets written whole or not at all, readable by their owner only.

A token, a key or a node secret written with a plain open-then-write can be seen empty (a
client reading `admin-token` while the master starts) or left empty by a crash between the
two (and a master that finds the file skips making it again).  So the data goes into a new
0600 file beside it, synced, then renamed over the name, and the directory synced so the
rename survives a power loss too.  Standard library only (the agent and the client use it).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["write_private"]


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
