"""The site's maximum memory per CPU (`max_mem_per_cpu`), judged at submit in Slurm's words.

Whether any node could ever hold a job's GPUs, CPUs and memory together is the scheduler
core's `could_ever_fit` (the same sentence, `NOT_AVAILABLE`, with the numbers)."""

from __future__ import annotations

from mgpu.config import JobResourceDefaults
from mgpu.gpuuse import memory_text
from mgpu.scheduler.types import JobRequest

__all__ = ["NOT_AVAILABLE", "over_max_mem_per_cpu"]

NOT_AVAILABLE = "Requested node configuration is not available"


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
