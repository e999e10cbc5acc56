"""A request's static node filters: up or not aside, which nodes may it ever use?

`--nodelist`, `--exclude`, the nodes its user may use, its GPU type and the features it
needs decide it once per distinct combination; `FreePool.eligible` caches the answer for a
pass by `filter_key`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from .types import JobRequest, NodeView

__all__ = [
    "Eligible",
    "EligibleKey",
    "accepted_nodes",
    "filter_key",
    "statically_eligible",
    "why_not_eligible",
]

EligibleKey = tuple[
    frozenset[str] | None, frozenset[str], frozenset[str] | None, str | None, frozenset[str]
]
NO_FILTERS: EligibleKey = (None, frozenset(), None, None, frozenset())


def why_not_eligible(req: JobRequest, node: NodeView) -> str | None:
    """Why the request's static filters reject this node (ignoring up/down), or None."""
    nid = node.node_id
    if req.nodelist is not None and nid not in req.nodelist:
        return f"{nid} is not in the job's --nodelist"
    if nid in req.exclude:
        return f"{nid} is excluded by the job's --exclude"
    if req.allowed_nodes is not None and nid not in req.allowed_nodes:
        return f"user {req.user} may not use {nid}"
    if req.gpu_type is not None and node.gpu_type != req.gpu_type:
        return f"{nid} has no {req.gpu_type} GPUs"
    if req.requires and not req.requires <= node.features:
        missing = ", ".join(sorted(req.requires - node.features))
        return f"{nid} lacks {missing}"
    return None


def statically_eligible(req: JobRequest, node: NodeView) -> bool:
    return why_not_eligible(req, node) is None


@dataclass(frozen=True, slots=True)
class Eligible:
    """The schedulable nodes a request's static filters accept."""

    nodes: frozenset[str] | None
    """None means every schedulable node (the request has no filters)."""
    max_total: int
    """Most GPUs any accepted node has in total (busy or not)."""

    def __contains__(self, node_id: object) -> bool:
        return self.nodes is None or node_id in self.nodes


def filter_key(req: JobRequest) -> EligibleKey:
    """What the request's filters are made of: requests with one key accept one set."""
    if (
        req.nodelist is None
        and req.allowed_nodes is None
        and req.gpu_type is None
        and not req.exclude
        and not req.requires
    ):
        return NO_FILTERS
    return (req.nodelist, req.exclude, req.allowed_nodes, req.gpu_type, req.requires)


def accepted_nodes(
    req: JobRequest, key: EligibleKey, up: Collection[str], views: Mapping[str, NodeView]
) -> Eligible:
    """The nodes of `up` (schedulable) that `req`'s filters (`key`) accept."""
    if key == NO_FILTERS:
        totals = [len(views[nid].gpu_indices) for nid in up]
        return Eligible(None, max(totals, default=0))
    # Start from the smallest explicit list, then filter.
    base: Iterable[str] = up
    if req.nodelist is not None:
        base = req.nodelist
    if req.allowed_nodes is not None and (
        req.nodelist is None or len(req.allowed_nodes) < len(req.nodelist)
    ):
        base = req.allowed_nodes
    accepted = frozenset(nid for nid in base if nid in up and statically_eligible(req, views[nid]))
    most = max((len(views[nid].gpu_indices) for nid in accepted), default=0)
    return Eligible(accepted, most)
