"""Where one job can run: feasibility and placement over the free GPUs of one pass.

The shape follows Nomad's scheduler and the Kubernetes scheduling framework: cheap
*filters* first (is the node up, in `--nodelist`, not excluded, allowed to the user, of the
right GPU type, with the features the job needs), then a *score* (the placement policy),
then a *pick*.  Three things keep it fast on big clusters:

* `FreePool` indexes schedulable nodes by how many GPUs they have free, so "the busiest
  node with at least 4 free" is a walk up the buckets from 4 that usually stops at the
  first node, rather than a scan of every node;
* a job's static filters are evaluated once per distinct combination (`Eligible`) and
  cached for the pass; when they leave only a few nodes those are scanned directly;
* counts are checked before anything else (a job asking for more GPUs than are free in
  the whole pool fails in O(1)).

Fractional requests (`gpu_share`, see `shares.py`) go to a GPU that is already shared when
one has room (fill_first: the least room that fits, on the busiest node — so shares pack
together), else to a free GPU chosen as a one-GPU job's; spread takes a free GPU first, then
the least-used shared one.  The pool keeps shared GPUs apart from the free ones, indexed by
their room; with no shared GPU none of this costs a whole-GPU request anything.

`could_ever_fit` answers a different question — could this request *ever* run on these
nodes, ignoring what is busy or down — so that the master can refuse impossible jobs at
submit time with a sentence a person can act on.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass

from .shares import format_share
from .types import SHARE_UNITS, JobRequest, NodeView, Placement, Policy

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

_EligibleKey = tuple[
    frozenset[str] | None, frozenset[str], frozenset[str] | None, str | None, frozenset[str]
]
_NO_FILTERS: _EligibleKey = (None, frozenset(), None, None, frozenset())


# --------------------------------------------------------------------------- request shape


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
    )


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


def _why_not_eligible(req: JobRequest, node: NodeView) -> str | None:
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


def _statically_eligible(req: JobRequest, node: NodeView) -> bool:
    return _why_not_eligible(req, node) is None


@dataclass(frozen=True, slots=True)
class Eligible:
    """The schedulable nodes a request's static filters accept."""

    nodes: frozenset[str] | None
    """None means every schedulable node (the request has no filters)."""
    max_total: int
    """Most GPUs any accepted node has in total (busy or not)."""

    def __contains__(self, node_id: object) -> bool:
        return self.nodes is None or node_id in self.nodes


# --------------------------------------------------------------------------- the free pool


class FreePool:
    """Free GPUs of every schedulable node, bucketed by free count; updated as jobs start.

    `buckets[k]` holds the ids (sorted) of the nodes with exactly `k` free GPUs.  Copies
    (`copy`) share the immutable node views and the eligibility cache, so a simulation
    (backfill reservations, preemption) costs one copy of the free sets.

    Shared GPUs (holding fractional jobs) are not free: `_shared[node][gpu]` is the share
    units in use, and `_rooms[room]` holds the (node, gpu) pairs with that much room left.
    """

    __slots__ = (
        "_all",
        "_buckets",
        "_eligible",
        "_free",
        "_rooms",
        "_shared",
        "_up",
        "max_gpus",
        "total_free",
        "up_count",
        "views",
    )

    views: dict[str, NodeView]
    _all: dict[str, frozenset[int]]
    _up: dict[str, NodeView] | None
    _free: dict[str, set[int]]
    _buckets: list[list[str]]
    _eligible: dict[_EligibleKey, Eligible]
    _shared: dict[str, dict[int, int]]
    _rooms: dict[int, dict[tuple[str, int], None]]
    total_free: int
    max_gpus: int
    up_count: int

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        # Built at every pass from every node: local names and C-level tests on purpose.
        views: dict[str, NodeView] = {}
        free_of: dict[str, set[int]] = {}
        all_of: dict[str, frozenset[int]] = {}
        self.views, self._free, self._all = views, free_of, all_of
        self._up = None
        self._shared = {}
        self._rooms = {}
        max_gpus = 0
        sets: dict[tuple[int, ...], frozenset[int]] = {}  # most nodes have the same GPUs
        for node in nodes:
            nid = node.node_id
            views[nid] = node
            indices = node.gpu_indices
            if len(indices) > max_gpus:
                max_gpus = len(indices)
            if node.schedulable:
                every = sets.get(indices)
                if every is None:
                    every = sets[indices] = frozenset(indices)
                all_of[nid] = every
                free = set(node.free_gpus)
                if not free <= every:
                    free &= every
                if node.shared:
                    self._add_shared(nid, node.shared, every, free)
                free_of[nid] = free
        self.max_gpus = max_gpus
        buckets: list[list[str]] = [[] for _ in range(max_gpus + 1)]
        for nid, free in free_of.items():
            buckets[len(free)].append(nid)
        for bucket in buckets:
            bucket.sort()
        self._buckets = buckets
        self.total_free = sum(map(len, free_of.values()))
        self.up_count = len(free_of)
        self._eligible = {}

    def copy(self) -> FreePool:
        other = FreePool.__new__(FreePool)
        other.views = self.views
        other._all = self._all
        other._up = self._up
        other._free = {nid: set(free) for nid, free in self._free.items()}
        other._buckets = [list(b) for b in self._buckets]
        other._eligible = self._eligible
        if self._shared:
            other._shared = {nid: dict(used) for nid, used in self._shared.items()}
            other._rooms = {room: dict(spots) for room, spots in self._rooms.items()}
        else:
            other._shared, other._rooms = {}, {}
        other.total_free = self.total_free
        other.max_gpus = self.max_gpus
        other.up_count = self.up_count
        return other

    def _add_shared(
        self, node_id: str, shared: Mapping[int, int], every: frozenset[int], free: set[int]
    ) -> None:
        """Take the node's shared GPUs out of `free` and index them by room (at init)."""
        used = {g: min(u, SHARE_UNITS) for g, u in shared.items() if g in every and u > 0}
        if not used:
            return
        free.difference_update(used)
        self._shared[node_id] = used
        for g, u in used.items():
            self._room_add(node_id, g, u)

    # -- queries

    def is_up(self, node_id: str) -> bool:
        return node_id in self._free

    def up_views(self) -> Mapping[str, NodeView]:
        """The schedulable nodes' views (built once, shared by copies: up/down is fixed)."""
        if self._up is None:
            self._up = {nid: self.views[nid] for nid in self._free}
        return self._up

    def free(self, node_id: str) -> Set[int]:
        """The node's free GPU indices (empty when the node is not schedulable)."""
        return self._free.get(node_id, _EMPTY)

    def free_count(self, node_id: str) -> int:
        free = self._free.get(node_id)
        return 0 if free is None else len(free)

    def shared(self, node_id: str) -> Mapping[int, int]:
        """The node's shared GPUs: index -> share units in use."""
        return self._shared.get(node_id, _NO_SHARES)

    @property
    def has_shared(self) -> bool:
        return bool(self._shared)

    def shared_nodes(self) -> Iterable[str]:
        """The nodes with at least one shared GPU."""
        return self._shared.keys()

    def best_shared(
        self, share: int, policy: Policy, members: Set[str] | None = None
    ) -> tuple[str, int] | None:
        """A shared GPU with room for `share` units (among `members`' nodes), or None.

        fill_first: the least room that fits (pack), on the busiest node; spread: the most
        room (least used), on the node with the most free GPUs.  Ties: node id, GPU index.
        """
        rooms = sorted((r for r in self._rooms if r >= share), reverse=policy == "spread")
        free = self._free
        sign = 1 if policy == "fill_first" else -1
        for room in rooms:
            best: tuple[int, str, int] | None = None
            for nid, g in self._rooms[room]:
                if members is not None and nid not in members:
                    continue
                key = (sign * len(free[nid]), nid, g)
                if best is None or key < best:
                    best = key
            if best is not None:
                return best[1], best[2]
        return None

    def nodes_with_at_least(self, need: int) -> int:
        """How many schedulable nodes have at least `need` free GPUs."""
        if need > self.max_gpus:
            return 0
        return sum(len(b) for b in self._buckets[max(need, 0) :])

    def iter_nodes(self, need: int, policy: Policy) -> Iterator[str]:
        """Schedulable nodes with at least `need` free GPUs, best first for `policy`.

        fill_first: fewest free first (pack busy nodes, keep whole nodes for big jobs);
        spread: most free first.  Ties go to the lower node id.
        """
        need = max(need, 0)
        if need > self.max_gpus:
            return
        sizes = range(need, self.max_gpus + 1)
        for k in sizes if policy == "fill_first" else reversed(sizes):
            yield from self._buckets[k]

    def best_node(self, need: int, policy: Policy, members: Set[str] | None = None) -> str | None:
        """The best node for `policy` with at least `need` free GPUs (among `members`)."""
        need = max(need, 0)
        top = self.max_gpus
        if need > top:
            return None
        buckets = self._buckets
        sizes = range(need, top + 1) if policy == "fill_first" else range(top, need - 1, -1)
        for k in sizes:
            bucket = buckets[k]
            if bucket:
                if members is None:
                    return bucket[0]
                for nid in bucket:
                    if nid in members:
                        return nid
        return None

    def eligible(self, req: JobRequest) -> Eligible:
        """The schedulable nodes that pass the request's static filters (cached per pass)."""
        if (
            req.nodelist is None
            and req.allowed_nodes is None
            and req.gpu_type is None
            and not req.exclude
            and not req.requires
        ):
            key: _EligibleKey = _NO_FILTERS
        else:
            key = (req.nodelist, req.exclude, req.allowed_nodes, req.gpu_type, req.requires)
        found = self._eligible.get(key)
        if found is None:
            found = self._compute_eligible(req, key)
            self._eligible[key] = found
        return found

    def _compute_eligible(self, req: JobRequest, key: _EligibleKey) -> Eligible:
        if key == _NO_FILTERS:
            totals = [len(self.views[nid].gpu_indices) for nid in self._free]
            return Eligible(None, max(totals, default=0))
        # Start from the smallest explicit list, then filter.
        base: Iterable[str] = self._free
        if req.nodelist is not None:
            base = req.nodelist
        if req.allowed_nodes is not None and (
            req.nodelist is None or len(req.allowed_nodes) < len(req.nodelist)
        ):
            base = req.allowed_nodes
        accepted = frozenset(
            nid for nid in base if nid in self._free and _statically_eligible(req, self.views[nid])
        )
        most = max((len(self.views[nid].gpu_indices) for nid in accepted), default=0)
        return Eligible(accepted, most)

    # -- updates

    def take(self, placements: Iterable[Placement]) -> None:
        """Mark the placements' GPUs busy (GPUs not free here are ignored).

        A fractional placement (`share`) makes a free GPU shared, or adds to a shared GPU's
        use (up to a whole GPU); a whole GPU held by a whole job is left alone.
        """
        for p in placements:
            free = self._free.get(p.node_id)
            if free is None:
                continue
            if p.share:
                self._take_share(p.node_id, free, p.gpu_ids, p.share)
                continue
            before = len(free)
            free.difference_update(p.gpu_ids)
            self._moved(p.node_id, before, len(free))

    def release(self, node_id: str, gpu_ids: Iterable[int], share: int = 0) -> None:
        """Mark GPUs free again (simulation of a job ending); unknown GPUs are ignored.

        With `share`, a fractional job's units go back; its GPU is free once none are left.
        """
        free = self._free.get(node_id)
        if free is None:
            return
        if share:
            self._release_share(node_id, free, gpu_ids, share)
            return
        before = len(free)
        free.update(gpu_ids)
        if len(free) > before:
            if not free <= self._all[node_id]:
                free &= self._all[node_id]
            shared = self._shared.get(node_id)
            if shared:  # a GPU with shares left is not free, whatever was released
                free.difference_update(shared)
        self._moved(node_id, before, len(free))

    def release_all(self, placements: Iterable[Placement]) -> None:
        """`release` every placement (a job's GPUs, whole or shared)."""
        for p in placements:
            self.release(p.node_id, p.gpu_ids, p.share)

    def block(self, placements: Iterable[Placement]) -> None:
        """Make the placements' GPUs unusable for good, free, shared or busy (whatever their
        share): not even a `release` brings them back."""
        placements = list(placements)
        if self._shared:
            self.withhold(placements)
        else:
            self.take(placements)  # the same when nothing is shared, and quicker
        every = self._all = dict(self._all)  # copy on write: other copies keep theirs
        for p in placements:
            if p.node_id in every:
                every[p.node_id] = every[p.node_id] - frozenset(p.gpu_ids)

    def usable(self, node_id: str) -> frozenset[int]:
        """The node's GPUs this pool may ever hand out (all of them unless `block`ed)."""
        return self._all.get(node_id, _EMPTY)

    def withhold(self, placements: Iterable[Placement]) -> list[tuple[str, int, int]]:
        """`block` the GPUs and return what `restore` needs to put them back exactly."""
        taken: list[tuple[str, int, int]] = []
        for p in placements:
            nid = p.node_id
            free = self._free.get(nid)
            if free is None:
                continue
            shared = self._shared.get(nid)
            before = len(free)
            for g in p.gpu_ids:
                if g in free:
                    free.discard(g)
                    taken.append((nid, g, 0))
                elif shared and g in shared:
                    used = shared.pop(g)
                    self._room_remove(nid, g, used)
                    taken.append((nid, g, used))
            if shared is not None and not shared:
                del self._shared[nid]
            self._moved(nid, before, len(free))
        return taken

    def restore(self, taken: Iterable[tuple[str, int, int]]) -> None:
        """Undo a `withhold` (nothing else may have changed those GPUs in between)."""
        for nid, g, used in taken:
            free = self._free[nid]
            if used:
                self._shared.setdefault(nid, {})[g] = used
                self._room_add(nid, g, used)
            else:
                before = len(free)
                free.add(g)
                self._moved(nid, before, before + 1)

    def _take_share(self, nid: str, free: set[int], gpu_ids: Iterable[int], share: int) -> None:
        shared = self._shared.get(nid)
        for g in gpu_ids:
            if g in free:
                before = len(free)
                free.discard(g)
                self._moved(nid, before, before - 1)
                if shared is None:
                    shared = self._shared[nid] = {}
                used = min(share, SHARE_UNITS)
            elif shared and g in shared:
                used = shared[g]
                self._room_remove(nid, g, used)
                used = min(used + share, SHARE_UNITS)
            else:
                continue
            shared[g] = used
            self._room_add(nid, g, used)

    def _release_share(self, nid: str, free: set[int], gpu_ids: Iterable[int], share: int) -> None:
        shared = self._shared.get(nid)
        if not shared:
            return
        for g in gpu_ids:
            used = shared.get(g)
            if used is None:
                continue
            self._room_remove(nid, g, used)
            used -= share
            if used > 0:
                shared[g] = used
                self._room_add(nid, g, used)
                continue
            del shared[g]
            before = len(free)
            free.add(g)
            self._moved(nid, before, before + 1)
        if not shared:
            del self._shared[nid]

    def _room_add(self, nid: str, g: int, used: int) -> None:
        room = SHARE_UNITS - used
        if room > 0:
            self._rooms.setdefault(room, {})[(nid, g)] = None

    def _room_remove(self, nid: str, g: int, used: int) -> None:
        room = SHARE_UNITS - used
        spots = self._rooms.get(room)
        if spots is not None:
            spots.pop((nid, g), None)
            if not spots:
                del self._rooms[room]

    def _moved(self, node_id: str, before: int, after: int) -> None:
        if before == after:
            return
        old = self._buckets[before]
        del old[bisect.bisect_left(old, node_id)]
        bisect.insort(self._buckets[after], node_id)
        self.total_free += after - before


_EMPTY: frozenset[int] = frozenset()
_NO_SHARES: Mapping[int, int] = {}


# --------------------------------------------------------------------------- placement


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
    return tuple(Placement(nid, _lowest(pool.free(nid), per_node)) for nid in chosen)


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


def could_ever_fit(
    request: JobRequest, nodes: Sequence[NodeView] | Mapping[str, NodeView]
) -> str | None:
    """None if `request` could run on `nodes` once they are idle and up, else why not.

    Busy GPUs and down or draining nodes are ignored (they come back); what is checked is
    the cluster's shape: node names, GPU indices, GPU counts, GPU types, features, and the
    job's own node filters.  The reason is one sentence a user can act on.
    """
    views = nodes if isinstance(nodes, Mapping) else {n.node_id: n for n in nodes}
    req = request
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
    eligible = [v for v in _named_or_all(req, views) if _statically_eligible(req, v)]
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
        why = _why_not_eligible(req, node)
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
    which nodes are up, so callers may cache it per request shape for a pass.
    """
    if req.node_gpu_ids is not None:
        down = [nid for nid, _ in req.node_gpu_ids if not pool.is_up(nid)]
        if down:
            return _down_sentence(down), False
        parts = [f"{_gpu_list(ids)} on {nid}" for nid, ids in req.node_gpu_ids]
        return "waiting for " + " and ".join(parts), True
    if could_ever_fit(req, pool.up_views()) is not None:
        down = sorted(
            view.node_id
            for view in _named_or_all(req, pool.views)
            if not pool.is_up(view.node_id) and _statically_eligible(req, view)
        )
        if down:
            return _down_sentence(down), False
        return "no node that is up can run it", False
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


def _down_sentence(down: Sequence[str]) -> str:
    if len(down) == 1:
        return f"{down[0]} is down or draining"
    shown = ", ".join(down[:3])
    more = f" and {len(down) - 3} more" if len(down) > 3 else ""
    return f"{shown}{more} are down or draining"
