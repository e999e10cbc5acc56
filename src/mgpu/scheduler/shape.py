"""A request's shape: how many GPUs it needs, per node and in all, and the key of
everything that decides whether it fits (not who asks, when, or which fitting place the
policy picks)."""

from __future__ import annotations

from .types import JobRequest

__all__ = ["gpus_per_node", "requested_gpus", "shape_key"]


def gpus_per_node(req: JobRequest) -> int | None:
    """GPUs on each node of a gang (`--nodes`) job; None if they cannot be split evenly."""
    if req.gpus_per_node is not None:
        return req.gpus_per_node
    nodes = req.nodes or 1
    if nodes <= 0 or req.gpus % nodes:
        return None
    return req.gpus // nodes


def requested_gpus(req: JobRequest) -> int:
    """Total whole GPUs the request occupies, whatever form it was given in.

    A fractional request (`gpu_share`) occupies no whole GPU: 0 (it may fit on a shared GPU
    when none is free, so no count of free GPUs can rule it out).
    """
    if req.gpu_share:
        return 0
    if req.node_gpu_ids is not None:
        return sum(len(set(ids)) for _, ids in req.node_gpu_ids)
    if req.nodes is not None:
        per = gpus_per_node(req)
        return req.nodes * per if per is not None else req.gpus
    if req.gpu_ids is not None:
        return len(set(req.gpu_ids))
    return req.gpus


def shape_key(req: JobRequest) -> tuple[object, ...]:
    """Everything about a request that decides whether it fits (not who, when or which of
    the places it fits the policy picks)."""
    return (
        req.gpus,
        req.gpu_ids,
        req.node_gpu_ids,
        req.nodes,
        req.gpus_per_node,
        req.distributed,
        req.nodelist,
        req.exclude,
        req.allowed_nodes,
        req.gpu_type,
        req.requires,
        req.gpu_share,
        req.reservation,
        req.ask,
    )
