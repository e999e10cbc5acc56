"""The account's login environment under a batch script, as Slurm's `--get-user-env`.

sbatch's `--export=NONE`, or a list of variables (anything but `ALL`), sends the job
`SLURM_GET_USER_ENV=1`: the node then loads the account's login environment, as a
login would make it (`su - USER`: /etc/profile, the user's ~/.profile, PAM's variables,
USER, LOGNAME, SHELL, PATH...), and the variables the job was sent are put over it.  As
Slurm's slurmd: only under the batch script (its srun steps take the script's own
environment), and DISPLAY, ENVIRONMENT and HOSTNAME are not taken.

The login runs as the user (never as root for another account): `su - USER` from a root
agent, the account's own login shell from an agent that runs as that account.  It is
bounded in time and in output; its process group dies with it.  A login that fails or
hangs does not stop the job: it runs with the variables it was sent, plus the account's
USER, LOGNAME, HOME and SHELL, and a line on its stderr says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal

from mgpu.agent.privileged import SAFE_PATH
from mgpu.protocol import Launch

__all__ = ["TIMEOUT", "load", "parse", "wanted"]

TIMEOUT = 60.0
"""Seconds a login may take (Slurm's slurmd allows 120 before it gives up)."""
MAX_OUTPUT = 1 << 20
"""Bytes of a login's output read: an environment is far smaller."""
_START = b"XXXXMGPUSTARTPARSINGHEREXXXX"
_STOP = b"XXXXMGPUSTOPPARSINGHEREXXXX"
_DISCARDED = frozenset({"DISPLAY", "ENVIRONMENT", "HOSTNAME"})
"""Variables of the login Slurm does not take (src/common/env.c `_discard_env`)."""
_SU = ("/bin/su", "/usr/bin/su")


def wanted(msg: Launch) -> bool:
    """Does this launch ask for the login environment: a Slurm batch script's (it has
    its -o file; a step has none) sent SLURM_GET_USER_ENV=1, run on the node itself (a
    container's environment is its image's)."""
    return (
        msg.env.get("SLURM_GET_USER_ENV") == "1"
        and msg.output_file is not None
        and msg.image is None
    )


def parse(output: bytes) -> dict[str, str] | None:
    """The variables `env -0` wrote between the markers, past whatever the login
    printed before (a banner, a profile's echo); None without both markers."""
    _, start, rest = output.partition(_START + b"\n")
    body, stop, _ = rest.rpartition(_STOP)
    if not start or not stop:
        return None
    env: dict[str, str] = {}
    for item in body.split(b"\0"):
        name, eq, value = item.decode("utf-8", "surrogateescape").partition("=")
        if eq and name and name not in _DISCARDED and name.strip() == name:
            env[name] = value
    return env


def _command(user: str, shell: str, as_root: bool) -> list[str]:
    script = f"/bin/echo; /bin/echo {_START.decode()}; env -0; /bin/echo {_STOP.decode()}"
    su = next((p for p in _SU if os.path.exists(p)), None)
    if as_root and su is not None:
        return [su, "-", user, "-c", script]
    return [shell or "/bin/sh", "-l", "-c", script]


async def _read_all(stream: asyncio.StreamReader) -> bytes:
    """What the login writes, up to MAX_OUTPUT bytes (to its end: `read(n)` gives what
    has come so far)."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_OUTPUT:
        chunk = await stream.read(MAX_OUTPUT - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def _login(user: str, timeout: float) -> dict[str, str]:
    """The login environment of `user`; RuntimeError saying why it could not be had."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"no account {user} here") from None
    as_root = os.geteuid() == 0
    if not as_root and pw.pw_uid != os.geteuid():
        raise RuntimeError(f"this agent cannot log in as {user}")
    basics = {"PATH": SAFE_PATH, "HOME": pw.pw_dir, "USER": user, "LOGNAME": user}
    proc = await asyncio.create_subprocess_exec(
        *_command(user, pw.pw_shell, as_root),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**basics, "SHELL": pw.pw_shell or "/bin/sh", "ENVIRONMENT": "BATCH"},
        cwd="/",
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        output = await asyncio.wait_for(_read_all(proc.stdout), timeout)
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        raise RuntimeError(f"the login took over {timeout:g} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the profile left running
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    env = parse(output)
    if env is None:
        raise RuntimeError(f"the login failed (exit code {proc.returncode})")
    return env


async def load(msg: Launch, timeout: float = TIMEOUT) -> str | None:
    """Put the account's login environment under the variables `msg` was sent (they
    win); a note for the job's stderr where it could not be loaded, else None."""
    user = msg.user or pwd.getpwuid(os.geteuid()).pw_name
    note: str | None = None
    try:
        login = await _login(user, timeout)
    except (RuntimeError, OSError) as e:
        login = {}
        note = f"could not load {user}'s login environment ({e}): running with the one sent"
        with contextlib.suppress(KeyError):
            pw = pwd.getpwnam(user)
            login = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "SHELL": pw.pw_shell}
    msg.env = {**login, **msg.env}
    return note
