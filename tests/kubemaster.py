"""An mgpu master whose partition is the test Kubernetes cluster (tests/kubecluster.py):
started, and waited for until both of its Nodes are mgpu nodes online; and the Pods of a
job as the API server lists them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers import LocalCluster
from kubecluster import KubeCluster, wait_for

__all__ = ["host_volumes", "job_pods", "kube_master"]


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


def host_volumes(extra: list[Path]) -> tuple[str, str]:
    """A Pod template's `volumes` and `volumeMounts` (YAML flow lists' items) that give a
    Pod, read-only at the same paths, what it needs to run this Python: the venv, its base
    interpreter, the C libraries (the loader's /lib64, /lib of a merged /usr), and `extra`."""
    paths = [sys.prefix, sys.base_prefix, "/lib/x86_64-linux-gnu", "/lib64"]
    paths += ["/usr/lib/x86_64-linux-gnu", *map(str, extra)]
    unique = list(dict.fromkeys(p for p in paths if os.path.exists(p)))
    mounts = [(f"h{i}", os.path.realpath(p), p) for i, p in enumerate(unique)]
    volumes = ", ".join(f"{{name: {n}, hostPath: {{path: {h}}}}}" for n, h, _ in mounts)
    volume_mounts = ", ".join(
        f"{{name: {n}, mountPath: {p}, readOnly: true}}" for n, _, p in mounts
    )
    return volumes, volume_mounts
