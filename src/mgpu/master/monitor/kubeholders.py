"""Who holds a Kubernetes Node's GPUs, as /metrics and the dashboard show it: mgpu's jobs
(the ledger: the node's `busy` GPUs, each job with its Pod there) and other workloads'
Pods (what the driver counted as taken: mgpu.master.kube.capacity).  Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job

__all__ = ["gpu_holders"]


def gpu_holders(node: NodeRecord, jobs: Mapping[str, Job]) -> list[dict[str, Any]]:
    """`[{"kind": "job"|"pod", "job", "pod", "gpus", "phase"}]` of a Kubernetes Node: each of
    mgpu's jobs holding its GPUs (with its Pod on this Node, when it has one yet), then each
    other Pod that requests some; empty for a node of mgpu's own agent."""
    if node.partition is None:
        return []
    out: list[dict[str, Any]] = []
    for job_id, gpus in sorted(Counter(node.busy.values()).items()):
        job = jobs.get(job_id)
        pod = next((p for p in job.pods if p.get("node") == node.node_id), None) if job else None
        out.append(
            {
                "kind": "job",
                "job": job_id,
                "user": job.user if job else None,
                "pod": str(pod["name"]) if pod else None,
                "gpus": gpus,
                "phase": str(pod.get("phase") or "") if pod else None,
            }
        )
    for pod in node.others:
        if pod.get("gpus"):
            out.append(
                {
                    "kind": "pod",
                    "job": None,
                    "user": None,
                    "pod": str(pod["name"]),
                    "gpus": int(pod["gpus"]),
                    "phase": str(pod.get("phase") or ""),
                }
            )
    return out
