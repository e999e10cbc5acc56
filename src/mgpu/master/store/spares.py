"""Empty files made ahead, off the event loop, for the output store's new job files.

Creating a file allocates an inode: ~20 µs on most filesystems, but an ext4 that skips
inodes freed in the last minutes (see agent/recycle.py) scans inode tables for one: 0.3-0.9
ms of CPU a file measured on this project's machines, paid on the master's event loop at
each job's first output.  So a helper thread keeps a few empty files in `<root>/.spare/`,
and a job's file is a spare linked under the job's name: a directory entry, no inode to
find (~30 µs wherever).  A spare is made as the store would make the file (same mode), so
the job's file is the same either way; when none is ready the store creates the file
itself, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from pathlib import Path

__all__ = ["Spares"]

log = logging.getLogger("mgpu.master")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class Spares:
    """Up to `keep` empty files in `root/.spare`, refilled by a short-lived thread once
    half are taken; those a previous master left there are used first."""

    def __init__(self, root: Path, keep: int = 64) -> None:
        self.dir = str(root / ".spare")
        self.keep = keep
        self._free: deque[str] = deque()
        """Names of spares ready in `dir` (deque: taken on the loop, added by the thread)."""
        self._next = 0
        self._lock = threading.Lock()
        self._filler: threading.Thread | None = None
        self._closed = False
        self._usable = True
        """False if `dir` cannot be made or read, or once a link failed for a reason other
        than a name taken (a filesystem without hard links): the store then creates every
        file itself."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            names = [n for n in os.listdir(self.dir) if n.isdigit()]
        except OSError as e:
            log.warning("no spare output files (%s): each job's file is created when needed", e)
            self._usable = False
            return
        self._free.extend(names)
        self._next = max((int(n) for n in names), default=-1) + 1

    def link(self, path: str) -> bool:
        """Put an empty spare file at `path`, a name not taken (False: none was ready, or
        the name was taken after all: the caller opens or creates it itself)."""
        if not self._usable:
            return False
        try:
            name = self._free.popleft()
        except IndexError:
            self._refill()
            return False
        spare = os.path.join(self.dir, name)
        try:
            os.link(spare, path)
        except FileExistsError:
            self._free.appendleft(name)
            return False
        except FileNotFoundError:
            return self.link(path)  # removed from under us: the next one
        except OSError as e:
            log.warning("spare output files unusable (%s): each job's file is created", e)
            self._usable = False
            return False
        with contextlib.suppress(OSError):
            os.unlink(spare)
        if len(self._free) <= self.keep // 2:
            self._refill()
        return True

    def close(self) -> None:
        """Stop making spares and wait for the thread (those made stay for the next run)."""
        with self._lock:
            self._closed = True
            filler = self._filler
        if filler is not None:
            filler.join()

    def _refill(self) -> None:
        with self._lock:
            if self._closed or (self._filler is not None and self._filler.is_alive()):
                return
            self._filler = threading.Thread(target=self._fill, name="mgpu-spares", daemon=True)
            self._filler.start()

    def _fill(self) -> None:
        while len(self._free) < self.keep and not self._closed:
            name = str(self._next)
            self._next += 1
            try:
                os.close(os.open(os.path.join(self.dir, name), _CREATE, 0o666))
            except FileExistsError:
                continue
            except OSError:
                return  # the directory went (a test's, removed) or is full: none more
            self._free.append(name)
