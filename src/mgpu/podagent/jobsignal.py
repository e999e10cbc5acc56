"""A signal to the job itself, in its Pod (`scancel --signal`, `-b`, a cancel's warning).

The pod agent runs as the job's user in the job's container, so it may signal the job's
processes there, as mgpu's own agent does on its nodes (mgpu.agent.jobsignal): every
process of the job, parents first, or for `-b` (`top_only`) its top process only: the
batch script (the container's first process, or under the -o/-e runner the script it
runs: marked with `BATCH_MARK`, mgpu.master.kube.podoutput).  Never the agent itself nor
its steps (each in its own session, signalled as steps), nor the -o/-e runner and its
output copies (they would end, and the job's output file with them).

The Pod shares one process namespace between its containers (`shareProcessNamespace`,
mgpu.master.kube.podspec): pid 1 is then the Pod's pause process, never signalled, and the
job's top process is the one the runtime started (its parent outside the namespace).  In a
Pod of its own namespace (made by an older master) the top process is pid 1, to which
Linux delivers only a signal it traps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from mgpu.exits import POD_INIT_MARK

__all__ = ["BATCH_MARK", "Proc", "ancestors", "read_procs", "send", "targets"]

BATCH_MARK = "MGPU_BATCH_TOP=1"
"""In the environment of the batch script the -o/-e runner starts (and its children)."""


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    marked: bool
    """Its environment holds BATCH_MARK."""
    init: bool = False
    """Its environment holds POD_INIT_MARK: `mgpu pod-init`, which sends on what it gets."""


def targets(procs: list[Proc], me: int, steps: set[int], top_only: bool) -> list[int]:
    """The pids a signal to the job goes to, parents first.  `me`: the agent's pid (its
    own session); `steps`: its steps' pids (each leads its own session)."""
    spared = {me, *steps}
    started = [p for p in procs if p.ppid == 0 and p.pid not in spared]  # by the runtime
    if any(p.pid != 1 for p in started):  # a shared namespace: pid 1 is the Pod's pause
        spared.add(1)
    inits = {p.pid for p in procs if p.init}  # pod-init: its child is the job's top
    job = [p for p in procs if p.pid not in spared | inits and p.sid not in spared]
    marked = [p for p in job if p.marked]
    if marked:  # the runner's script: the runner and its copies are spared
        job = marked
        pids = {p.pid for p in marked}
        tops = [p for p in marked if p.ppid not in pids]
    else:
        tops = [p for p in job if p.ppid == 0 or p.ppid in inits]
    if top_only:
        return [p.pid for p in tops]
    by_pid = {p.pid: p for p in job}

    def depth(p: Proc) -> int:
        return sum(1 for _ in ancestors(p.pid, by_pid))

    return [p.pid for p in sorted(job, key=lambda p: (depth(p), p.pid))]


def ancestors(pid: int, procs: Mapping[int, Proc]) -> Iterator[int]:
    """The parent of `pid`, its parent, and so on while `procs` holds them: a bounded walk
    (processes read one by one may make a loop as pids are reused)."""
    seen = 0
    while pid in procs and procs[pid].ppid in procs and seen < len(procs):
        pid, seen = procs[pid].ppid, seen + 1
        yield pid


def read_procs(root: str = "/proc") -> list[Proc]:
    """The processes this container shows, as `targets` needs them."""
    procs = []
    mark, init = BATCH_MARK.encode(), POD_INIT_MARK.encode()
    for name in os.listdir(root):
        if not name.isdigit():
            continue
        try:
            with open(f"{root}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            env: list[bytes] = []
            with contextlib.suppress(OSError), open(f"{root}/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")  # unreadable: another user's
        except (OSError, IndexError):
            continue  # ended meanwhile
        pid, ppid, sid = int(name), int(fields[1]), int(fields[3])
        procs.append(Proc(pid, ppid, sid, mark in env, init in env))
    return procs


def send(sig: int, me: int, steps: set[int], top_only: bool) -> int:
    """Send `sig` to the job's processes in this container; how many it went to."""
    sent = 0
    for pid in targets(read_procs(), me, steps, top_only):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent
