"""A signal to a running job: `--signal`'s warning before its time limit or preemption, or
`scancel --signal` now.

To the whole job — every process of its process tree, its cgroup and its run tag — or,
for `B:` and `scancel -b`, to its top process only: the user's program (the script's
interpreter), the shim's child (under the -o/-e wrapper of a Slurm batch job, the batch
script).  Never to the shim itself (it traps only TERM, INT and HUP; most other signals
would end it and with it the record of the job's exit code), nor to that wrapper and its
output copies (they would end, and the job's output file with them).
"""

from __future__ import annotations

import contextlib

import psutil

from mgpu.agent import cgroups, outputfiles

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
    spared: set[int] = set() if shim is None else {shim}
    if shim is not None:
        with contextlib.suppress(psutil.Error):
            tops = []
            for child in psutil.Process(shim).children():
                top, helpers = _unwrap(child)
                spared |= helpers
                tops += [top] if top is not None else []
            targets = tops if top_only else _parents_first(tops)
    if not top_only:
        known = {p.pid for p in targets} | spared
        extra = [p for p in tagged if p.pid not in known]
        known.update(p.pid for p in extra)
        for pid in cgroups.pids(cgroup) if cgroup else ():
            if pid not in known:
                with contextlib.suppress(psutil.Error):
                    extra.append(psutil.Process(pid))
        targets += extra
    sent = 0
    for p in targets:
        if p.pid in spared:
            continue
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)
            sent += 1
    return sent


def _unwrap(child: psutil.Process) -> tuple[psutil.Process | None, set[int]]:
    """The job's top process for the shim's `child`, and mgpu's own processes to spare:
    under the -o/-e wrapper (mgpu.agent.outputfiles) the top is the batch script, the one
    child or grandchild (under the subshell that waits for it) whose SLURM_TASK_PID is its
    own pid; the wrapper, that subshell and its output copies are mgpu's (a USR1 would end
    them, and the job's output file with them)."""
    with contextlib.suppress(psutil.Error):
        if child.cmdline()[3:4] != [outputfiles.MARK]:
            return child, set()
        kids = child.children()
        for kid in list(kids):
            with contextlib.suppress(psutil.Error):
                kids += kid.children()
        script = None
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                if kid.environ().get("SLURM_TASK_PID") == str(kid.pid):
                    script = kid
        return script, {child.pid} | {k.pid for k in kids if k is not script}
    return child, set()


def _parents_first(tops: list[psutil.Process]) -> list[psutil.Process]:
    """`tops` and their descendants, level by level (their children, then theirs, ...)."""
    out: list[psutil.Process] = []
    level = tops
    while level:
        out += level
        nxt: list[psutil.Process] = []
        for p in level:
            with contextlib.suppress(psutil.Error):
                nxt += p.children()
        level = nxt
    return out
