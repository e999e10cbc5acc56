"""Where NVIDIA MPS's pipe and log directories may be: places no other account can plant.

MPS's control daemon, its per-user servers and their CUDA clients meet in the pipe
directory (`control`: a FIFO, or a Unix socket in driver 580).  Whoever can make that
directory, or a `control` in it, decides which "daemon" shared jobs talk to; MPS's default,
`/tmp/nvidia-mps`, is in the shared temp dir, where any account can make it first.  So the
daemon the agent starts meets its clients in the agent's own directory
(`<node dir>/mps/pipe`, its log beside it in `mps/log`), and every directory from `/` down
to a pipe directory the agent uses must be root's or the agent's and writable by no one else
(`chain_unsafe`): a sticky one such as `/tmp` only above a directory of root's or the
agent's own.

The job users still have to reach it: MPS starts each user's server as that user
(`setuid`), and the server and the user's clients connect to `control` by its path.  So a
root agent makes the directories on the way traversable by others (`--x`: mode 0711, not
listable, nothing to create) and the pipe and log directories 0755 (what NVIDIA's Kubernetes
plugin uses; the daemon makes the sockets in them); the rest of the node directory stays
0700 and its files 0600, so traversing it shows nothing.  An agent of its own account runs
its jobs as itself, and keeps the whole chain 0700.  `unreachable` says whether one user can
get there (every directory above searchable by them): where not, MPS would let that user's
jobs run as ordinary CUDA contexts, so their shares are said not to be held.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

__all__ = ["chain_unsafe", "listening", "make_own", "own_dirs", "unreachable", "unsafe"]

OWN = "mps"
"""The agent's MPS directory, in its node directory: `pipe` and `log` in it."""


def own_dirs(node_dir: Path) -> tuple[Path, Path]:
    """The pipe and log directories of a daemon the agent starts."""
    base = node_dir / OWN
    return base / "pipe", base / "log"


def listening(socket_path: Path) -> bool:
    """Whether a daemon still holds this Unix socket: a stale one (the daemon quit) refuses
    a connection.  The daemon's socket need not be a stream one: a live socket of another
    type answers EPROTOTYPE, which says as much."""
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(socket_path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
    return True


def _ours(uid: int) -> bool:
    return uid in (0, os.geteuid())


def unsafe(path: str) -> str | None:
    """Why the directory `path` may not be the MPS daemon's (a user could have made it or
    could change it), or None when it is safe: a directory itself (not a link), owned by
    root or the agent's account, writable by its owner only."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if not _ours(st.st_uid):
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def chain_unsafe(path: str) -> str | None:
    """`unsafe` for `path`, and for every directory above it: another account that can
    write one of them could move `path` aside and put its own there.  A sticky directory
    (`/tmp`) is fine above a directory of root's or the agent's: no one else may rename
    or remove that one."""
    why = unsafe(path)
    if why is not None:
        return why
    parent = Path(os.path.realpath(os.path.dirname(os.path.abspath(path))))
    for directory in (parent, *parent.parents):
        try:
            st = os.stat(directory)
        except OSError as e:
            return f"{directory}: {e.strerror}"
        if not _ours(st.st_uid):
            return f"{directory} (above {path}) is owned by uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            mode = stat.S_IMODE(st.st_mode)
            return f"{directory} (above {path}) is writable by group or others (mode {mode:o})"
    return None


def unreachable(path: Path, uid: int) -> str | None:
    """Why a process of `uid` cannot reach `path` (some directory on the way, `path`
    included, is not searchable by it: its owner's or others' `x` bit), or None.  Root and
    the agent's own account always can.  Group permissions are not counted: a user who
    reaches it only through a group is said not to (the safe side)."""
    if _ours(uid):
        return None
    target = Path(os.path.realpath(path))
    for directory in (target, *target.parents):
        try:
            st = os.stat(directory)
        except OSError as e:
            return f"{directory}: {e.strerror}"
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXOTH
        if not st.st_mode & bit:
            return f"{directory} is mode {stat.S_IMODE(st.st_mode):o}"
    return None


def make_own(node_dir: Path, traversable: bool) -> tuple[str, str]:
    """The agent's own pipe and log directories, made where missing (see the module's
    docstring for their modes); OSError with why when one cannot be made or is not the
    agent's alone (made by someone else, a link)."""
    pipes, logs = own_dirs(node_dir)
    if traversable:  # jobs of other users reach the pipe through these
        for directory in (node_dir.parent, node_dir):
            st = os.lstat(directory)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                os.chmod(directory, stat.S_IMODE(st.st_mode) | 0o711)
    for directory, mode in ((pipes.parent, 0o711), (pipes, 0o755), (logs, 0o755)):
        mode = mode if traversable else 0o700
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            pass
        why = unsafe(str(directory))
        if why is not None:
            raise OSError(why)
        os.chmod(directory, mode)  # also one made before with another mode (not a link)
    why = chain_unsafe(str(pipes))
    if why is not None:
        raise OSError(why)
    return str(pipes), str(logs)
