"""`GET /api/partitions`: the cluster config's partitions, for `sinfo` and the dashboard.

A partition is a named group of nodes Slurm jobs ask for (`sbatch --partition`); a
config that names none has one, DEFAULT_PARTITION, of every node.  Each is listed with
its nodes (node ids, in order), whether it is the default and its time limit, as Slurm
writes it (`2-00:00:00`, `UNLIMITED`) and in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter

from mgpu import spec as specs
from mgpu.config import ClusterConfig
from mgpu.master.http.deps import Ctl

__all__ = ["partitions_public", "router"]

router = APIRouter()


def partitions_public(
    config: ClusterConfig, node_ids: Sequence[str], kube_nodes: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The partitions as JSON; one without a node list has `node_ids` (every node), less
    the Nodes of Kubernetes partitions (`kube_nodes`: node → partition), which are theirs."""
    default = config.default_partition().name
    kube_nodes = kube_nodes or {}
    own = [n for n in node_ids if n not in kube_nodes]
    out = []
    for part in config.all_partitions():
        nodes = part.nodes or own
        if part.kubernetes is not None:
            nodes = [n for n in node_ids if kube_nodes.get(n) == part.name]
        limit = None if part.max_time is None else specs.parse_time_limit(part.max_time)
        seconds = None if limit is None or math.isinf(limit) else int(limit)
        out.append(
            {
                "name": part.name,
                "default": part.name == default,
                "nodes": list(nodes),
                "max_time": specs.format_time_limit(seconds),
                "max_time_seconds": seconds,
            }
        )
    return out


@router.get("/api/partitions")
async def partitions(cl: Ctl) -> dict[str, Any]:
    return {"partitions": partitions_public(cl.config, cl.node_ids(), cl.state.kube_nodes)}
