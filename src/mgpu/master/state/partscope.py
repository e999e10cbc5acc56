"""Which nodes a job may use when some are a Kubernetes-backed partition's Nodes.

A partition lists its nodes in the config, and a Slurm job carries the list it was
submitted with; a Kubernetes partition's nodes are the Nodes its selector picks now, so
they are applied here, to each request as the scheduling loop builds it: a job of such a
partition may use its Nodes only, every other job none of them.  A job names its
partition the Slurm way (`-p`); a job that names none is the default partition's.  With no
Kubernetes partition nothing changes (the loop does not call `scoped`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from mgpu.config import ClusterConfig
from mgpu.model import ALLOCATION, Job
from mgpu.scheduler import JobRequest

__all__ = [
    "PartitionScope",
    "job_partition",
    "kube_refused",
    "partition_scope",
    "scoped",
]


@dataclass(frozen=True)
class PartitionScope:
    kube: frozenset[str]
    """The partitions backed by Kubernetes."""
    default: str
    """The partition of jobs that name none."""


def partition_scope(config: ClusterConfig) -> PartitionScope | None:
    """The config's Kubernetes partitions; None when it has none."""
    kube = frozenset(p.name for p in config.kube_partitions())
    return PartitionScope(kube, config.default_partition().name) if kube else None


def job_partition(job: Job, default: str) -> str:
    """The partition a job runs in: its Slurm partition, else the default one."""
    if job.slurm is not None and job.slurm.partition:
        return job.slurm.partition
    return default


def scoped(
    req: JobRequest, job: Job, kube_nodes: Mapping[str, str], scope: PartitionScope
) -> JobRequest:
    """`req` kept to the nodes of its partition (see the module's text)."""
    part = job_partition(job, scope.default)
    if part in scope.kube:
        mine = frozenset(n for n, p in kube_nodes.items() if p == part)
        allowed = mine if req.allowed_nodes is None else req.allowed_nodes & mine
        return replace(req, allowed_nodes=allowed)
    if not kube_nodes:
        return req
    return replace(req, exclude=req.exclude | frozenset(kube_nodes))


def kube_refused(job: Job, config: ClusterConfig) -> str | None:
    """Why an allocation (salloc, `mgpu alloc`), or a job on a terminal (`srun --pty`),
    cannot be made in `job`'s partition, when that is a Kubernetes one (None: it can).  An
    allocation's slots are held by nothing that runs, and its steps run on the nodes'
    agents: a Kubernetes Node has neither, and GPUs that no Pod holds are another
    workload's to take.  A Pod's command runs without a terminal (a step in it has one)."""
    scope = partition_scope(config)
    if scope is None or (job.kind != ALLOCATION and not job.pty):
        return None
    part = job_partition(job, scope.default)
    if part not in scope.kube:
        return None
    if job.kind != ALLOCATION:  # a job on a terminal: a Pod's command has none
        return (
            f"partition {part} runs jobs as Kubernetes Pods, which have no terminal: run "
            "the job there without --pty, then `srun --jobid=ID --pty ...` into it (a "
            "step on a terminal in its Pod), or use another partition"
        )
    return (
        f"partition {part} runs jobs as Kubernetes Pods and holds no allocation (salloc, "
        "mgpu alloc): submit the work as a job there (sbatch, srun or mgpu submit), or "
        "allocate in another partition"
    )
