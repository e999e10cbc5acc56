"""How a process ended, as mgpu stores it and as people and shells read it.

A job's `exit_code` is its process's code, or -N where signal N killed it (Python's
`returncode`; sacct's `0:N`).  A command that relays a job's end exits as a shell would
report it: 128+N for a signal's death."""

from __future__ import annotations

__all__ = [
    "OPEN_FAILED",
    "OPEN_FAILED_MARK",
    "POD_INIT_MARK",
    "describe",
    "open_failure",
    "shell_code",
    "shell_status",
]

OPEN_FAILED = 53
"""The status of a batch job's -o/-e wrapper when a file cannot be opened, as slurmstepd's
(mgpu.agent.outputfiles on mgpu's nodes, mgpu.master.kube.podoutput in a Pod)."""
OPEN_FAILED_MARK = "slurmstepd: error: Could not open "
"""How the wrapper's sentence begins: among the first lines of the job's stderr (nothing
else has written there yet)."""

POD_INIT_MARK = "MGPU_POD_INIT=1"
"""In the environment of `mgpu pod-init` only (mgpu.podagent.init), the process that tells a
Pod's job's death by signal: the pod agent never signals it (mgpu.podagent.jobsignal)."""


def describe(code: int) -> str:
    """`exit code 3`, `killed by signal 9 (SIGKILL)`."""
    if code >= 0:
        return f"exit code {code}"
    import signal  # here: it imports enum, which `mgpu queue` never needs

    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"killed by signal {-code}{name}"


def shell_code(code: int) -> int:
    """The code as a shell reports it: a death by signal N (-N) is 128+N."""
    return 128 - code if code < 0 else code


def shell_status(code: int) -> int:
    """`shell_code`, or 1 for a code no exit status can carry."""
    status = shell_code(code)
    return status if 0 <= status < 256 else 1


def open_failure(code: int | None, first_lines: list[str]) -> str | None:
    """Slurm's sentence of a batch job whose -o/-e file could not be opened (the wrapper's
    status and its line among the first of the job's stderr); else None."""
    if code != OPEN_FAILED:
        return None
    for line in first_lines[:4]:
        if line.startswith(OPEN_FAILED_MARK):
            return line.removeprefix("slurmstepd: error: ")
    return None
