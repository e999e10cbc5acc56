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

A job that asks for CPUs or memory (`JobRequest.asks`) fits a node only where they are free
too: each kind of placement below takes only nodes with that room (`FreePool.room_for`), and
its placements carry the counts the job holds there.  `--exclusive` takes idle nodes whole
(all their GPUs, CPUs and memory).  A job that asks nothing takes the paths it always took.

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
            if count < need or (not count and pool.held_whole(nid)):
                continue
            if accept is None or accept(nid):
                scored.append((count if policy == "fill_first" else -count, nid))
        scored.sort()
        yield from (nid for _, nid in scored)
        return
    members = eligible.nodes
    for nid in pool.iter_nodes(need, policy):
        if (members is None or nid in members) and (accept is None or accept(nid)):
            yield nid


def _held(
    pool: FreePool, req: JobRequest, nid: str, gpu_ids: tuple[int, ...], share: int = 0
) -> Placement | None:
    """`gpu_ids` of `nid` with the CPUs and memory the job asks there, if they are free
    (`--exclusive`: every GPU the node has, if it is idle)."""
    whole = req.ask.exclusive
    if whole:
        gpu_ids = tuple(sorted(pool.usable(nid)))
    room = pool.room_for(nid, len(gpu_ids), req.ask)
    if room is None:
        return None
    return Placement(nid, gpu_ids, share, room[0], room[1], whole)


def _room_check(pool: FreePool, req: JobRequest, gpus: int) -> Callable[[str], bool]:
    """Whether a node has the job's CPUs and memory for `gpus` GPUs there (or is idle)."""
    ask = req.ask
    if ask.exclusive:
        return pool.idle
    if not ask.whole_memory:  # the same counts on every node: two lookups a node
        cpus = ask.cpus_on(gpus, 0)
        return pool.has_free(cpus, ask.mem_on(gpus, cpus, 0))

    def has_room(nid: str) -> bool:
        return pool.room_for(nid, gpus, ask) is not None

    return has_room


def _hopeless(pool: FreePool, req: JobRequest, gpus: int) -> bool:
    """No node can have the CPUs and memory the job asks with `gpus` GPUs (O(1))."""
    ask = req.ask
    if ask.exclusive:
        return False
    cpus = ask.cpus_on(gpus, 0)
    mem = 1 if ask.whole_memory else ask.mem_on(gpus, cpus, 0)
    return not pool.could_hold(cpus, mem)


def place(req: JobRequest, pool: FreePool, default_policy: Policy) -> tuple[Placement, ...] | None:
    """Where `req` would run on `pool`'s free GPUs now, or None if it does not fit.

    Does not change `pool`; the caller `take`s the placement if it starts the job.
    """
    policy: Policy = req.policy or default_policy
    if req.asks:
        return _place_asking(req, pool, policy)
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


def _place_asking(req: JobRequest, pool: FreePool, policy: Policy) -> tuple[Placement, ...] | None:
    """`place` for a job that asks for CPUs, memory or whole nodes."""
    if req.node_gpu_ids is not None:
        return _place_pinned(req, pool)
    if req.nodes is not None:
        per = gpus_per_node(req)
        if per is None or req.nodes <= 0 or _hopeless(pool, req, per):
            return None
        return _place_gang(req, pool, req.nodes, per, policy)
    if req.gpu_ids is not None:
        return _place_indices(req, pool, policy)
    if req.gpu_share:
        return None if req.ask.exclusive else _place_share(req, pool, policy)
    need = req.gpus
    if need > pool.total_free:
        return None
    eligible = pool.eligible(req)
    if req.distributed and need > eligible.max_total:
        return _place_split(req, pool, need, eligible, policy)
    ask = req.ask
    if not (ask.exclusive or ask.whole_memory):  # the same counts on every node
        cpus = ask.cpus_on(need, 0)
        mem = ask.mem_on(need, cpus, 0)
        if not pool.could_hold(cpus, mem):
            return None
        for nid in _candidates(pool, need, eligible, policy, pool.has_free(cpus, mem)):
            return (Placement(nid, _lowest(pool.free(nid), need), 0, cpus, mem),)
        return None
    for nid in _candidates(pool, need, eligible, policy, _room_check(pool, req, need)):
        return (_held_now(pool, req, nid, need),)
    return None


def _held_now(pool: FreePool, req: JobRequest, nid: str, gpus: int) -> Placement:
    """The lowest `gpus` free GPUs of a node that has the job's room (checked)."""
    held = _held(pool, req, nid, _lowest(pool.free(nid), gpus))
    assert held is not None
    return held


def _place_share(req: JobRequest, pool: FreePool, policy: Policy) -> tuple[Placement, ...] | None:
    """A share of one GPU: a shared GPU with room, or a free one (see the module docstring)."""
    share = req.gpu_share
    eligible = pool.eligible(req)
    members = eligible.nodes
    accept = _room_check(pool, req, 1) if req.asks else None
    if policy == "fill_first" and pool.has_shared:
        spot = pool.best_shared(share, policy, members, accept)
        if spot is not None:
            return (_share_on(pool, req, spot[0], spot[1]),)
    if pool.total_free:
        if accept is not None or (members is not None and len(members) * 8 < pool.up_count):
            nid = next(_candidates(pool, 1, eligible, policy, accept), None)
        else:
            nid = pool.best_node(1, policy, members)
        if nid is not None:
            return (_share_on(pool, req, nid, min(pool.free(nid))),)
    if policy == "spread" and pool.has_shared:
        spot = pool.best_shared(share, policy, members, accept)
        if spot is not None:
            return (_share_on(pool, req, spot[0], spot[1]),)
    return None


def _share_on(pool: FreePool, req: JobRequest, nid: str, gpu: int) -> Placement:
    if not req.asks:
        return Placement(nid, (gpu,), req.gpu_share)
    held = _held(pool, req, nid, (gpu,), req.gpu_share)
    assert held is not None  # the node was accepted for its room
    return held


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
        if pool.held_whole(nid):
            return None
    if not req.asks:
        return tuple(Placement(nid, tuple(sorted(gpus))) for nid, gpus in wanted.items())
    held = [_held(pool, req, nid, tuple(sorted(gpus))) for nid, gpus in wanted.items()]
    return None if None in held else tuple(p for p in held if p is not None)


def _place_indices(req: JobRequest, pool: FreePool, policy: Policy) -> tuple[Placement, ...] | None:
    """These GPU indices, all on one node chosen by policy."""
    assert req.gpu_ids is not None
    ids = frozenset(req.gpu_ids)
    if len(ids) > pool.total_free:
        return None

    room = _room_check(pool, req, len(ids)) if req.asks else None

    def has_all(nid: str) -> bool:
        return ids <= pool.free(nid) and (room is None or room(nid))

    for nid in _candidates(pool, len(ids), pool.eligible(req), policy, has_all):
        if room is None:
            return (Placement(nid, tuple(sorted(ids))),)
        held = _held(pool, req, nid, tuple(sorted(ids)))
        return None if held is None else (held,)
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
    accept = _room_check(pool, req, per_node) if req.asks else None
    for nid in _candidates(pool, per_node, pool.eligible(req), policy, accept):
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
    chosen = sorted(chosen, key=name_order)
    if accept is not None:
        return tuple(_held_now(pool, req, nid, per_node) for nid in chosen)
    return tuple(Placement(nid, _lowest(pool.free(nid), per_node)) for nid in chosen)


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
    usable = {nid: pool.free_count(nid) for nid in nodes}
    if req.asks:  # on each node, only as many GPUs as its CPUs and memory allow
        usable = {nid: _most_gpus(pool, req, nid) for nid in nodes}
        nodes = sorted((n for n in nodes if usable[n]), key=lambda n: (-usable[n], n))
    if sum(usable.values()) < need:
        return None

    def greedy(order: Sequence[str]) -> list[str] | None:
        picked: list[str] = []
        got = 0
        for nid in order:
            if got >= need:
                break
            picked.append(nid)
            got += usable[nid]
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
        share = min(left, usable[nid])
        if req.asks:
            placements.append(_held_now(pool, req, nid, share))
        else:
            placements.append(Placement(nid, _lowest(pool.free(nid), share)))
        left -= share
    return tuple(placements)


def _most_gpus(pool: FreePool, req: JobRequest, nid: str) -> int:
    """The most free GPUs of `nid` a split job may take there, given its CPUs and memory
    (an idle node's every GPU for `--exclusive`)."""
    if req.ask.exclusive:
        return len(pool.usable(nid)) if pool.idle(nid) else 0
    for gpus in range(pool.free_count(nid), 0, -1):
        if pool.room_for(nid, gpus, req.ask) is not None:
            return gpus
    return 0


# --------------------------------------------------------------------------- never / not now
