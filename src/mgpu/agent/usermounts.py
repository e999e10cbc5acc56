"""The host paths a container job names (`--container-mounts SRC:DST`, its home with
`--container-mount-home`), as the runtime is given them.

A root runtime (docker, rootful podman) would mount SRC by its name, as root: a user could
name a directory they may not enter (another user's 0700 home, /root) and read or write it
in the container.  So each source is reached as the job's user, as its working directory
is (mgpu.agent.bindmount): a directory is entered by a process of the user
(`privileged.enter_dir`); a file is looked up in its directory so entered, not followed if
it is a symbolic link (whose target the user may not reach), and opened `O_PATH`.  What
the user reached is bind-mounted from the descriptor onto `SPOOL/JOB.EPOCH.mN.cwd`, which
the runtime mounts; inside, the kernel still checks the job's uid against each file.

apptainer and rootless podman run as the job's user: they get the paths as named.
"""

from __future__ import annotations

import glob
import os
import pwd
import stat
from collections.abc import Sequence

from mgpu.agent import bindmount, privileged
from mgpu.agent.launcher import JobError, LaunchError
from mgpu.containeropts import ContainerOptions

__all__ = ["Bind", "binds_of", "pin_all", "release_all"]

Bind = tuple[str, str, bool]
"""(host path, path in the container, read-only)."""


def binds_of(options: ContainerOptions | None, uid: int) -> list[Bind]:
    """The host paths `options` mounts, by name: its mounts and the user's home."""
    if options is None:
        return []
    out = [(m.source, m.target, m.readonly) for m in options.mounts if m.source is not None]
    if options.mount_home:
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            raise JobError(f"--container-mount-home: uid {uid} has no home directory") from None
        out.append((home, home, False))
    return out


def point(spool: str, job_id: str, epoch: int, index: int) -> str:
    return f"{spool}/{job_id}.{epoch}.m{index}{bindmount.SUFFIX}"


def _reach(path: str, ids: tuple[int, int, list[int]]) -> int:
    """An `O_PATH` descriptor of `path` as the user `ids` reaches it (see the docstring)."""
    fd = privileged.enter_dir(path, ids)
    if fd is not None:
        return fd
    parent, name = os.path.split(path)
    dir_fd = privileged.enter_dir(parent or "/", ids)
    if dir_fd is None or not name:
        if dir_fd is not None:
            os.close(dir_fd)
        raise JobError(f"--container-mounts: {path} is not there for the job's user")
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        raise JobError(f"--container-mounts: {path} is not there for the job's user") from None
    finally:
        os.close(dir_fd)
    mode = os.fstat(fd).st_mode
    if stat.S_ISLNK(mode) or stat.S_ISDIR(mode):  # a directory it could not enter
        os.close(fd)
        why = "is a symbolic link; name what it points to" if stat.S_ISLNK(mode) else None
        raise JobError(f"--container-mounts: {path} {why or 'cannot be entered by the user'}")
    return fd


def pin_all(
    spool: str, job_id: str, epoch: int, binds: Sequence[Bind], ids: tuple[int, int, list[int]]
) -> list[Bind]:
    """`binds` with each source pinned as the user reached it (blocking: run in a thread);
    what was mounted is released again when one cannot be."""
    out: list[Bind] = []
    try:
        for index, (source, target, readonly) in enumerate(binds):
            fd = _reach(source, ids)
            where = point(spool, job_id, epoch, index)
            try:
                bindmount.bind(fd, where)
            except OSError as e:
                raise LaunchError(f"cannot mount {source}: {e.strerror}") from None
            finally:
                os.close(fd)
            out.append((where, target, readonly))
    except (JobError, LaunchError):
        release_all(spool, job_id, epoch)
        raise
    return out


def release_all(spool: str, job_id: str, epoch: int) -> None:
    """Unmount every source pinned for the run."""
    for where in glob.glob(glob.escape(f"{spool}/{job_id}.{epoch}.") + f"m*{bindmount.SUFFIX}"):
        bindmount.release(where)
