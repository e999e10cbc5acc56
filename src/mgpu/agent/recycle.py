"""Spool files used again by later runs instead of created and removed for each one.

A run has four spool files (stdout, stderr, exit status, run record).  Creating a file
allocates an inode: ~20 µs on most filesystems, but ext4 without a journal skips every
inode freed in the last minutes, so under a stream of short jobs each creation scanned
inode tables: 0.3-0.6 ms a file on this project's CI machine, about half of the agent's
CPU.  So a run's stdout, stderr and exit files are pool files: named `.pool.<key>.<n>`
for their whole life (the run record names them), made once, emptied when their run is
over (off the event loop, with the rest of the clean-up) and given to a later run as they
are, without even a rename.  Run records keep their names (`<job>.<epoch>.run`, which a
restarted agent looks for): a new one is written into a pooled record file renamed to its
name, and renamed back into the pool at its end.

A job's processes hold descriptors of its stdout, stderr and exit-status files, and one
could keep such a descriptor past the job's end (handed to a process outside it).  Those
files therefore go back only to runs of the same user (the pool is keyed by uid), so such a
descriptor reaches that user's later output and never another user's.  Run records are
the agent's alone: one pool for all.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from collections.abc import Collection

__all__ = ["RECORDS", "Pool", "recycle", "unlink", "unlink_all"]

RECORDS = "r"
"""The pool of run-record files (no job ever holds them)."""
PREFIX = ".pool."
_NAME = re.compile(r"\.pool\.(r|\d+x?)\.(\d+)")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

log = logging.getLogger("mgpu.agent")


class Pool:
    """Spool files ready for a run, by key (a uid as text: stdout and stderr files, empty;
    the uid and "x": exit files, owned by that user; RECORDS: run records, not emptied)."""

    def __init__(self, spool: str, size: int = 256) -> None:
        self.spool = spool
        self.size = size
        """Files kept per key; more are removed (a burst's worth is enough)."""
        self.free: dict[str, list[str]] = {}
        self._count = 0

    def adopt(self, in_use: Collection[str] = ()) -> None:
        """Take over the pool files an earlier agent process left in the spool, but those
        its runs still use (`in_use`: the paths their run records name)."""
        try:
            names = os.listdir(self.spool)
        except OSError:
            return
        for name in names:
            m = _NAME.fullmatch(name)
            if m is not None:
                self._count = max(self._count, int(m.group(2)) + 1)
                path = f"{self.spool}/{name}"
                if path not in in_use:
                    self.free.setdefault(m.group(1), []).append(path)

    def take(self, key: str) -> str:
        """The path of a file for a run, from the pool `key`: one that exists (0600, owned by
        whoever the key's runs left it to, empty unless it is an exit file: see `recycle`),
        or a new name (the caller's open creates it).  The caller opens it as a new file
        and sets its owner."""
        free = self.free.get(key)
        if free:
            return free.pop()
        self._count += 1
        return f"{self.spool}/{PREFIX}{key}.{self._count}"

    def spare(self, key: str) -> str | None:
        """A file of the pool `key`, left where it is (the caller renames it), if any."""
        free = self.free.get(key)
        return free.pop() if free else None

    def names(self, files: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        """Where each finished file goes: (path, its pool name: `path` itself for a file
        that has one already), or (path, None) to be removed (its key is None, or that
        pool is full).  Call `recycled` with the pool names once the files are there."""
        out: list[tuple[str, str | None]] = []
        room: dict[str, int] = {}
        for path, key in files:
            if key is None:
                out.append((path, None))
                continue
            left = room.setdefault(key, self.size - len(self.free.get(key, ())))
            if left <= 0:
                out.append((path, None))
                continue
            room[key] = left - 1
            if _NAME.fullmatch(os.path.basename(path)) is not None:
                out.append((path, path))
                continue
            self._count += 1
            out.append((path, f"{self.spool}/{PREFIX}{key}.{self._count}"))
        return out

    def recycled(self, done: list[str]) -> None:
        """These pool names now hold emptied files (what `recycle` returned)."""
        for name in done:
            key = name[len(self.spool) + 1 + len(PREFIX) :].split(".", 1)[0]
            self.free.setdefault(key, []).append(name)


def recycle(moves: list[tuple[str, str | None]]) -> list[str]:
    """Empty each file and rename it into the pool (if it has not its pool name already),
    or remove it (name None); a
    directory (a job script's) is removed.  Run records are not emptied: they are written
    over whole before they are named again (`Launcher.save`); nor are exit files: a run's
    first line is blanked at its start, and the shim writes over it
    (mgpu.agent.spawn.SHIM).  Returns the pool names filled.  Blocking: run it in a
    thread."""
    done = []
    for path, name in moves:
        if name is not None:
            try:
                # Only stdout and stderr files (keys: a uid) are emptied, and only when
                # they hold something: a truncation frees blocks (and, on `discard`
                # mounts, tells the disk), which a later write would allocate again.
                key = name[name.rindex("/") + 1 + len(PREFIX) :].split(".", 1)[0]
                if key.isdigit() and os.stat(path).st_size:
                    os.truncate(path, 0)
                if name != path:
                    os.rename(path, name)
                done.append(name)
                continue
            except OSError:
                pass
        unlink(path)
    return done


def unlink(path: str) -> None:
    """Remove a spool file, or a job script's directory (after its file); gone is fine.

    Through a descriptor of its directory, opened without following a symbolic link: a
    job script's directory belongs to the job's user, who could replace it (or its
    file) with a link, and a root `unlink` of the path would then remove whatever the link
    names.  A linked directory is refused; a linked file is removed as the link itself."""
    folder, name = os.path.split(path)
    try:
        fd = os.open(folder or ".", _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            log.warning("not removing %s: %s is not a directory (a symbolic link?)", path, folder)
        return
    try:
        try:
            os.unlink(name, dir_fd=fd)
        except IsADirectoryError:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)  # rmdir of a link fails: it is not a directory
        except OSError:
            pass
    finally:
        os.close(fd)


def unlink_all(paths: list[str]) -> None:
    for path in paths:
        unlink(path)
