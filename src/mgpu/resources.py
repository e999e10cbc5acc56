"""CPUs and memory beside GPUs: what a job asks of each node it runs on.

A job asks in Slurm's terms (per node, per GPU, per CPU; `--mem=0` for all of a node's
memory; `--exclusive` for whole nodes) or in mgpu's own (`--cpus N`, `--mem SIZE`: per
node).  `ResourceAsk` keeps the ask as given, so that what a node must hold is computed
where the node is known: `cpus_on` and `mem_on` for a node given the GPUs the job would
take there.  An ask of nothing asks 0 CPUs and 0 MiB: such a job shares its node's CPUs
and memory with the others, as every job did before CPUs and memory were scheduled.

Pure data and arithmetic: used by the submit path, the scheduler core, the simulator and
the Slurm layer alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["NO_ASK", "ResourceAsk", "SizeError", "parse_size_mb", "within_mem_per_cpu"]

_UNIT_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class SizeError(ValueError):
    """A memory size that is not one (the text says which)."""


def parse_size_mb(text: str, *, default_unit: str = "M") -> int:
    """Slurm's memory sizes in MiB: `16000` (MiB by default), `500M`, `16G`, `1T`, `512K`
    (rounded up), an optional trailing `B`.  `0` stays 0 (Slurm's `--mem=0`)."""
    raw = text.strip().upper().removesuffix("B")
    unit = raw[-1] if raw and raw[-1] in _UNIT_MB else default_unit
    number = raw[:-1] if raw and raw[-1] in _UNIT_MB else raw
    try:
        value = float(number)
    except ValueError:
        raise SizeError(f"{text!r} is not a memory size (like 512M, 16G)") from None
    if value < 0 or value != value or value == float("inf"):
        raise SizeError(f"{text!r} is not a memory size (like 512M, 16G)")
    mb = value * _UNIT_MB[unit]
    return int(mb) if mb == int(mb) else int(mb) + 1


@dataclass(frozen=True, slots=True)
class ResourceAsk:
    """What a job asks of each node besides GPUs, as given (None: not asked).

    At most one of the memory forms is set (Slurm refuses two); the CPU forms add up
    (`cpus_per_node` from `-c` x tasks per node, `cpus_per_gpu` from `--cpus-per-gpu`).
    """

    cpus_per_node: int | None = None
    cpus_per_gpu: int | None = None
    mem_per_node_mb: int | None = None
    """0: all of the node's memory (Slurm's `--mem=0`)."""
    mem_per_gpu_mb: int | None = None
    mem_per_cpu_mb: int | None = None
    exclusive: bool = False
    """Whole nodes: every CPU, all memory and every GPU of each node it runs on."""

    @property
    def empty(self) -> bool:
        """Asks for nothing: shares its nodes' CPUs and memory (0 of each is held)."""
        return self == NO_ASK

    @property
    def whole_memory(self) -> bool:
        return self.exclusive or self.mem_per_node_mb == 0

    def cpus_on(self, gpus: int, node_cpus: int) -> int:
        """CPUs the job holds on a node where it takes `gpus` GPUs (of `node_cpus`)."""
        if self.exclusive:
            return node_cpus
        return (self.cpus_per_node or 0) + (self.cpus_per_gpu or 0) * gpus

    def mem_on(self, gpus: int, cpus: int, node_mem_mb: int) -> int:
        """MiB the job holds on a node where it takes `gpus` GPUs and `cpus` CPUs."""
        if self.whole_memory:
            return node_mem_mb
        if self.mem_per_node_mb is not None:
            return self.mem_per_node_mb
        if self.mem_per_gpu_mb is not None:
            return self.mem_per_gpu_mb * gpus
        if self.mem_per_cpu_mb is not None:
            return self.mem_per_cpu_mb * cpus
        return 0

    def to_record(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _ASK_FIELDS}

    @classmethod
    def from_record(cls, rec: dict[str, Any] | None) -> ResourceAsk:
        if not rec:
            return NO_ASK
        return cls(**{k: v for k, v in rec.items() if k in _ASK_FIELDS})


_ASK_FIELDS = tuple(f.name for f in fields(ResourceAsk))

NO_ASK = ResourceAsk()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def within_mem_per_cpu(ask: ResourceAsk, cap_mb: int | None, gpus: int) -> ResourceAsk:
    """`ask` with its CPUs raised, as Slurm raises them, so that no CPU holds more than
    `cap_mb` MiB (MaxMemPerCPU; `gpus`: what the job takes on a node).  Slurm's
    `_valid_pn_min_mem`: a `--mem-per-cpu` of M over the cap C multiplies the CPUs by
    r = ceil(M / C) and gives each ceil(M / r); a memory per node (or per GPU) raises the
    CPUs per node to at least ceil(memory / C).  The job is never refused for it (a count
    no node has is refused as any other: `could_ever_fit`)."""
    if not cap_mb or ask.whole_memory:
        return ask
    per_cpu = ask.mem_per_cpu_mb
    if per_cpu is not None:
        if per_cpu <= cap_mb:
            return ask
        r = _ceil_div(per_cpu, cap_mb)
        if ask.cpus_per_node is None and ask.cpus_per_gpu is None:
            cpus: dict[str, int | None] = {"cpus_per_node": r}
        else:
            cpus = {
                "cpus_per_node": None if ask.cpus_per_node is None else ask.cpus_per_node * r,
                "cpus_per_gpu": None if ask.cpus_per_gpu is None else ask.cpus_per_gpu * r,
            }
        return replace(ask, mem_per_cpu_mb=_ceil_div(per_cpu, r), **cpus)  # type: ignore[arg-type]
    have = ask.cpus_on(gpus, 0)
    least = _ceil_div(ask.mem_on(gpus, have, 0), cap_mb)
    if have >= least:
        return ask
    return replace(ask, cpus_per_node=(ask.cpus_per_node or 0) + least - have)
