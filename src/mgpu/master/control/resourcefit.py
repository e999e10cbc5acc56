"""Could any node ever hold a job's CPUs and memory?  Judged at submit, beside its GPUs.

The GPU side is the scheduler core's `could_ever_fit`; this is the CPU and memory side, on
what each node *offers* (its CPUs and memory less the reserve), not what is free: a job of
`--cpus 64` on a cluster whose biggest node offers 12 is refused at once, in Slurm's words
and with the numbers, instead of waiting for ever.  A node holds the job's ask only where
it also has the GPUs the job takes there; a node that does not say its CPUs or memory
(an older agent) holds no job that asks for them.  The site's maximum memory per CPU
(`max_mem_per_cpu`) is checked here too.
"""

from __future__ import annotations

from collections.abc import Sequence

from mgpu.config import JobResourceDefaults
from mgpu.gpuuse import memory_text
from mgpu.scheduler.types import JobRequest, NodeView

__all__ = ["NOT_AVAILABLE", "over_max_mem_per_cpu", "resources_never_fit"]

NOT_AVAILABLE = "Requested node configuration is not available"


def _gpus_on(req: JobRequest, node: NodeView) -> int:
    """GPUs the job would take on `node` (a job split over nodes: as many as it has)."""
    if req.nodes is not None:
        return req.gpus_per_node or 0
    if req.gpu_ids is not None:
        return len(req.gpu_ids)
    if req.distributed:
        return min(req.gpus, len(node.gpu_indices))
    return req.gpus


def _may_use(req: JobRequest, node: NodeView) -> bool:
    if req.allowed_nodes is not None and node.node_id not in req.allowed_nodes:
        return False
    if req.nodelist is not None and node.node_id not in req.nodelist:
        return False
    return node.node_id not in req.exclude and len(node.gpu_indices) >= _gpus_on(req, node)


def _holds(req: JobRequest, node: NodeView) -> bool:
    gpus = _gpus_on(req, node)
    cpus = req.ask.cpus_on(gpus, node.cpus)
    mem = req.ask.mem_on(gpus, cpus, node.mem_mb)
    if req.ask.exclusive and not (node.cpus and node.mem_mb):
        return False
    return (not cpus or cpus <= node.cpus) and (not mem or mem <= node.mem_mb)


def resources_never_fit(req: JobRequest, nodes: Sequence[NodeView]) -> str | None:
    """Why no node (or too few, for a gang of `nodes`) could ever hold the job's CPUs and
    memory: one sentence with the numbers; None when some could, or it asks for none."""
    if req.ask.empty or not nodes:
        return None
    usable = [n for n in nodes if _may_use(req, n)]
    if not usable:
        return None  # no node has its GPUs: could_ever_fit says so in its own words
    holding = sum(1 for n in usable if _holds(req, n))
    if holding >= (req.nodes or 1):
        return None
    example = max(usable, key=lambda n: (n.cpus, n.mem_mb))
    gpus = _gpus_on(req, example)
    cpus = req.ask.cpus_on(gpus, example.cpus)
    mem = req.ask.mem_on(gpus, cpus, example.mem_mb)
    wanted = []
    if req.ask.exclusive:
        wanted.append("a whole node")
    else:
        if cpus:
            wanted.append(f"{cpus} CPUs")
        if mem or req.ask.whole_memory:
            wanted.append("all of a node's memory" if req.ask.whole_memory else memory_text(mem))
    most_cpus = max(n.cpus for n in usable)
    most_mem = max(n.mem_mb for n in usable)
    offered = f"{most_cpus} CPUs" if most_cpus else "no CPUs said"
    offered += f" and {memory_text(most_mem)}" if most_mem else ", no memory said"
    gang = f" on each of {req.nodes} nodes" if req.nodes and req.nodes > 1 else " per node"
    return (
        f"{NOT_AVAILABLE}: the job asks for {' and '.join(wanted) or 'CPUs'}{gang}; "
        f"the most a node offers is {offered}"
    )


def over_max_mem_per_cpu(req: JobRequest, limits: JobResourceDefaults) -> str | None:
    """The job's memory per CPU past the site's `max_mem_per_cpu`: one sentence, or None."""
    cap = limits.max_mem_per_cpu
    ask = req.ask
    if cap is None or ask.whole_memory:
        return None
    if ask.mem_per_cpu_mb is not None:
        per_cpu = float(ask.mem_per_cpu_mb)
    else:
        cpus = ask.cpus_on(req.gpus_per_node or req.gpus, 0)
        mem = ask.mem_on(req.gpus_per_node or req.gpus, cpus, 0)
        if not mem or not cpus:
            return None
        per_cpu = mem / cpus
    if per_cpu <= cap:
        return None
    return (
        f"{NOT_AVAILABLE}: the job asks for {memory_text(per_cpu)} per CPU; this cluster "
        f"allows at most {memory_text(cap)} per CPU (max_mem_per_cpu): ask for more CPUs "
        "or less memory"
    )
