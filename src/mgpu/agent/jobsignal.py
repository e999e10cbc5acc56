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


def send(shim: int, cgroup: str, tagged: set[psutil.Process], sig: int, top_only: bool) -> int:
    """Send `sig` (see the module docstring); how many processes it went to.  `tagged`:
    the processes that carry the run's tag (when not `top_only`)."""
    try:
        targets = set(psutil.Process(shim).children(recursive=not top_only))
    except psutil.Error:
        targets = set()
    if not top_only:
        targets |= tagged
        known = {p.pid for p in targets} | {shim}
        for pid in cgroups.pids(cgroup) if cgroup else ():
            if pid not in known:
                with contextlib.suppress(psutil.Error):
                    targets.add(psutil.Process(pid))
    sent = 0
    for p in targets:
        if p.pid == shim:
            continue
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)
            sent += 1
    return sent
