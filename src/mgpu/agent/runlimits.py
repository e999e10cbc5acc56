"""A run held to the CPUs and memory it was granted (`Grant.cpus`, `Grant.mem_mb`), and how
much memory it used and whether it ran out.

Each controller is taken from cgroup v2 where the run's own (containment) cgroup has it
(mgpu.agent.cgroups; the agent enables it in `cgroup.subtree_control` from its own cgroup
down), else from its v1 hierarchy, where each run gets a cgroup
`<own>/mgpu/<agent key>/<job>.<epoch>` that the shim joins at its gate with its others:

* CPUs: a cpuset of exactly the granted CPUs (v2 `cpuset.cpus`, v1 `cpuset.cpus` with the
  parent's `cpuset.mems`); where no cpuset can be had, or the grant names CPUs this
  machine does not have (`--fake-cpus`), a quota of as many CPUs (v2 `cpu.max`, v1
  `cpu.cfs_quota_us`).
* memory: a limit with swap included (v2 `memory.max` and `memory.swap.max` 0, v1
  `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes` where swap is accounted); a run
  past it is killed whole: v2 `memory.oom.group` 1 has the kernel kill all of it, v1 kills
  one process, and the agent (`Launcher.watch_memory`) kills the rest once it sees the
  kill counted.  Its peak is the kernel's (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`,
  else the highest `memory.current` sampled), sent while the run goes on and at its end:
  of every run, limited or not, where the node has a memory controller and contains runs
  in cgroups (a run without a grant is counted, not limited: its own v2 cgroup, or a v1
  cgroup with no limit, which charges its parent as before; one that cannot be made costs
  the run its count only).

The files are root's and not writable by others: a job (its user's processes) can neither
raise its limits nor leave its cgroups.  A grant of None is no limit; a limit the node has
no controller for is not held, and the job is told so on its stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mgpu.agent import cgroups

log = logging.getLogger("mgpu.agent")

CPUSET = "cpuset"
CPU = "cpu"
MEMORY = "memory"
CONTROLLERS = (CPUSET, CPU, MEMORY)
PERIOD_US = 100_000
"""The CPU quota's period (v2 `cpu.max`'s default)."""
MB = 1 << 20

__all__ = [
    "CONTROLLERS",
    "LimitError",
    "Limits",
    "MemoryUse",
    "RunLimits",
    "apply",
    "choose",
    "cpu_list",
    "format_cpus",
    "memory_use",
    "sweep",
]


class LimitError(RuntimeError):
    """A limit the node has a controller for could not be written (one sentence)."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    version: int
    """2: the limits go in the run's containment cgroup; 1: in a cgroup of their own."""
    base: str
    """The directory of this agent's run cgroups there."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Where this agent can put each controller's limits (a controller not named: nowhere)."""

    where: dict[str, Hierarchy] = field(default_factory=dict)

    def describe(self) -> str:
        shown = [f"{c} v{self.where[c].version}" for c in CONTROLLERS if c in self.where]
        return ", ".join(shown) or "none"


# ---- cpu lists ---------------------------------------------------------------------------


def cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel cpu list (`0-3,8,10-11`)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def format_cpus(cpus: Iterable[int]) -> str:
    """A cpu list as the kernel writes it, ranges joined."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


# ---- choosing where ----------------------------------------------------------------------


def choose(
    key: str,
    containment: cgroups.Containment,
    mountinfo_path: str = "/proc/self/mountinfo",
    cgroup_path: str = "/proc/self/cgroup",
) -> Limits:
    """Where each controller's limits go for the agent named `key` (bases created)."""
    where: dict[str, Hierarchy] = {}
    if containment.method == cgroups.V2 and containment.base is not None:
        for ctrl in enable_v2(containment.base, CONTROLLERS):
            where[ctrl] = Hierarchy(2, containment.base)
    try:
        with open(mountinfo_path) as f:
            mountinfo = f.read()
        with open(cgroup_path) as f:
            self_cgroup = f.read()
    except OSError:
        return Limits(where)
    for ctrl in CONTROLLERS:
        if ctrl in where:
            continue
        own = cgroups.v1_hierarchy(mountinfo, self_cgroup, ctrl)
        base = None if own is None else v1_base(own, key, ctrl)
        if base is not None:
            where[ctrl] = Hierarchy(1, base)
    return Limits(where)


def enable_v2(base: str, wanted: Sequence[str]) -> list[str]:
    """Enable `wanted` for the run cgroups under `base` (this agent's v2 directory, two
    below the agent's own cgroup), from the agent's own cgroup down; which are enabled.
    The agent's own cgroup takes it only where the kernel lets it (no processes of its
    own there, or the controller already enabled by whoever delegated it)."""
    top = os.path.dirname(os.path.dirname(base))
    for path in (top, os.path.dirname(base), base):
        have = _words(path, "cgroup.controllers")
        on = _words(path, "cgroup.subtree_control")
        cgroups.enable(path, [c for c in wanted if c in have and c not in on])
    on = _words(base, "cgroup.subtree_control")
    return [c for c in wanted if c in on]


def v1_base(own: str, key: str, ctrl: str) -> str | None:
    """This agent's directory of run cgroups in the v1 hierarchy of `ctrl` (made, a cpuset's
    CPUs and memory nodes copied down from its parent), or None where it cannot be used."""
    base = os.path.join(own, cgroups.TOP, key)

    def inherit() -> None:
        for path in (os.path.dirname(base), base):
            _inherit_cpuset(path)

    probe = {CPUSET: "cpuset.cpus", CPU: "cpu.cfs_quota_us", MEMORY: "memory.limit_in_bytes"}
    why = cgroups.make_base(base, probe[ctrl], inherit if ctrl == CPUSET else None)
    if why is None:
        return base
    log.debug("cannot use the v1 %s hierarchy: %s", ctrl, why)
    return None


def _inherit_cpuset(path: str) -> None:
    """A new v1 cpuset has no CPUs and no memory nodes: its parent's, where it has none."""
    parent = os.path.dirname(path)
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not _read(path, name):
            cgroups.write(path, name, _read(parent, name) or "0")


# ---- one run -----------------------------------------------------------------------------


@dataclass(slots=True)
class RunLimits:
    """What `apply` made for one run."""

    join: list[str] = field(default_factory=list)
    """v1 cgroups the shim must join at its gate (with its containment cgroup)."""
    memory: str = ""
    """The cgroup whose memory counters are the run's (empty: none)."""
    unheld: list[str] = field(default_factory=list)
    """Granted limits this node has no controller for (to tell the job)."""

    def note(self) -> str | None:
        if not self.unheld:
            return None
        return f"this node cannot hold the job to its {' and '.join(self.unheld)}: not limited"


def apply(
    limits: Limits,
    job_id: str,
    epoch: int,
    cpus: Sequence[int] | None,
    mem_mb: int | None,
    run_cgroup: str | None,
) -> RunLimits:
    """Write a run's limits before its shim starts.  Raises LimitError where a controller
    is there but refuses them (what was made is removed): the run must not start."""
    made = RunLimits()
    try:
        _apply_memory(limits, job_id, epoch, mem_mb, run_cgroup, made)
        if cpus is not None:
            _apply_cpus(limits, job_id, epoch, cpus, run_cgroup, made)
    except OSError as e:
        for path in made.join:
            cgroups.release(path)
        raise LimitError(f"cannot write the job's CPU and memory limits: {e}") from None
    return made


def _run_dir(
    limits: Limits, ctrl: str, job_id: str, epoch: int, run: str | None, made: RunLimits
) -> str | None:
    """The cgroup where a run's `ctrl` limits go (v1: made, and to be joined), or None: no
    such controller."""
    where = limits.where.get(ctrl)
    if where is None:
        return None
    if where.version == 2:
        if run is None:
            raise OSError(f"no cgroup of its own for its {ctrl} limits")
        return run
    path = os.path.join(where.base, cgroups.run_name(job_id, epoch))
    cgroups.make_run_dir(path)
    made.join.append(path)
    return path


def _apply_memory(
    limits: Limits, job_id: str, epoch: int, mem_mb: int | None, run: str | None, made: RunLimits
) -> None:
    if mem_mb is None:
        _count_memory(limits, job_id, epoch, run, made)
        return
    path = _run_dir(limits, MEMORY, job_id, epoch, run, made)
    if path is None:
        made.unheld.append(f"{mem_mb} MB of memory")
        return
    made.memory = path
    limit = str(max(mem_mb, 1) * MB)
    if limits.where[MEMORY].version == 2:
        cgroups.write(path, "memory.max", limit)
        _write_if_there(path, "memory.swap.max", "0")
        _write_if_there(path, "memory.oom.group", "1")
    else:
        cgroups.write(path, "memory.limit_in_bytes", limit)
        _write_if_there(path, "memory.memsw.limit_in_bytes", limit)


def _count_memory(
    limits: Limits, job_id: str, epoch: int, run: str | None, made: RunLimits
) -> None:
    """A run granted no memory: counted, not limited (its peak is reported as any run's),
    in its own v2 cgroup or a v1 cgroup of no limit; never refused for it.  Only a run
    contained in a cgroup of its own (`run`) is: on a node that contains runs by their
    process tree, a cgroup would also catch what escapes the tree, which it must not
    change."""
    where = limits.where.get(MEMORY)
    if where is None or run is None:
        return
    try:
        path = _run_dir(limits, MEMORY, job_id, epoch, run, made)
    except OSError as e:
        log.debug("job %s: its memory is not counted: %s", job_id, e)
        return
    made.memory = path or ""


def _apply_cpus(
    limits: Limits, job_id: str, epoch: int, cpus: Sequence[int], run: str | None, made: RunLimits
) -> None:
    path = _run_dir(limits, CPUSET, job_id, epoch, run, made)
    if path is not None:
        where = limits.where[CPUSET]
        if where.version == 1:  # made again if it was taken away since (a new v1 cpuset has
            for above in (os.path.dirname(where.base), where.base):  # no CPUs: the quota,
                with contextlib.suppress(OSError):  # where its job was granted CPUs it
                    _inherit_cpuset(above)  # could have had); best done, checked below
        here = cpu_list(_read(os.path.dirname(path), _effective(where)))
        if set(cpus) <= here and cpus:
            if limits.where[CPUSET].version == 1:
                cgroups.write(path, "cpuset.mems", _read(os.path.dirname(path), "cpuset.mems"))
            cgroups.write(path, "cpuset.cpus", format_cpus(cpus))
            return
        log.info("job %s: CPUs %s not all on this node: a quota instead", job_id, list(cpus))
        if path != run:
            made.join.remove(path)
            cgroups.release(path)
    path = _run_dir(limits, CPU, job_id, epoch, run, made)
    if path is None:
        made.unheld.append(f"{len(cpus)} CPU(s)")
        return
    count = max(len(cpus), 1)
    if limits.where[CPU].version == 2:
        cgroups.write(path, "cpu.max", f"{count * PERIOD_US} {PERIOD_US}")
    else:
        period = int(_read(path, "cpu.cfs_period_us") or PERIOD_US)
        cgroups.write(path, "cpu.cfs_quota_us", str(count * period))


def _effective(where: Hierarchy) -> str:
    return "cpuset.cpus.effective" if where.version == 2 else "cpuset.effective_cpus"


def _write_if_there(path: str, name: str, value: str) -> None:
    """A file only some kernels have (swap accounting, `memory.oom.group`)."""
    if os.path.exists(os.path.join(path, name)):
        cgroups.write(path, name, value)


# ---- what a run used ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryUse:
    oom_kills: int | None
    """Processes the kernel killed for the cgroup's limit (None: the kernel does not say)."""
    failcnt: int
    """v1: times the limit was hit (the fallback where no kill count is kept)."""
    peak_bytes: int | None
    """The peak the kernel kept (None: it keeps none; sample `current_bytes`)."""
    current_bytes: int | None


def memory_use(path: str) -> MemoryUse:
    """A run's memory counters (cgroup v2 or v1, told apart by their files)."""
    if os.path.exists(os.path.join(path, "memory.events")):
        events = _pairs(_read(path, "memory.events"))
        kills = max(events.get("oom_kill", 0), events.get("oom_group_kill", 0))
        return MemoryUse(
            kills, 0, _int(_read(path, "memory.peak")), _int(_read(path, "memory.current"))
        )
    control = _pairs(_read(path, "memory.oom_control"))
    return MemoryUse(
        control.get("oom_kill"),
        _int(_read(path, "memory.failcnt")) or 0,
        _int(_read(path, "memory.max_usage_in_bytes")),
        _int(_read(path, "memory.usage_in_bytes")),
    )


# ---- start-up ----------------------------------------------------------------------------


def sweep(limits: Limits, keep: set[str]) -> list[str]:
    """Remove this agent's v1 limit cgroups of runs it no longer knows (not in `keep`)."""
    removed: list[str] = []
    for where in {w.base for w in limits.where.values() if w.version == 1}:
        removed += cgroups.sweep(cgroups.Containment("v1", where), keep)
    return removed


# ---- files -------------------------------------------------------------------------------


def _read(path: str, name: str) -> str:
    with contextlib.suppress(OSError), open(os.path.join(path, name)) as f:
        return f.read().strip()
    return ""


def _words(path: str, name: str) -> set[str]:
    return set(_read(path, name).split())


def _pairs(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[name] = int(value)
    return out


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
