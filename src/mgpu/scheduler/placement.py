"""Where one job can run: placement over the free GPUs of one pass (`pool.FreePool`).

The shape follows Nomad's scheduler and the Kubernetes scheduling framework: cheap
*filters* first (`pool.Eligible`: up, in `--nodelist`, not excluded, allowed to the user,
GPU type, features), then a *score* (the placement policy), then a *pick*.  Counts are
checked before anything else (a job asking for more GPUs than are free in the whole pool
fails in O(1)).

Fractional requests (`gpu_share`, see `shares.py`) go to a GPU that is already shared when
one has room (fill_first: the least room that fits, on the busiest node — so shares pack
together), else to a free GPU chosen as a one-GPU job's; spread takes a free GPU first, then
the least-used shared one.

Whether a request could *ever* fit, and why it waits, is `fit.py` (re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence, Set

from .fit import could_ever_fit, describe_gpus, format_ids, wait_reason
from .pool import Eligible, FreePool
from .shape import gpus_per_node, requested_gpus, shape_key
from .types import JobRequest, Placement, Policy

__all__ = [
    "Eligible",
    "FreePool",
    "could_ever_fit",
    "describe_gpus",
    "format_ids",
    "gpus_per_node",
    "place",
    "requested_gpus",
    "shape_key",
    "wait_reason",
]


def _lowest(free: Set[int], n: int) -> tuple[int, ...]:
    return tuple(sorted(free)[:n])


def _candidates(
    pool: FreePool,
    need: int,
    eligible: Eligible,
    policy: Policy,
    accept: Callable[[str], bool] | None = None,
) -> Iterator[str]:
    """Eligible schedulable nodes with at least `need` free GPUs, best first for `policy`."""
    if eligible.nodes is not None and len(eligible.nodes) * 8 < pool.up_count:
        # Few nodes pass the filters: scoring them directly beats walking every bucket.
        scored = []
        for nid in eligible.nodes:
            count = pool.free_count(nid)
            if count >= need and (accept is None or accept(nid)):
                scored.append((count if policy == "fill_first" else -count, nid))
        scored.sort()
        yield from (nid for _, nid in scored)
        return
    members = eligible.nodes
    for nid in pool.iter_nodes(need, policy):
        if (members is None or nid in members) and (accept is None or accept(nid)):
            yield nid


def place(req: JobRequest, pool: FreePool, default_policy: Policy) -> tuple[Placement, ...] | None:
    """Where `req` would run on `pool`'s free GPUs now, or None if it does not fit.

    Does not change `pool`; the caller `take`s the placement if it starts the job.
    """
    policy: Policy = req.policy or default_policy
    if req.node_gpu_ids is not None:
        return _place_pinned(req, pool)
    if req.nodes is not None:
        per = gpus_per_node(req)
        if per is None or req.nodes <= 0:
            return None
        return _place_gang(req, pool, req.nodes, per, policy)
    if req.gpu_ids is not None:
        return _place_indices(req, pool, policy)
    if req.gpu_share:
        return _place_share(req, pool, policy)
    need = req.gpus
    if need > pool.total_free:
        return None
    eligible = pool.eligible(req)
    members = eligible.nodes
    if members is not None and len(members) * 8 < pool.up_count:
        nid = next(_candidates(pool, need, eligible, policy), None)
    else:
        nid = pool.best_node(need, policy, members)
    if nid is not None:
        return (Placement(nid, _lowest(pool.free(nid), need)),)
    if req.distributed and need > eligible.max_total:
        return _place_split(req, pool, need, eligible, policy)
    return None


def _place_share(req: JobRequest, pool: FreePool, policy: Policy) -> tuple[Placement, ...] | None:
    """A share of one GPU: a shared GPU with room, or a free one (see the module docstring)."""
    share = req.gpu_share
    eligible = pool.eligible(req)
    members = eligible.nodes
    if policy == "fill_first" and pool.has_shared:
        spot = pool.best_shared(share, policy, members)
        if spot is not None:
            return (Placement(spot[0], (spot[1],), share),)
    if pool.total_free:
        if members is not None and len(members) * 8 < pool.up_count:
            nid = next(_candidates(pool, 1, eligible, policy), None)
        else:
            nid = pool.best_node(1, policy, members)
        if nid is not None:
            return (Placement(nid, (min(pool.free(nid)),), share),)
    if policy == "spread" and pool.has_shared:
        spot = pool.best_shared(share, policy, members)
        if spot is not None:
            return (Placement(spot[0], (spot[1],), share),)
    return None


def _place_pinned(req: JobRequest, pool: FreePool) -> tuple[Placement, ...] | None:
    """Exactly the GPUs named, on exactly the nodes named — or nothing."""
    assert req.node_gpu_ids is not None
    wanted: dict[str, set[int]] = {}
    for nid, ids in req.node_gpu_ids:
        wanted.setdefault(nid, set()).update(ids)
    eligible = pool.eligible(req)
    for nid, gpus in wanted.items():
        if nid not in eligible or not pool.is_up(nid) or not gpus <= pool.free(nid):
            return None
    return tuple(Placement(nid, tuple(sorted(gpus))) for nid, gpus in wanted.items())


def _place_indices(req: JobRequest, pool: FreePool, policy: Policy) -> tuple[Placement, ...] | None:
    """These GPU indices, all on one node chosen by policy."""
    assert req.gpu_ids is not None
    ids = frozenset(req.gpu_ids)
    if len(ids) > pool.total_free:
        return None

    def has_all(nid: str) -> bool:
        return ids <= pool.free(nid)

    for nid in _candidates(pool, len(ids), pool.eligible(req), policy, has_all):
        return (Placement(nid, tuple(sorted(ids))),)
    return None


def _place_gang(
    req: JobRequest, pool: FreePool, n_nodes: int, per_node: int, policy: Policy
) -> tuple[Placement, ...] | None:
    """N distinct nodes with M free GPUs each, all or nothing, in as few racks as possible.

    Candidates are walked best first for the policy and grouped by rack as they come; the
    first rack to collect N of them wins, so the walk usually stops early (Nomad's
    "visit only as many nodes as a good choice needs").  When no rack can hold the job,
    racks are filled biggest first, so it spans the fewest racks.  Nodes without a rack
    count as one rack.
    """
    if n_nodes * per_node > pool.total_free or pool.nodes_with_at_least(per_node) < n_nodes:
        return None
    views = pool.views
    racks: dict[str | None, list[str]] = {}
    chosen: list[str] | None = None
    for nid in _candidates(pool, per_node, pool.eligible(req), policy):
        in_rack = racks.setdefault(views[nid].rack, [])
        in_rack.append(nid)
        if len(in_rack) == n_nodes:
            chosen = in_rack
            break
    if chosen is None:
        if sum(len(nodes) for nodes in racks.values()) < n_nodes:
            return None
        chosen = []
        for nodes in sorted(racks.values(), key=len, reverse=True):
            chosen.extend(nodes[: n_nodes - len(chosen)])
            if len(chosen) == n_nodes:
                break
    # Ranked in name order, as Slurm ranks an allocation's nodes: the first node of the
    # job's nodelist (`scontrol show hostnames | head -n1`) is the one of rank 0.
    return tuple(
        Placement(nid, _lowest(pool.free(nid), per_node)) for nid in sorted(chosen, key=name_order)
    )


def name_order(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key for node names: their numbers as numbers (`n2` before `n10`)."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part
    )


def _group_by_rack(pool: FreePool, nodes: Sequence[str]) -> dict[str | None, list[str]]:
    """Nodes by rack, keeping their order; nodes without a rack form one group."""
    racks: dict[str | None, list[str]] = {}
    for nid in nodes:
        racks.setdefault(pool.views[nid].rack, []).append(nid)
    return racks


def _place_split(
    req: JobRequest, pool: FreePool, need: int, eligible: Eligible, policy: Policy
) -> tuple[Placement, ...] | None:
    """`--distributed` with more GPUs than any node has: per-node shares, fewest nodes.

    Taking the nodes with the most free GPUs first needs the fewest nodes; among ways to
    do it with that many nodes, one rack is preferred.
    """
    nodes = list(_candidates(pool, 1, eligible, "spread"))
    counts = [pool.free_count(nid) for nid in nodes]
    if sum(counts) < need:
        return None

    def greedy(order: Sequence[str]) -> list[str] | None:
        picked: list[str] = []
        got = 0
        for nid in order:
            if got >= need:
                break
            picked.append(nid)
            got += pool.free_count(nid)
        return picked if got >= need else None

    best = greedy(nodes)
    assert best is not None
    for rack_nodes in _group_by_rack(pool, nodes).values():
        in_rack = greedy(rack_nodes)
        if in_rack is not None and len(in_rack) <= len(best):
            best = in_rack
            break
    placements = []
    left = need
    for nid in best:
        share = min(left, pool.free_count(nid))
        placements.append(Placement(nid, _lowest(pool.free(nid), share)))
        left -= share
    return tuple(placements)


# --------------------------------------------------------------------------- never / not now
