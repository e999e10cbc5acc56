"""Which CPUs of a node: those it offers to jobs, and those a starting job gets.

A node says which CPUs it may use, each with its core and NUMA node (protocol.CpuDesc);
the cluster config holds some back for the system (`reserve.cpus`: the highest-numbered,
whole cores first, as Slurm's CoreSpecCount).  The scheduler core decides how many CPUs a
job holds on a node; `pick_cpus` decides which: free ones, near the job's GPUs (their
NUMA node) where the node says, whole cores (hyper-thread siblings together) where it can.
Pure functions over plain values.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from mgpu.protocol import CpuDesc

__all__ = ["held_back", "offered_cpus", "pick_cpus"]


def _cores(cpus: Sequence[CpuDesc]) -> dict[int, list[CpuDesc]]:
    """Core id -> its CPUs (sorted by id), in order of core id."""
    out: dict[int, list[CpuDesc]] = {}
    for cpu in sorted(cpus, key=lambda c: c.id):
        out.setdefault(cpu.core, []).append(cpu)
    return dict(sorted(out.items()))


def held_back(cpus: Sequence[CpuDesc], count: int) -> set[int]:
    """The ids of the `count` CPUs kept for the system: the highest-numbered cores whole,
    then the highest CPUs of the next core down for what is left."""
    out: set[int] = set()
    for siblings in sorted(_cores(cpus).values(), key=lambda s: -s[-1].id):
        if len(out) >= count:
            break
        take = min(count - len(out), len(siblings))
        out.update(c.id for c in siblings[-take:])
    return out


def offered_cpus(cpus: Sequence[CpuDesc], reserve: int) -> list[CpuDesc]:
    """What a node offers to jobs: its CPUs less the `reserve` held back, sorted by id."""
    kept = held_back(cpus, reserve) if reserve else set()
    return sorted((c for c in cpus if c.id not in kept), key=lambda c: c.id)


def pick_cpus(
    cpus: Sequence[CpuDesc], taken: Collection[int], count: int, near: Collection[int] = ()
) -> list[int] | None:
    """`count` free CPU ids of `cpus` (those not in `taken`), or None when fewer are free.

    Cores are taken one at a time in this order: on a NUMA node in `near` first (the job's
    GPUs'); then those whose free CPUs the job takes all of (they fit in what is still
    needed) before one it would split; then cores none of whose CPUs another job holds
    (whole) before shared ones; then by core id.  So a job asking a multiple of its node's
    threads per core gets whole cores whenever whole cores are free."""
    if count <= 0:
        return []
    cores = _cores(cpus)
    free = {core: [c for c in sibs if c.id not in taken] for core, sibs in cores.items()}
    free = {core: sibs for core, sibs in free.items() if sibs}
    if sum(len(s) for s in free.values()) < count:
        return None
    picked: list[int] = []
    while len(picked) < count:
        need = count - len(picked)

        def order(core: int, need: int = need) -> tuple[bool, bool, bool, int]:
            sibs = free[core]
            far = bool(near) and sibs[0].numa not in near
            return (far, len(sibs) > need, len(sibs) < len(cores[core]), core)

        best = min(free, key=order)
        picked += [c.id for c in free.pop(best)[:need]]
    return sorted(picked)
