"""What a Slurm job asks of each node besides GPUs (`slurm_ask`: the one translation of its
Slurm options into a `mgpu.resources.ResourceAsk`), and Slurm's sentences for the options
that exclude each other: shared by the Slurm commands (mgpu.slurm.resources checks the
options as Slurm does) and the master (which checks a submitted Slurm block again).

Light to import (the Slurm commands run with the system's python3): `mgpu.resources` is
loaded only when an ask is built.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mgpu.resources import ResourceAsk
    from mgpu.slurmoptions import SlurmOptions

__all__ = ["CPUS_EXCLUSIVE", "MEMORY_EXCLUSIVE", "slurm_ask", "tasks_on_node"]

MEMORY_EXCLUSIVE = "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive."
"""Slurm's fatal() of src/common/slurm_opt.c, `_validate_memory_options`."""
CPUS_EXCLUSIVE = "--cpus-per-gpu is mutually exclusive with --cpus-per-task"
"""Slurm's error of src/common/gres.c, `_test_gres_cnt`."""


def tasks_on_node(nodes: int, ntasks: int | None, per_node: int | None) -> int:
    """The most tasks any node of the job runs, in Slurm's block layout: --ntasks-per-node
    (within -n), else -n over the nodes (the first take one more), else one."""
    if per_node is not None:
        return min(per_node, ntasks) if ntasks is not None else per_node
    if ntasks is not None:
        return -(-ntasks // max(1, nodes))
    return 1


def slurm_ask(slurm: SlurmOptions, nodes: int, own: ResourceAsk | None = None) -> ResourceAsk:
    """What a Slurm job asks of each of its `nodes` nodes besides GPUs; mgpu's own
    `--cpus`/`--mem` (`own`) stand over Slurm's CPU or memory options, each kind alone."""
    import dataclasses

    from mgpu.resources import NO_ASK, ResourceAsk

    cpus_per_node = None
    names_cpus = slurm.cpus_per_task is not None or (
        slurm.mem_per_cpu_mb is not None and slurm.cpus_per_gpu is None
    )
    if names_cpus:
        tasks = tasks_on_node(nodes, slurm.ntasks, slurm.ntasks_per_node)
        cpus_per_node = tasks * (slurm.cpus_per_task or 1)
    ask = ResourceAsk(
        cpus_per_node=cpus_per_node,
        cpus_per_gpu=slurm.cpus_per_gpu,
        mem_per_node_mb=slurm.mem_per_node_mb,
        mem_per_gpu_mb=slurm.mem_per_gpu_mb,
        mem_per_cpu_mb=slurm.mem_per_cpu_mb,
        exclusive=slurm.exclusive,
    )
    own = own or NO_ASK
    if own.exclusive:
        ask = dataclasses.replace(ask, exclusive=True)
    if own.cpus_per_node is not None:
        ask = dataclasses.replace(ask, cpus_per_node=own.cpus_per_node, cpus_per_gpu=None)
    if own.mem_per_node_mb is not None:
        ask = dataclasses.replace(
            ask, mem_per_node_mb=own.mem_per_node_mb, mem_per_gpu_mb=None, mem_per_cpu_mb=None
        )
    return ask
