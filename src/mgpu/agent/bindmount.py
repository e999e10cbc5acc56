"""A container job's working directory (and each path it mounts: mgpu.agent.usermounts),
pinned: bind-mounted from a descriptor onto a mount point in the agent's private spool,
which is what a root runtime is given.

A root runtime (`podman run -v SRC:DST`, `docker run`) resolves SRC itself, as root.
Given the job's directory by name it would follow whatever the name means *then*: the
job's user may swap a component they own for a symbolic link to a directory they may not
traverse (another user's 0700 home) after the agent checked the path as them.  So the
directory is opened by a process of the job's user (`privileged.enter_dir`), and bound
from that descriptor (`/proc/self/fd/N`: the kernel follows the descriptor, not a name)
onto `SPOOL/<job>.<epoch>.cwd`, a path only root can change.  The mount is lazily
unmounted when the run ends, when a launch fails, and by the agent's start-up sweep.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import stat
from collections.abc import Collection

__all__ = ["SUFFIX", "bind", "mounted", "release", "run_of", "sweep"]

log = logging.getLogger("mgpu.agent")

SUFFIX = ".cwd"
"""Mount points in the spool end with this."""

MS_BIND = 0x1000
MS_REC = 0x4000
"""With what is mounted below the directory, as the runtimes' own `-v` (rbind) has."""
MNT_DETACH = 2
"""Lazy: a container still running keeps its own copy of the mount."""
UMOUNT_NOFOLLOW = 8
_STACKED_MAX = 8
"""Mounts taken off one mount point at most (one is the rule)."""

_libc = ctypes.CDLL(None, use_errno=True)


def bind(fd: int, target: str) -> None:
    """Mount the directory (or file) open as `fd` (an `O_PATH` descriptor is enough) at
    `target`, a directory (or empty file) made here, after anything left there by an
    earlier agent is removed."""
    release(target)
    directory = stat.S_ISDIR(os.fstat(fd).st_mode)
    # Covered by the mount: what shows is the source's own mode.
    if directory:
        os.mkdir(target, 0o700)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
    source = f"/proc/self/fd/{fd}".encode()
    if _libc.mount(source, os.fsencode(target), None, MS_BIND | MS_REC, None) != 0:
        err = ctypes.get_errno()
        _remove(target)
        raise OSError(err, os.strerror(err), target)


def _remove(target: str) -> None:
    if os.path.isdir(target) and not os.path.islink(target):
        os.rmdir(target)
    else:
        os.unlink(target)


def release(target: str) -> bool:
    """Unmount (lazily) and remove the mount point `target`; False when there was none.
    Failures are logged, not raised: a run's end must not fail over them."""
    if not os.path.lexists(target):
        return False
    path = os.fsencode(target)
    for _ in range(_STACKED_MAX):
        if _libc.umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            err = ctypes.get_errno()
            if err != errno.EINVAL:  # EINVAL: not a mount point (any more)
                log.warning("cannot unmount %s: %s", target, os.strerror(err))
            break
    try:
        _remove(target)
    except OSError as e:
        log.warning("cannot remove the mount point %s: %s", target, e.strerror)
    return True


def run_of(name: str) -> str:
    """The run (`JOB.EPOCH`) a mount point's name is of: `JOB.EPOCH.cwd`, `JOB.EPOCH.mN.cwd`."""
    base = name.removesuffix(SUFFIX)
    head, dot, last = base.rpartition(".")
    return head if dot and re.fullmatch(r"m[0-9]+", last) else base


def sweep(spool: str, keep: Collection[str]) -> list[str]:
    """At agent start: release the mount points in `spool` whose runs (`run_of`) are not in
    `keep` (runs with a record, released at their end); the names released."""
    gone: list[str] = []
    try:
        entries = list(os.scandir(spool))
    except OSError:
        return gone
    for entry in entries:
        if entry.name.endswith(SUFFIX) and run_of(entry.name) not in keep:
            release(entry.path)
            gone.append(entry.name)
    return gone


def mounted(target: str) -> bool:
    """Is something mounted at `target` (in this process's mount namespace)?"""
    want = os.path.realpath(target)
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            point = line.split(b" ")[4].decode(errors="surrogateescape")
            # mountinfo escapes space, tab, newline and backslash as octal.
            if _unescape(point) == want:
                return True
    return False


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
