"""An mgpu master whose partition is the test Kubernetes cluster (tests/kubecluster.py):
started, and waited for until both of its Nodes are mgpu nodes online; and the Pods of a
job as the API server lists them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers import LocalCluster
from kubecluster import KubeCluster, wait_for

__all__ = ["job_pods", "kube_master"]


@contextmanager
def kube_master(root: Path, config: str) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root, config)
    try:
        cluster.start_master()
        wait_for(
            "both Nodes as mgpu nodes",
            lambda: (
                len([n for n in cluster.client().nodes() if n.get("kubernetes")]) == 2
                and all(n["state"] == "online" for n in cluster.client().nodes())
            ),
            120,
        )
        yield cluster
    finally:
        cluster.stop()


def job_pods(kube: KubeCluster, selector: str) -> list[dict[str, Any]]:
    """The Pods in the jobs' namespace that `selector` (a label selector) picks."""
    items = kube.get("/api/v1/namespaces/default/pods", labelSelector=selector)["items"]
    return list(items)
