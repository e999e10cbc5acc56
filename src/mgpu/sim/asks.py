"""What a trace job asks of the simulated nodes besides GPUs: CPUs and memory.

A trace gives a job's CPUs and memory in all (the CSV `cpus` and `mem_mb` columns).  A job
on one node asks for them per node; a job wider than a node (split over nodes, see
`simulator.to_request`) asks for its share per GPU, so that each node it spans holds its
part.  A job whose trace says nothing gets the cluster's defaults per GPU: a node's CPUs and
memory divided by its GPUs (Slurm's `DefCpuPerGPU`/`DefMemPerGPU`), so that jobs that say
nothing pack onto GPUs as they would without CPUs and memory (a share of a GPU asks nothing
then).  What a node could never hold is cut down to the node, as GPUs are to the cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mgpu.resources import NO_ASK, ResourceAsk

__all__ = ["NodeSize", "trace_ask"]


@dataclass(frozen=True, slots=True)
class NodeSize:
    """One simulated node: its GPUs, CPUs and memory (0: it does not say)."""

    gpus: int
    cpus: int = 0
    mem_mb: int = 0


def trace_ask(
    cpus: int | None, mem_mb: int | None, gpus: int, share: bool, node: NodeSize
) -> tuple[ResourceAsk, bool]:
    """The ask of a trace job of `gpus` GPUs (`share`: part of one) that gives `cpus` and
    `mem_mb` in all (None: not given), and whether it was cut down to fit a node."""
    split = gpus > node.gpus and not share
    per_node: dict[str, int | None] = {"cpus": None, "mem": None}
    per_gpu: dict[str, int | None] = {"cpus": None, "mem": None}
    cut = False
    for kind, asked, offered in (("cpus", cpus, node.cpus), ("mem", mem_mb, node.mem_mb)):
        if asked is not None:
            per = math.ceil(asked / gpus) if split else asked
            cut |= per > offered
            (per_gpu if split else per_node)[kind] = min(per, offered) or None
        elif offered and not share:
            per_gpu[kind] = offered // node.gpus or None
    ask = ResourceAsk(
        cpus_per_node=per_node["cpus"],
        cpus_per_gpu=per_gpu["cpus"],
        mem_per_node_mb=per_node["mem"],
        mem_per_gpu_mb=per_gpu["mem"],
    )
    return (NO_ASK if ask.empty else ask), cut
