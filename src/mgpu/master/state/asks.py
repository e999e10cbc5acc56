"""What a job asks of each node once the cluster's defaults are applied.

A job keeps its CPU and memory ask as given (`Job.ask`); the scheduler sees it with the
defaults per GPU of its partition, else of the cluster (`resources:`), filled in where the
job asked nothing of that kind, as Slurm's DefCpuPerGPU and DefMemPerGPU: a job of 2 GPUs
without `--cpus` under `def_cpus_per_gpu: 8` holds 16 CPUs.  With no defaults configured a
job that asks nothing holds nothing, and shares its node's CPUs and memory.  A job asking
more memory per CPU than `max_mem_per_cpu` gets more CPUs, as Slurm's MaxMemPerCPU gives
them (`resources.within_mem_per_cpu`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mgpu.config import ClusterConfig, JobResourceDefaults
from mgpu.model import Job
from mgpu.resources import ResourceAsk, within_mem_per_cpu

__all__ = ["AskRules", "defaults_apply"]

_FIELDS = ("def_cpus_per_gpu", "def_mem_per_gpu", "max_mem_per_cpu")


def defaults_apply(ask: ResourceAsk, d: JobResourceDefaults) -> ResourceAsk:
    """`ask` with `d`'s per-GPU defaults where it asks nothing of that kind."""
    asks_cpus = ask.exclusive or ask.cpus_per_node is not None or ask.cpus_per_gpu is not None
    if not asks_cpus and d.def_cpus_per_gpu:
        ask = dataclasses.replace(ask, cpus_per_gpu=d.def_cpus_per_gpu)
    forms = (ask.mem_per_node_mb, ask.mem_per_gpu_mb, ask.mem_per_cpu_mb)
    if not ask.exclusive and all(f is None for f in forms) and d.def_mem_per_gpu:
        ask = dataclasses.replace(ask, mem_per_gpu_mb=d.def_mem_per_gpu)
    return ask


@dataclass(frozen=True, slots=True)
class AskRules:
    cluster: JobResourceDefaults
    partitions: dict[str, JobResourceDefaults]
    """Each partition's settings, its unset ones taken from the cluster's."""

    @classmethod
    def from_config(cls, config: ClusterConfig) -> AskRules:
        base = config.resources
        parts: dict[str, JobResourceDefaults] = {}
        for p in config.partitions:
            values = {
                f: getattr(p, f) if getattr(p, f) is not None else getattr(base, f) for f in _FIELDS
            }
            parts[p.name] = JobResourceDefaults(**values)
        return cls(JobResourceDefaults(**{f: getattr(base, f) for f in _FIELDS}), parts)

    def rules_for(self, job: Job) -> JobResourceDefaults:
        """The job's partition's (a Slurm job's), else the cluster's."""
        name = job.slurm.partition if job.slurm is not None else None
        return self.partitions.get(name, self.cluster) if name else self.cluster

    def effective(self, job: Job) -> ResourceAsk:
        rules = self.rules_for(job)
        ask = defaults_apply(job.ask, rules)
        if rules.max_mem_per_cpu and not ask.empty:
            gpus = job.gpus_per_node if job.gpus_per_node is not None else job.gpus
            ask = within_mem_per_cpu(ask, rules.max_mem_per_cpu, gpus)
        return ask
