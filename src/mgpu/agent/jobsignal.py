"""`--signal`: a warning signal to a running job, before its time limit or its preemption.

To the whole job — every process of its process tree, its cgroup and its run tag — or,
for `B:`, to its top process only: the user's program (the script's interpreter), the
shim's child.  Never to the shim itself: it traps only TERM, INT and HUP, and most other
signals would end it and with it the record of the job's exit code.
"""

from __future__ import annotations

import contextlib

import psutil

from mgpu.agent import cgroups

__all__ = ["send"]


def send(
    shim: int | None, cgroup: str, tagged: set[psutil.Process], sig: int, top_only: bool
) -> int:
    """Send `sig` (see the module docstring); how many processes it went to.  `tagged`:
    the processes that carry the run's tag (when not `top_only`).  `shim` None: its pid
    names another process now (mgpu.agent.launcher.Launcher.pid_reused), whose children
    are not the job's: the cgroup and the tagged processes only.

    Parents before their children: a shell in `cmd & wait` that traps the signal must have
    it pending before its child dies of it, or its `wait` returns 0 and the shell leaves
    without running the trap."""
    targets: list[psutil.Process] = []
    if shim is not None:
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(shim)
            targets = list(top.children()) if top_only else _parents_first(top)
    if not top_only:
        known = {p.pid for p in targets} | ({shim} if shim is not None else set())
        extra = [p for p in tagged if p.pid not in known]
        known.update(p.pid for p in extra)
        for pid in cgroups.pids(cgroup) if cgroup else ():
            if pid not in known:
                with contextlib.suppress(psutil.Error):
                    extra.append(psutil.Process(pid))
        targets += extra
    sent = 0
    for p in targets:
        if p.pid == shim:
            continue
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)
            sent += 1
    return sent


def _parents_first(top: psutil.Process) -> list[psutil.Process]:
    """`top`'s descendants, level by level (its children, then theirs, ...)."""
    out: list[psutil.Process] = []
    level = top.children()
    while level:
        out += level
        nxt: list[psutil.Process] = []
        for p in level:
            with contextlib.suppress(psutil.Error):
                nxt += p.children()
        level = nxt
    return out
