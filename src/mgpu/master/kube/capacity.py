"""What a Kubernetes Node offers mgpu's scheduler, and what others hold of it.  Pure.

A Node's allocatable GPUs (the partition's `gpu_resource`), CPUs and memory become the
node's GPUs, CPUs and memory as an agent's hello would give them.  Every Pod on the Node
that is not one of mgpu's running jobs as its ledger holds them (another workload's Pod,
one of mgpu's Pods still terminating after its job ended, or one the kube-scheduler put
elsewhere than mgpu's pick) holds what it requests: those GPUs, CPUs and MiB are marked
taken (`Others`), so mgpu never starts a job Kubernetes has no room for."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from mgpu.kube import NodeView, PodView
from mgpu.kube.objects import Taint
from mgpu.protocol import CpuDesc, GpuDesc

__all__ = [
    "OTHERS",
    "Offer",
    "Others",
    "holds_resources",
    "offer",
    "others_on",
    "tolerated",
]

OTHERS = "kubernetes:others"
"""The ledger's name for what other Pods hold of a Node's CPUs and memory."""
MIB = Decimal(2**20)


@dataclass(frozen=True)
class Offer:
    gpus: list[GpuDesc]
    cpus: list[CpuDesc]
    mem_mb: int


def offer(node: NodeView, gpu_resource: str) -> Offer:
    """What the Node offers: its allocatable resources, as an agent's hello says them."""
    alloc = node.allocatable
    gpus = int(alloc.get(gpu_resource, Decimal(0)))
    cpus = int(alloc.get("cpu", Decimal(0)))
    mem_mb = int(alloc.get("memory", Decimal(0)) / MIB)
    return Offer(
        gpus=[GpuDesc(index=i, name=gpu_resource, memory_mb=0) for i in range(max(0, gpus))],
        cpus=[CpuDesc(id=i, core=i) for i in range(max(0, cpus))],
        mem_mb=max(0, mem_mb),
    )


def holds_resources(pod: PodView) -> bool:
    """Whether Kubernetes counts the Pod's requests on its Node: not ended, or ended but
    still being deleted (its containers may not have stopped)."""
    return pod.phase not in ("Succeeded", "Failed") or pod.deleting


@dataclass
class Others:
    """What Pods outside mgpu's ledger hold on one Node."""

    gpus: int = 0
    cpus: int = 0
    mem_mb: int = 0
    pods: list[dict[str, Any]] = field(default_factory=list)


def others_on(pods: Iterable[PodView], gpu_resource: str, in_ledger: Any) -> Others:
    """Sum the requests of the Node's Pods that hold resources and are not in the ledger
    (`in_ledger(pod)` says)."""
    out = Others()
    cpus, mem = Decimal(0), Decimal(0)
    for pod in pods:
        if not holds_resources(pod) or in_ledger(pod):
            continue
        gpus = int(pod.requests.get(gpu_resource, Decimal(0)))
        out.gpus += gpus
        cpus += pod.requests.get("cpu", Decimal(0))
        mem += pod.requests.get("memory", Decimal(0))
        out.pods.append(
            {
                "name": f"{pod.namespace}/{pod.name}",
                "gpus": gpus,
                "phase": "Terminating" if pod.deleting else pod.phase,
            }
        )
    out.cpus, out.mem_mb = math.ceil(cpus), math.ceil(mem / MIB)
    out.pods.sort(key=lambda p: str(p["name"]))
    return out


def blocked_gpus(indices: Iterable[int], busy: Mapping[int, str], count: int) -> frozenset[int]:
    """`count` GPUs marked taken by others: free ones, the highest first (when others hold
    more than is free, every free one)."""
    free = sorted((i for i in indices if i not in busy), reverse=True)
    return frozenset(free[:count])


def blocked_cpus(ids: Iterable[int], held: Mapping[int, str], count: int) -> list[int]:
    """`count` CPU ids marked taken by others, among those no job holds, highest first."""
    free = sorted((i for i in ids if held.get(i, OTHERS) == OTHERS), reverse=True)
    return free[:count]


def tolerated(taints: Iterable[Taint], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the template's tolerations let a Pod be scheduled on a Node with `taints`
    (PreferNoSchedule never forbids)."""
    tols = list(tolerations)
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(_tolerates(t, taint) for t in tols):
            return False
    return True


def _tolerates(tol: Mapping[str, Any], taint: Taint) -> bool:
    if tol.get("effect") and tol.get("effect") != taint.effect:
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol.get("key") == taint.key
    return tol.get("key") == taint.key and str(tol.get("value") or "") == taint.value
