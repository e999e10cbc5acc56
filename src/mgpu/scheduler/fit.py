"""Could a request *ever* run on these nodes (ignoring what is busy or down), and why is
it waiting now: sentences a person can act on, for refusals at submit and queue reasons."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .askfit import ask_never_fits, ask_wait_reason
from .filters import statically_eligible, why_not_eligible
from .pool import FreePool
from .shape import gpus_per_node
from .shares import format_share
from .types import SHARE_UNITS, JobRequest, NodeView

__all__ = ["could_ever_fit", "describe_gpus", "format_ids", "wait_reason"]


def format_ids(ids: Iterable[int]) -> str:
    """`0,1,3` — GPU indices as a user would type them."""
    return ",".join(str(i) for i in sorted(set(ids)))


def _gpu_list(ids: Iterable[int]) -> str:
    """`GPU 3` or `GPUs 0,1`."""
    ordered = sorted(set(ids))
    return f"GPU {ordered[0]}" if len(ordered) == 1 else f"GPUs {format_ids(ordered)}"


def describe_gpus(node: NodeView) -> str:
    """`it has GPUs 0-3` (a range when contiguous), for error messages."""
    ids = sorted(node.gpu_indices)
    if not ids:
        return "it has no GPUs"
    if len(ids) == 1:
        return f"it has GPU {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"it has GPUs {ids[0]}-{ids[-1]}"
    return f"it has GPUs {format_ids(ids)}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------- static filters


def could_ever_fit(
    request: JobRequest, nodes: Sequence[NodeView] | Mapping[str, NodeView]
) -> str | None:
    """None if `request` could run on `nodes` once they are idle and up, else why not.

    Busy GPUs and down or draining nodes are ignored (they come back); what is checked is
    the cluster's shape: node names, GPU indices, GPU counts, GPU types, features, the
    job's own node filters, and the CPUs and memory it asks of each node (refused with
    Slurm's `Requested node configuration is not available` and the numbers).  The reason
    is one sentence a user can act on.
    """
    views = nodes if isinstance(nodes, Mapping) else {n.node_id: n for n in nodes}
    why = _gpus_never_fit(request, views)
    if why is not None or not request.asks:
        return why
    if request.gpu_share and request.ask.exclusive:
        return "--gpu-share asks for part of one GPU; it cannot be combined with --exclusive"
    if request.node_gpu_ids is not None:
        named = {nid for nid, _ in request.node_gpu_ids}
        eligible = [views[nid] for nid in sorted(named)]
    else:
        eligible = _eligible(request, views)
    return ask_never_fits(request, eligible, len(eligible) < len(views))


def _eligible(req: JobRequest, views: Mapping[str, NodeView]) -> list[NodeView]:
    """The nodes the request's filters accept (all of them, unlooked at, when it has none)."""
    if (
        req.nodelist is None
        and req.allowed_nodes is None
        and req.gpu_type is None
        and not req.exclude
        and not req.requires
    ):
        return list(views.values())
    return [v for v in _named_or_all(req, views) if statically_eligible(req, v)]


def _gpus_never_fit(req: JobRequest, views: Mapping[str, NodeView]) -> str | None:
    """`could_ever_fit` for the job's GPUs and node filters alone."""
    if req.gpus < 0:
        return "a job cannot ask for a negative number of GPUs"
    if req.gpu_share:
        why = _share_never_fits(req)
        if why is not None:
            return why
    for nid in sorted(req.nodelist or ()):
        if nid not in views:
            return f"node {nid} is not in the cluster"
    if req.node_gpu_ids is not None:
        return _pinned_never_fits(req, views)
    eligible = _eligible(req, views)
    if not eligible:
        return _why_none_eligible(req, list(views.values()))
    if req.nodes is not None:
        return _gang_never_fits(req, eligible)
    if req.gpu_ids is not None:
        wanted = set(req.gpu_ids)
        if any(wanted <= set(v.gpu_indices) for v in eligible):
            return None
        if len(eligible) == 1:
            node = eligible[0]
            missing = sorted(wanted - set(node.gpu_indices))
            return f"{node.node_id} has no {_gpu_list(missing)} ({describe_gpus(node)})"
        largest = max(eligible, key=lambda v: (len(v.gpu_indices), v.node_id))
        return (
            f"no node has {_gpu_list(wanted)} "
            f"(the largest, {largest.node_id}, has {_gpu_list(largest.gpu_indices)})"
            if largest.gpu_indices
            else f"no node has {_gpu_list(wanted)} (no node has any GPU)"
        )
    need = req.gpus
    most = max(len(v.gpu_indices) for v in eligible)
    if need <= most:
        return None
    restricted = len(eligible) < len(views)
    if req.distributed:
        total = sum(len(v.gpu_indices) for v in eligible)
        if total >= need:
            return None
        where = "the nodes it may use have" if restricted else "the cluster has"
        return f"the job asks for {_plural(need, 'GPU')} but {where} only {total}"
    where = "no node it may use" if restricted else "no node"
    return (
        f"{where} has {need} GPUs (the largest has {most}); "
        "use --nodes/--gpus-per-node or --distributed to span nodes"
    )


def _share_never_fits(req: JobRequest) -> str | None:
    """What is wrong with a fractional request's shape, if anything."""
    if not 0 < req.gpu_share < SHARE_UNITS:
        return "--gpu-share must be between 0 and 1 (a fraction of one GPU)"
    if (
        req.nodes is not None
        or req.gpu_ids is not None
        or req.node_gpu_ids is not None
        or req.distributed
    ):
        return (
            "--gpu-share asks for part of one GPU; it cannot be combined with --nodes, "
            "--gpu-ids, --node-gpu-ids or --distributed"
        )
    if req.gpus != 1:
        return "--gpu-share asks for part of one GPU; it cannot be combined with --gpus"
    return None


def _named_or_all(req: JobRequest, views: Mapping[str, NodeView]) -> Iterable[NodeView]:
    """The nodes worth filtering: those the job names (`--nodelist`, access list) if any."""
    names: Iterable[str] | None = None
    if req.nodelist is not None:
        names = req.nodelist
    if req.allowed_nodes is not None and (
        req.nodelist is None or len(req.allowed_nodes) < len(req.nodelist)
    ):
        names = req.allowed_nodes
    if names is None:
        return views.values()
    return [views[nid] for nid in names if nid in views]


def _pinned_never_fits(req: JobRequest, views: Mapping[str, NodeView]) -> str | None:
    assert req.node_gpu_ids is not None
    if not req.node_gpu_ids:
        return "--node-gpu-ids names no node"
    for nid, ids in req.node_gpu_ids:
        node = views.get(nid)
        if node is None:
            return f"node {nid} is not in the cluster"
        missing = sorted(set(ids) - set(node.gpu_indices))
        if missing:
            return f"{nid} has no {_gpu_list(missing)} ({describe_gpus(node)})"
        why = why_not_eligible(req, node)
        if why is not None:
            return why
    return None


def _gang_never_fits(req: JobRequest, eligible: list[NodeView]) -> str | None:
    assert req.nodes is not None
    n = req.nodes
    if n <= 0:
        return "--nodes must be at least 1"
    per = gpus_per_node(req)
    if per is None:
        return (
            f"{_plural(req.gpus, 'GPU')} cannot be split evenly over {n} nodes; "
            "give --gpus-per-node"
        )
    if per < 0:
        return "a job cannot ask for a negative number of GPUs per node"
    if len(eligible) < n:
        return f"the job needs {n} nodes but only {len(eligible)} can run it"
    big = sum(1 for v in eligible if len(v.gpu_indices) >= per)
    if big < n:
        have = "has" if big == 1 else "have"
        return f"the job needs {n} nodes with {per} GPUs each but only {big} {have} that many"
    return None


def _why_none_eligible(req: JobRequest, nodes: list[NodeView]) -> str:
    """Which of the request's filters leaves no node (applied in order)."""
    left = nodes
    if req.nodelist is not None:
        left = [v for v in left if v.node_id in req.nodelist]
        if not left:
            return "the job's --nodelist is empty"
    if req.exclude:
        left = [v for v in left if v.node_id not in req.exclude]
        if not left:
            return "the job's --exclude leaves no node" if nodes else "the cluster has no nodes"
    if req.allowed_nodes is not None:
        left = [v for v in left if v.node_id in req.allowed_nodes]
        if not left:
            return f"user {req.user} may not use any of the nodes the job asks for"
    if req.gpu_type is not None:
        typed = [v for v in left if v.gpu_type == req.gpu_type]
        if not typed:
            types = sorted({v.gpu_type for v in nodes if v.gpu_type})
            have = f"the cluster has {', '.join(types)}" if types else "no node reports a GPU type"
            return f"no node the job may use has {req.gpu_type} GPUs ({have})"
        left = typed
    if req.requires:
        missing = ", ".join(sorted(req.requires))
        return f"no node the job may use has {missing}"
    return "the cluster has no nodes"


def wait_reason(req: JobRequest, pool: FreePool) -> tuple[str, bool]:
    """Why `req` is not running, ignoring other queued jobs: (reason, runnable_when_idle).

    `runnable_when_idle` is False when even an idle cluster of the nodes that are up now
    could not run the job (a pinned node is down, every allowed node is draining, ...):
    such a job must not hold up the queue.  The reason depends only on the request and on
    which nodes are up, so callers may cache it per request shape for a pass (for a job
    that asks for CPUs or memory it names the most free on one node as the pool is when
    asked: a pass may keep that too).
    """
    if req.node_gpu_ids is not None:
        down = [nid for nid, _ in req.node_gpu_ids if not pool.is_up(nid)]
        if down:
            return _down_sentence(down), False
        if req.asks:
            return ask_wait_reason(req, pool), True
        parts = [f"{_gpu_list(ids)} on {nid}" for nid, ids in req.node_gpu_ids]
        return "waiting for " + " and ".join(parts), True
    if _never_on_up(req, pool):
        down = sorted(
            view.node_id
            for view in _named_or_all(req, pool.views)
            if not pool.is_up(view.node_id) and statically_eligible(req, view)
        )
        if down:
            return _down_sentence(down), False
        return "no node that is up can run it", False
    if req.asks:
        return ask_wait_reason(req, pool), True
    if req.nodes is not None:
        per = gpus_per_node(req) or 0
        return (
            f"waiting for {_plural(req.nodes, 'node')} with {_plural(per, 'free GPU')} each",
            True,
        )
    if req.gpu_ids is not None:
        eligible = pool.eligible(req)
        where = "one node"
        if eligible.nodes is not None and len(eligible.nodes) == 1:
            (where,) = eligible.nodes
        return f"waiting for {_gpu_list(req.gpu_ids)} on {where}", True
    kind = f"{req.gpu_type} " if req.gpu_type else ""
    if req.gpu_share:
        return f"waiting for {format_share(req.gpu_share)} of one {kind}GPU", True
    if req.gpus == 0:
        return "waiting for a node", True
    return f"waiting for {req.gpus} {kind}GPU{'' if req.gpus == 1 else 's'}", True


def _never_on_up(req: JobRequest, pool: FreePool) -> bool:
    """`could_ever_fit(req, pool.up_views())` refuses it: for an "N GPUs anywhere" request
    (`JobRequest.fit_key`), from the pool's largest node that is up, without a walk over
    every node."""
    if req.fit_key is None:
        return could_ever_fit(req, pool.up_views()) is not None
    if not pool.up_count or not 0 <= req.gpus <= pool.eligible(req).max_total:
        return True
    return req.asks and ask_never_fits(req, pool.up_views().values(), False) is not None


def _down_sentence(down: Sequence[str]) -> str:
    if len(down) == 1:
        return f"{down[0]} is down or draining"
    shown = ", ".join(down[:3])
    more = f" and {len(down) - 3} more" if len(down) > 3 else ""
    return f"{shown}{more} are down or draining"
