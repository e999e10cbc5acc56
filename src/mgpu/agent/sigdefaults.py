"""Jobs start with every signal at its default, whatever the agent was started with.

A process started in the background by a script ignores SIGINT and SIGQUIT; one started by
`nohup` ignores SIGHUP.  An ignored signal stays ignored across fork and exec, and a job's
/bin/sh cannot trap one that was ignored when it started: the jobs of such an agent could
never be stopped by ^C, `mgpu cancel --signal INT` or a hang-up.  So the agent (and its
spawner) keep ignoring them with a handler that does nothing instead: exec resets a handled
signal to its default, while it keeps an ignored one (slurmstepd likewise resets the
signals of the tasks it starts)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable

# What shells and nohup ignore, and what jobs are sent (`mgpu cancel --signal`, terminals).
# Not SIGPIPE and SIGXFSZ: Python ignores them itself and Popen restores them.
CAUGHT_INSTEAD = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)


def _nothing(signum: int, frame: object) -> None:
    """Stands in for an ignore (see the module docstring)."""


def ignore_quietly(signals: Iterable[signal.Signals]) -> None:
    """Ignore `signals` in this process without passing the ignore on to what it execs."""
    for sig in signals:
        signal.signal(sig, _nothing)


def defaults_for_children() -> list[signal.Signals]:
    """Turn every ignore this process inherited into a no-op handler; an ignored SIGCHLD
    (children reaped by the kernel: no exit code could be read) back to its default.
    Returns the signals changed.  Call from the main thread, before starting anything."""
    changed = []
    for sig in CAUGHT_INSTEAD:
        if signal.getsignal(sig) is signal.SIG_IGN:
            ignore_quietly((sig,))
            changed.append(sig)
    with contextlib.suppress(ValueError):
        if signal.getsignal(signal.SIGCHLD) is signal.SIG_IGN:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            changed.append(signal.SIGCHLD)
    return changed
