"""Processes the agent starts with its own rights, and the environment they get.

On a real node the agent is root.  Everything it runs as itself (site scripts, the
container runtime and the shim around it, image checks, `nvidia-smi`) starts here, with
an environment decided here: a fixed base (a standard `PATH`, the agent account's
`HOME`/`USER`/`LOGNAME`, the agent's own container-runtime settings) plus values the
agent chose.  Nothing of a job's submitted environment is ever in it: a user's
`LD_PRELOAD`, `PATH` or `PYTHONPATH` must not run code as root.

A container's variables reach the container through a 0600 `--env-file` written in the
agent's private spool (`write_env_file`), never through the runtime's own environment and
never as `-e NAME=VALUE` (values would show in `ps`).  Only names that are POSIX names and
values a line-based file can carry (UTF-8, no NUL, CR or newline) go in.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pwd
import re
import select
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CHILD_UMASK = 0o022
"""The umask of jobs and site scripts, as a login shell's: the agent's own (0077, private)
would make every file a job writes unreadable to its group and to others."""
SET_CHILD_UMASK = f"umask {CHILD_UMASK:04o}"
"""The shell command that gives a child that umask (posix_spawn and uvloop cannot)."""

RUNTIME_ENV = (
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "REGISTRY_AUTH_FILE",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "APPTAINER_CACHEDIR",
    "APPTAINER_TMPDIR",
    "APPTAINER_CONFIGDIR",
)
"""The agent's own settings for its container runtime (from its environment, set by the
node's admin), passed to every process it starts."""

SCHEDULER_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NODE_RANK"}
    | {"NPROC_PER_NODE"}
)
SCHEDULER_PREFIXES = ("MGPU_", "PET_")
"""A job's variables the scheduler sets (not the user's): site scripts may see them."""

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BAD_VALUE = re.compile(r"[\0\r\n]")


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the agent runs as itself: the fixed base plus `extra`
    (values the agent chose, never a job's submitted variables)."""
    env = {"PATH": SAFE_PATH}
    try:
        pw = pwd.getpwuid(os.geteuid())
        env.update(HOME=pw.pw_dir or "/", USER=pw.pw_name, LOGNAME=pw.pw_name)
    except KeyError:  # an agent running under a uid with no passwd entry
        env["HOME"] = "/"
    for key in RUNTIME_ENV:
        if key in os.environ:
            env[key] = os.environ[key]
    if extra:
        env.update(extra)
    return env


def script_env(job_env: Mapping[str, str], user: str | None, context: str) -> dict[str, str]:
    """A prolog's / epilog's environment: the base plus the scheduler's variables of the job
    (`MGPU_*`, `CUDA_VISIBLE_DEVICES`, the torchrun ones), not the user's."""
    extra = {
        key: value
        for key, value in job_env.items()
        if (key in SCHEDULER_ENV or key.startswith(SCHEDULER_PREFIXES)) and key != "MGPU_RUN_TAG"
    }
    extra["MGPU_JOB_USER"] = user or ""
    extra["MGPU_SCRIPT_CONTEXT"] = context
    return base_env(extra)


def env_file_entries(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(`NAME=VALUE` lines for an env file, names left out): a name must be a POSIX name and
    a value valid UTF-8 without NUL, CR or newline (the runtimes read the file by lines)."""
    lines: list[str] = []
    dropped: list[str] = []
    for name in sorted(env):
        value = env[name]
        ok = ENV_NAME.match(name) is not None and _BAD_VALUE.search(value) is None
        if ok:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                ok = False
        if ok:
            lines.append(f"{name}={value}\n")
        else:
            dropped.append(name)
    return lines, dropped


def write_env_file(path: Path, env: Mapping[str, str], inherit: Sequence[str] = ()) -> list[str]:
    """Write `env` as a 0600 env file for `--env-file`; returns the names left out.

    `inherit` names go in bare: the runtime takes their values from its own environment
    (the agent's own variables, such as the run's tag)."""
    lines, dropped = env_file_entries(env)
    lines += [f"{name}\n" for name in inherit if ENV_NAME.match(name)]
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, "".join(lines).encode("utf-8"))
    finally:
        os.close(fd)
    return dropped


def _resolve(argv: Sequence[str]) -> list[str]:
    """A bare command name is looked up in the agent's own PATH (set by the node's admin, as
    for the agent itself), not in the child's fixed one."""
    argv = list(argv)
    if argv and "/" not in argv[0]:
        argv[0] = shutil.which(argv[0]) or argv[0]
    return argv


def run(argv: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run` of a short command as the agent (text output captured)."""
    return subprocess.run(
        _resolve(argv),
        env=base_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


def enter_dir(path: str, ids: tuple[int, int, list[int]], timeout: float = 10.0) -> int | None:
    """An `O_PATH` descriptor of the directory `path` as a process of this uid/gid/groups
    entered it (`cd`), or None when that user cannot enter it.

    What a root agent's own checks cannot tell (root enters everything), and pinned: the
    descriptor is of the directory the user's process is in, taken from its
    `/proc/PID/cwd` while it waits there, not found by the name again (the user may have
    swapped a component of it for a symbolic link since)."""
    uid, gid, groups = ids
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'cd -- "$1" && echo && read -r _', "sh", path],
            env={"PATH": SAFE_PATH},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    except OSError:
        return None
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready or os.read(proc.stdout.fileno(), 1) != b"\n":
            return None  # it could not enter (or hung: a dead NFS server)
        return os.open(f"/proc/{proc.pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # it went (the user may kill their own process)
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)  # else reaped later by subprocess itself
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


async def start(
    argv: Sequence[str], extra_env: Mapping[str, str] | None = None, **kwargs: Any
) -> asyncio.subprocess.Process:
    """Start a command as the agent, from the event loop (its own session, stdin closed)."""
    argv = _resolve(argv)
    _check_executable(argv[0])
    env = base_env(extra_env)
    # The agent's loop is uvloop's, which cannot set a child's umask: a /bin/sh sets it
    # and execs the command (errors as exec's are raised above, as a direct start's), and
    # takes back the PWD it exports itself.
    script = f'{SET_CHILD_UMASK} && {"" if "PWD" in env else "unset PWD && "}exec "$@"'
    return await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        script,
        argv[0],  # $0
        *argv,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        **kwargs,
    )


def _check_executable(path: str) -> None:
    """Raise what exec of `path` would: no such file, or not an executable file."""
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


__all__ = [
    "CHILD_UMASK",
    "RUNTIME_ENV",
    "SAFE_PATH",
    "SET_CHILD_UMASK",
    "base_env",
    "enter_dir",
    "env_file_entries",
    "run",
    "script_env",
    "start",
    "write_env_file",
]
