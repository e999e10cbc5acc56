"""Slurm's commands where a login shell finds them: small wrappers in /usr/local/bin.

A job finds the commands first on its PATH ($MGPU_SLURM_BIN, mgpu.agent.slurmbin), but a
`#!/bin/bash -l` script re-reads /etc/profile, which resets PATH; so do `env -i`, `su -`
and `module purge`.  On a Slurm cluster the commands are in /usr/bin and survive all of
that; here a root agent puts a wrapper per command in /usr/local/bin (on every default
PATH, /etc/profile's and login.defs'), only where the machine has no Slurm of its own:
an existing command that is not one of these wrappers is never replaced, and one real
Slurm command anywhere on the usual paths means no wrapper at all (mixing the two would
shadow it).  A wrapper runs `$MGPU_SLURM_BIN`'s command (the job's own mgpu version),
else, with the variables stripped, the bin dir this agent built.
"""

from __future__ import annotations

import logging
import os
import shlex
import tempfile
from pathlib import Path

from mgpu.agent.slurmbin import SLURM_COMMANDS

LOGIN_BIN = Path("/usr/local/bin")
"""On every login shell's PATH, also after `env -i` (bash's built-in default has it)."""
LOGIN_BIN_VAR = "MGPU_LOGIN_BIN"
"""The agent's environment may name another directory, or none (empty: no wrappers; the
test suite's agents write none into the machine's /usr/local/bin but where a test asks)."""


def login_bin() -> Path | None:
    """Where this agent puts its wrappers (None: nowhere)."""
    named = os.environ.get(LOGIN_BIN_VAR)
    if named is None:
        return LOGIN_BIN
    return Path(named) if named else None


SEARCHED = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/opt/slurm/bin",
    "/usr/local/slurm/bin",
)
"""Where a machine's own Slurm would be (besides the agent's PATH)."""
MARK = "# mgpu-login-wrapper"

WRAPPER = """#!/bin/sh
{mark}: Slurm's {name} for mgpu's jobs, found by login shells (mgpu.agent.loginbin).
bin="${{MGPU_SLURM_BIN:-{default}}}"
[ -x "$bin/{name}" ] || bin={default}
exec "$bin/{name}" "$@"
"""

log = logging.getLogger("mgpu.agent")
_decided: dict[str, bool] = {}
"""Per bin dir: whether its wrappers are in place (asked once per agent process)."""


def is_ours(path: Path) -> bool:
    """One of these wrappers, or a shim of a bin dir of ours (on the agent's PATH)."""
    try:
        with open(path, "rb") as f:
            head = f.read(300)
    except OSError:
        return False
    return MARK.encode() in head or b"(made by mgpu.agent.slurmbin)" in head


def real_slurm(path: str | None = None) -> str | None:
    """A Slurm command of the machine's own (not one of our wrappers), if any."""
    dirs = [*SEARCHED, *(path or os.environ.get("PATH", "")).split(os.pathsep)]
    for d in dict.fromkeys(d for d in dirs if d):
        for name in SLURM_COMMANDS:
            candidate = Path(d) / name
            if candidate.is_file() and os.access(candidate, os.X_OK) and not is_ours(candidate):
                return str(candidate)
    return None


def install(bin_dir: str, target: Path | None = None) -> bool:
    """Wrappers for bin_dir's commands in target (`login_bin()` by default; once per bin
    dir and process); False where the machine has a Slurm of its own, no directory is
    named, or this process cannot write there."""
    target = target or login_bin()
    if target is None:
        return False
    if bin_dir not in _decided:
        _decided[bin_dir] = _install(bin_dir, target)
    return _decided[bin_dir]


def _install(bin_dir: str, target: Path) -> bool:
    if os.geteuid() != 0 or not target.is_dir():
        return False
    if found := real_slurm():
        log.info("no Slurm wrappers in %s: this machine has its own Slurm (%s)", target, found)
        for name in SLURM_COMMANDS:  # a Slurm installed since: ours must not shadow it
            if is_ours(target / name):
                (target / name).unlink(missing_ok=True)
        return False
    for name in SLURM_COMMANDS:
        text = WRAPPER.format(mark=MARK, name=name, default=shlex.quote(bin_dir))
        dest = target / name
        if dest.exists() and (not is_ours(dest) or dest.read_text() == text):
            continue
        tmp = ""
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=target)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, dest)  # atomic: a job running the old one is unaffected
        except OSError as e:
            log.warning("cannot put Slurm's %s in %s (%s)", name, target, e)
            if tmp:
                Path(tmp).unlink(missing_ok=True)
            return False
    return True
