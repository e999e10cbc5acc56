"""A job's and a node's CPUs and memory as Slurm 22.05's commands print them, from mgpu's
JSON: the job's ask (`resources`), what each node of it was granted (`allocation[*].cpus`,
`mem_mb`), a node's `cpus`, `cpus_free`, `mem_mb`, `mem_free_mb`.

Memory is in Slurm's units (`convert_num_unit`, CONVERT_NUM_UNIT_EXACT: `16000M`, `16G`,
`1.50G`); TRES strings are `cpu=4,mem=16G,node=1,billing=4,gres/gpu=1` (scontrol's, in
Slurm's TRES id order) or sorted by name (sacct's).  A job that asked for nothing and holds
nothing of its own shows what it showed before CPUs were counted: its tasks times -c.
"""

from __future__ import annotations

from mgpu.slurm import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "alloc_cpus",
    "convert",
    "memory",
    "min_memory",
    "num_cpus",
    "req_cpus",
    "req_mem",
    "tres",
]

_UNITS = ("", "K", "M", "G", "T", "P")


def convert(number: float, unit: int = 0) -> str:
    """Slurm's `convert_num_unit` with CONVERT_NUM_UNIT_EXACT: up a unit (of 1024) while
    no precision is lost (half values count as exact); `unit` is the number's own (2: MiB)."""
    if int(number) == 0:
        return "0"
    while number >= 1024 and int(number) % 512 == 0 and unit < len(_UNITS) - 1:
        number /= 1024
        unit += 1
    if number == int(number):
        return f"{int(number)}{_UNITS[unit]}"
    return f"{number:.2f}{_UNITS[unit]}"


def memory(mb: float) -> str:
    """MiB in Slurm's units: `16000M`, `16G`, `0`."""
    return convert(mb, 2)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _started(job: dict[str, Any]) -> bool:
    return bool(job.get("allocation")) and job.get("state") != "queued"


def _nodes(job: dict[str, Any]) -> int:
    if _started(job):
        return len(job["allocation"])
    return _int(job.get("nodes")) or 1


def _gpus_per_node(job: dict[str, Any]) -> int:
    if (_int(job.get("nodes")) or 1) > 1:
        return _int(job.get("gpus_per_node"))
    return _int(job.get("gpus"))


def _asked(job: dict[str, Any]) -> dict[str, Any]:
    """The job's CPU and memory ask (a master of before CPUs were counted: its block's)."""
    asked = job.get("resources")
    if isinstance(asked, dict):
        return asked
    block = common.slurm_block(job)
    return {k: block.get(k) for k in ("mem_per_node_mb", "mem_per_cpu_mb", "mem_per_gpu_mb")}


def _granted(job: dict[str, Any], key: str) -> list[int] | None:
    """Each node's granted CPUs (`cpus`) or MiB (`mem_mb`); None unless every node says."""
    if not _started(job):
        return None
    values = [_int(slot.get(key)) for slot in job["allocation"]]
    return values if all(values) else None


def _task_cpus(job: dict[str, Any]) -> int:
    """CPUs of a job that holds none of its own: its tasks times -c (Slurm's defaults)."""
    block = common.slurm_block(job)
    tasks = block.get("ntasks") or (block.get("ntasks_per_node") or 1) * _nodes(job)
    return int(tasks) * int(block.get("cpus_per_task") or 1)


def req_cpus(job: dict[str, Any]) -> int:
    """The CPUs the job asks for, on all its nodes, as sacct's ReqCPUS: its tasks times -c
    (Slurm 22.05 counts neither --cpus-per-gpu nor --exclusive here: what they add is
    known once placed, AllocCPUS)."""
    per_node = _int(_asked(job).get("cpus_per_node"))
    return per_node * _nodes(job) if per_node else _task_cpus(job)


def alloc_cpus(job: dict[str, Any]) -> int:
    """The CPUs the job was granted, on all its nodes (before CPUs were counted: tasks
    times -c)."""
    granted = _granted(job, "cpus")
    return sum(granted) if granted else _task_cpus(job)


def num_cpus(job: dict[str, Any]) -> int:
    """squeue's %C, scontrol's NumCPUs: granted once running, else asked."""
    return alloc_cpus(job) if _started(job) else req_cpus(job)


def _node_memory(job: dict[str, Any]) -> int | None:
    """MiB asked per node (None: asked per CPU, or not at all; `--mem=0` its grant)."""
    asked = _asked(job)
    per_node = asked.get("mem_per_node_mb")
    if isinstance(per_node, int) and per_node > 0:
        return per_node
    granted = _granted(job, "mem_mb")
    if per_node == 0 or asked.get("exclusive"):
        return granted[0] if granted else 0
    per_gpu = asked.get("mem_per_gpu_mb")
    if isinstance(per_gpu, int):
        return per_gpu * _gpus_per_node(job)
    return granted[0] if granted else None


def min_memory(job: dict[str, Any]) -> tuple[str, str]:
    """(`Node` or `CPU`, the size): scontrol's MinMemoryNode/MinMemoryCPU, squeue's %m.
    As Slurm's: only a size asked per node or per CPU; `--mem=0`, `--mem-per-gpu` (its
    MemPerTres) and `--exclusive` show 0."""
    asked = _asked(job)
    per_cpu = asked.get("mem_per_cpu_mb")
    if isinstance(per_cpu, int):
        return "CPU", memory(per_cpu)
    per_node = asked.get("mem_per_node_mb")
    return "Node", memory(per_node if isinstance(per_node, int) else 0)


def req_mem(job: dict[str, Any]) -> int | None:
    """sacct's ReqMem: MiB asked on all the job's nodes (None: none asked or held)."""
    per_cpu = _asked(job).get("mem_per_cpu_mb")
    if isinstance(per_cpu, int):
        return per_cpu * req_cpus(job)
    per_node = _node_memory(job)
    return None if per_node is None else per_node * _nodes(job)


def _alloc_mem(job: dict[str, Any]) -> int | None:
    granted = _granted(job, "mem_mb")
    return sum(granted) if granted else None


def _held_gpus(job: dict[str, Any], step: bool) -> int:
    """The GPUs the job's nodes hold for it (an --exclusive job's: all of theirs); a
    step's, only where its job asked for GPUs (Slurm's steps get the job's GPU ask)."""
    if step and not _int(job.get("gpus")):
        return 0
    held = sum(len(slot.get("gpu_ids") or ()) for slot in job["allocation"])
    return held or _int(job.get("gpus"))


def tres(job: dict[str, Any], alloc: bool, by_name: bool, step: bool = False) -> str:
    """`cpu=..,mem=..,node=..,billing=..,gres/gpu=..` of what the job holds (`alloc`; empty
    before it starts) or asks; sacct's sorted by name.  Billing is its CPUs, as Slurm's
    without TRESBillingWeights."""
    if alloc and not _started(job):
        return ""
    cpus = alloc_cpus(job) if alloc else req_cpus(job)
    mem = _alloc_mem(job) if alloc else req_mem(job)
    items = [("cpu", str(cpus))]
    if mem:
        items.append(("mem", memory(mem)))
    items += [("node", str(_nodes(job))), ("billing", str(cpus))]
    gpus = _held_gpus(job, step) if alloc else _int(job.get("gpus"))
    if gpus:
        items.append(("gres/gpu", str(gpus)))
    if by_name:
        items.sort()
    return ",".join(f"{k}={v}" for k, v in items)


# ---- nodes ------------------------------------------------------------------------------


def node_cpus(node: dict[str, Any]) -> tuple[int, int]:
    """(total, free) CPUs of a node; one CPU, free, for a node that does not say (Slurm's
    default CPUs=1)."""
    total = _int(node.get("cpus"))
    if not total:
        return 1, 1
    return total, _int(node.get("cpus_free"))


def node_memory(node: dict[str, Any]) -> tuple[int, int | None]:
    """(total, free) MiB of a node; Slurm's default RealMemory=1 for one that does not say
    (free: None, unknown)."""
    total = _int(node.get("mem_mb"))
    if not total:
        return 1, None
    return total, _int(node.get("mem_free_mb"))
