"""Starting a job's shim: the shim itself, posix_spawn or Popen with the job's errors told
apart from the node's, the gate through which the agent moves it into its cgroups, and the
small file and process helpers of a run's start and end (see launcher.py for the design)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from typing import Any

import psutil

from mgpu.agent import cgroups, privileged
from mgpu.agent.spawner import Spawned, Spawner, SpawnerGone

__all__ = [
    "BOOT_ID",
    "PTY_SHIM",
    "READ_CHUNK",
    "SHIM",
    "JobError",
    "LaunchError",
    "process_start_ticks",
    "process_start_time",
    "read_exit",
    "ticks_to_time",
]

# $0 is the number of an inherited descriptor open on the exit file.  Writing through
# /proc/self/fd reaches the file even when the job's user could not walk the spool's
# path (a root agent's state dir is usually private).  The agent reads the file only
# after the job exited, so the write needs no atomicity.  It writes over the start of the
# file (`1<>`, not `>`): an exit file is used again by later runs (mgpu.agent.recycle) and
# keeps its block, where truncating it would free the block and the write allocate it
# again (~0.1 ms a job on this project's CI machine).  The shim's own stderr goes there
# too (descriptor 9 keeps the job's): the shell's line for a command a signal killed
# (`Killed`, `Terminated`) is not the job's output (Slurm's has none), and it tells a
# death by signal N from an exit with 128+N.  So the file is that line, if any, then the
# code; the agent blanks its first line before each run (see `read_exit`).  The command
# runs in a subshell, which dash turns into the command itself (one fork, as before), so
# that the shell that waits for it is the one whose stderr is the file.
# `read` waits at the gate (stdin) until the agent has put the shim in the run's cgroup.
# The umask is set by the shim itself: posix_spawn (`spawn_own`) cannot set one.
UMASK = privileged.SET_CHILD_UMASK + "; "
_RUN = 'exec 9>&2 2<>/proc/self/fd/$0; ("$@" 2>&9 9>&-); c=$?; echo $c >&2; exit $c'
SHIM = (
    UMASK + "trap : TERM INT HUP; read -r _; exec </dev/null; "
    'cd -- "$1" 2>/dev/null || { echo "mgpu: cannot enter the working directory $1" >&2; '
    "echo 126 1<>/proc/self/fd/$0; exit 126; }; shift; " + _RUN
)
# With a terminal (mgpu.agent.terminal): $1 is the pty's slave, opened as stdin by the shim,
# a session leader, after the gate, which makes it its controlling terminal.  The signals
# a terminal sends its foreground group (which the shim is in) are caught, so they reach
# the program only.
PTY_SHIM = (
    UMASK + 'trap : TERM INT HUP QUIT TSTP TTIN TTOU; read -r _; exec 0<>"$1"; shift; '
    'cd -- "$1" 2>/dev/null || { echo "mgpu: cannot enter the working directory $1" >&2; '
    "echo 126 1<>/proc/self/fd/$0; exit 126; }; shift; " + _RUN
)
READ_CHUNK = 256 * 1024


def read_exit(path: str) -> tuple[int | None, int | None]:
    """What a shim wrote to its exit file: the job's code (None: not written, the run
    did not end through its shim) and the signal that killed it (None: it exited).  A
    signal's death is a code of 128+N after a line of the shell's (`Killed`); dash says
    nothing of SIGINT and SIGPIPE, which then read as exits 130 and 141."""
    try:
        with open(path, "rb") as f:
            head = f.read(512).split(b"\n")
    except OSError:
        return None, None
    said = head[0] and not head[0].strip().lstrip(b"-").isdigit()
    try:
        code = int(head[1] if said and len(head) > 1 else head[0])
    except ValueError:
        return None, None  # blanked, and not written since
    return code, code - 128 if said and 128 < code < 128 + 65 else None


class LaunchError(RuntimeError):
    """The node could not start the job (a node failure, not the job's)."""


class JobError(LaunchError):
    """The job's own request cannot be started here (too big for execve, a NUL byte, a
    name no environment can hold): the job fails, the node is fine."""


def start_shim(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Popen of a shim, its errors sorted into the job's (JobError) and the node's."""
    try:
        # cwd "/": the shim enters the job's directory itself, as the job's user.
        return subprocess.Popen(
            argv,
            cwd="/",
            start_new_session=True,
            close_fds=True,
            umask=privileged.CHILD_UMASK,  # not the agent's private one
            **kwargs,
        )
    except (ValueError, OSError) as e:
        raise _sorted(e) from None


class OwnShim:
    """A shim `spawn_own` started: what the launcher needs of a Popen (pid, poll, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Its returncode (-N: killed by signal N), as Popen.wait; None if it was reaped
        elsewhere."""
        if self.returncode is None and timeout is None:
            with contextlib.suppress(ChildProcessError):
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + (timeout or 0.0)
        delay = 0.0005
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(["/bin/sh"], timeout or 0.0)
            time.sleep(min(delay, left))
            delay = min(2 * delay, 0.05)
        return self.returncode


# Python ignores SIGPIPE and SIGXFSZ (Popen's restore_signals undoes that), the agent
# catches HUP, INT and QUIT (agent/sigdefaults.py): a job starts with them at the default.
# (glibc's posix_spawn leaves its own two internal signals, 32 and 33, ignored, and Python
# cannot name them; every glibc program sets them up again as it starts.)
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
_CLOSE_RANGE_CLOEXEC = 4
_close_range: Any = None


def _all_close_on_exec() -> bool:
    """Mark every descriptor from 3 up close-on-exec (close_range(2), Linux 5.11): what
    Popen's close_fds does in its child, for posix_spawn.  Python opens its own so, but a C
    library (NVML) may not.  False where the call is missing."""
    global _close_range
    if _close_range is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _close_range = getattr(libc, "close_range", False)
        if _close_range:
            _close_range.argtypes = (ctypes.c_uint, ctypes.c_uint, ctypes.c_int)
    return bool(_close_range) and _close_range(3, 0xFFFFFFFF, _CLOSE_RANGE_CLOEXEC) == 0


def spawn_own(
    argv: list[str], stdin: int | None, stdout: int, stderr: int, exit_fd: int, env: dict[str, str]
) -> OwnShim | None:
    """Start a shim that runs with the agent's own ids by posix_spawn (a vfork and an exec
    without Popen's Python: ~0.2 ms less a job) in a new session, as `start_shim` would:
    stdin (None: /dev/null), stdout, stderr, the exit file as descriptor 3, nothing else.
    None where it cannot (the agent's own stdio closed, or no close_range): use Popen."""
    if min(fd for fd in (stdin, stdout, stderr, exit_fd) if fd is not None) < 3:
        return None  # a target (0-2) would be overwritten before it is read
    if not _all_close_on_exec():
        return None
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
        if stdin is None
        else (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
        (os.POSIX_SPAWN_DUP2, exit_fd, 3),  # last: 3 may be one of the above
    ]
    try:
        pid = os.posix_spawn(
            "/bin/sh",
            argv,
            env,
            file_actions=actions,
            setsid=True,
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    except (ValueError, OSError) as e:
        raise _sorted(e) from None
    # Its cwd is the agent's until the shim enters the job's directory, as the job's user.
    return OwnShim(pid)


def spawn_shim(
    spawner: Spawner,
    argv: list[str],
    env: dict[str, str],
    ids: tuple[int, int, list[int]],
    fds: list[int],
    tag: str,
) -> Spawned:
    """A shim of another user's run, started by the spawner as Popen would (new session,
    `/`, the children's umask), its errors sorted the same way.  `fds`: its stdin (the
    gate, which the caller opens), stdout, stderr, then 3, 4, ..."""
    try:
        return spawner.spawn(argv, env, ids, fds, privileged.CHILD_UMASK)
    except (ValueError, OSError) as e:
        raise _sorted(e) from None
    except SpawnerGone as e:
        # It may have died after its fork: a shim of this run would wait at its gate,
        # which the caller now closes.  None may be left to go on outside its cgroup.
        for pid in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise LaunchError(f"cannot start the job: {e}") from None


def tagged(tag: str) -> list[int]:
    """The processes with MGPU_RUN_TAG=`tag` in their environment."""
    mark = f"MGPU_RUN_TAG={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                continue
    return found


def _sorted(e: ValueError | OSError) -> LaunchError:
    """A failed start as the job's error (JobError) or the node's."""
    if isinstance(e, ValueError):  # a NUL byte, a '=' in a name, a character with no encoding
        return JobError(f"cannot start the job: {e}")
    if e.errno in (errno.E2BIG, errno.ENAMETOOLONG):
        return JobError(
            f"cannot start the job: its command line and environment are too big ({e.strerror})"
        )
    if isinstance(e, PermissionError):
        return LaunchError(f"cannot start the job: {e.strerror} ({e.filename})")
    return LaunchError(f"cannot start /bin/sh: {e.strerror}")


def same_ids(uid: int, gid: int, groups: list[int]) -> bool:
    """Whether the agent already has exactly these ids (a root job of a root agent).  Then
    the switch is left out: it would change nothing, and any uid/gid switch makes Popen
    fork the whole agent instead of vfork (a copy of its page tables per job)."""
    own = _own_ids()
    return (
        own[0] == (uid, uid, uid)
        and own[1] == (gid, gid, gid)
        and own[2] - {gid} == set(groups) - {gid}  # gid counts as a member anyway
    )


_ids: tuple[tuple[int, int, int], tuple[int, int, int], set[int]] | None = None


def _own_ids() -> tuple[tuple[int, int, int], tuple[int, int, int], set[int]]:
    """The agent's uids, gids and groups, read once: it never changes them."""
    global _ids
    if _ids is None:
        _ids = (os.getresuid(), os.getresgid(), set(os.getgroups()))
    return _ids


def admit(cgroup: str | None, required: list[str], pid: int, gate: int) -> bool:
    """Move the shim into its cgroups and open its gate (always: it never hangs there).

    A failed move into the containment cgroup leaves the run to the process-tree fallback;
    one into a `required` cgroup (its device rules', its v1 CPU and memory limits') kills
    the shim before the gate opens (False): a job never runs with GPUs it was not given,
    nor outside its limits."""
    try:
        joined = True
        for path in dict.fromkeys([*required, *([cgroup] if cgroup is not None else [])]):
            if not cgroups.enter(path, pid) and path != cgroup:
                joined = False
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                break
        return joined
    finally:
        os.close(gate)


def release_all(paths: list[str | None]) -> None:
    for path in paths:
        if path is not None:
            cgroups.release(path)


def close_all(fds: tuple[int, ...] | list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_boot_time: float | None = None


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot, from /proc — cheaper than
    psutil.Process(); None if there is no such process.  With the pid and the boot
    (`BOOT_ID`) it identifies a process: pids are reused, start times are not, and unlike
    a wall-clock time it does not move when the clock is stepped."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)  # not open(): 4 syscalls
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    if not stat:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return int(fields[19])  # field 22, starttime, counting from the state field (3)


def ticks_to_time(ticks: int) -> float:
    """Clock ticks since boot as epoch seconds (by the boot time as this process first
    read it: a later clock step moves what another process would compute)."""
    global _boot_time
    if _boot_time is None:
        _boot_time = psutil.boot_time()
    return _boot_time + ticks / _CLK_TCK


def process_start_time(pid: int) -> float | None:
    """When `pid` started (epoch seconds); None if there is no such process."""
    ticks = process_start_ticks(pid)
    return None if ticks is None else ticks_to_time(ticks)


def _read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


BOOT_ID = _read_boot_id()
"""This boot's id (empty where the kernel does not say): start ticks compare only within it."""
