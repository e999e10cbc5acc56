"""The free GPUs of one pass, indexed for placement.

`FreePool` indexes schedulable nodes by how many GPUs they have free, so "the busiest node
with at least 4 free" is a walk up the buckets from 4 that usually stops at the first node,
rather than a scan of every node.  A job's static filters (up, in `--nodelist`, not
excluded, allowed to the user, GPU type, features) are evaluated once per distinct
combination (`Eligible`) and cached for the pass.  Shared GPUs (fractional requests, see
`shares.py`) are kept apart from the free ones, indexed by their room; with no shared GPU
none of this costs a whole-GPU request anything.

A pool may also be kept from pass to pass by its caller and updated a node at a time
(`put`, `drop`: the master's node index), rather than built from every node's view at
every pass; the pass then works on a `fork` of it.  So that copies cost a copy of a few
dicts, not of every node's free set, the free sets are frozen and replaced when they change.

CPUs and memory (`room.NodeRoom`) are kept beside the GPUs for the nodes that report them;
copies share that index until one of them changes it.  A job with a CPU or memory ask fits a
node only where both are free too (`room_for`); a job that asks nothing never looks at them.

`--exclusive` needs two things more, which neither GPUs nor CPUs show: a job that holds
nothing of a node (`--gpus 0`, no ask) still runs there, so the node is not idle (`_bare`
counts them); and a node an exclusive job holds takes no other job, not even one that would
hold nothing (`_whole`: such nodes are passed over where a job needs no free GPU).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set

from mgpu.resources import ResourceAsk

from .filters import Eligible, EligibleKey, accepted_nodes, filter_key
from .room import NodeRoom
from .types import SHARE_UNITS, JobRequest, NodeView, Placement, Policy

__all__ = ["Eligible", "FreePool"]

# --------------------------------------------------------------------------- the free pool


class FreePool:
    """Free GPUs of every schedulable node, bucketed by free count; updated as jobs start.

    `buckets[k]` holds the ids (sorted) of the nodes with exactly `k` free GPUs.  Copies
    (`copy`) share the node views and the eligibility cache, so a simulation (backfill
    reservations, preemption) costs a copy of the dict of (frozen) free sets.

    Shared GPUs (holding fractional jobs) are not free: `_shared[node][gpu]` is the share
    units in use, and `_rooms[room]` holds the (node, gpu) pairs with that much room left.
    """

    __slots__ = (
        "_all",
        "_bare",
        "_buckets",
        "_eligible",
        "_free",
        "_room",
        "_room_own",
        "_rooms",
        "_shared",
        "_up",
        "_whole",
        "max_gpus",
        "total_free",
        "up_count",
        "views",
    )

    views: dict[str, NodeView]
    _all: dict[str, frozenset[int]]
    _up: dict[str, NodeView] | None
    _free: dict[str, frozenset[int]]
    _buckets: list[list[str]]
    _eligible: dict[EligibleKey, Eligible]
    _shared: dict[str, dict[int, int]]
    _rooms: dict[int, dict[tuple[str, int], None]]
    _room: NodeRoom | None
    """Free CPUs and memory; None while no node reports either."""
    _room_own: bool
    """`_room` is this pool's alone (else copy it before a change)."""
    _bare: dict[str, int]
    """Schedulable node -> its running jobs that hold none of its GPUs, CPUs or memory."""
    _whole: set[str]
    """Schedulable nodes an `--exclusive` job holds."""
    total_free: int
    max_gpus: int
    up_count: int

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        # Built at every pass from every node: local names and C-level tests on purpose.
        views: dict[str, NodeView] = {}
        free_of: dict[str, frozenset[int]] = {}
        all_of: dict[str, frozenset[int]] = {}
        self.views, self._free, self._all = views, free_of, all_of
        self._up = None
        self._shared = {}
        self._rooms = {}
        self._bare, self._whole = {}, set()
        reporting: list[NodeView] = []  # nodes that say what CPUs or memory they have
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
                free_of[nid] = self._free_of(nid, node, every)
                if node.cpus or node.mem_mb:
                    reporting.append(node)
                if node.bare_jobs or node.whole:
                    self._occupy(node)
        self._room, self._room_own = NodeRoom.of(reporting) if reporting else None, True
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

    def _occupy(self, node: NodeView) -> None:
        """Note the node's jobs that no free count shows (see the module docstring)."""
        if node.bare_jobs > 0:
            self._bare[node.node_id] = node.bare_jobs
        if node.whole:
            self._whole.add(node.node_id)

    def _free_of(self, nid: str, node: NodeView, every: frozenset[int]) -> frozenset[int]:
        """The node's free set, its shared GPUs indexed (at init or `put`)."""
        free = node.free_gpus
        if not isinstance(free, frozenset) or not free <= every:
            free = frozenset(free) & every
        if node.shared:
            free = self._add_shared(nid, node.shared, every, free)
        return free

    def copy(self) -> FreePool:
        other = FreePool.__new__(FreePool)
        other.views = self.views
        other._all = self._all
        other._up = self._up
        other._free = dict(self._free)  # frozen sets: replaced, never changed in place
        other._buckets = [list(b) for b in self._buckets]
        other._eligible = self._eligible
        if self._shared:
            other._shared = {nid: dict(used) for nid, used in self._shared.items()}
            other._rooms = {room: dict(spots) for room, spots in self._rooms.items()}
        else:
            other._shared, other._rooms = {}, {}
        other._bare = dict(self._bare) if self._bare else {}
        other._whole = set(self._whole) if self._whole else set()
        other._room = self._room  # shared until either changes it
        other._room_own = self._room_own = self._room is None
        other.total_free = self.total_free
        other.max_gpus = self.max_gpus
        other.up_count = self.up_count
        return other

    def fork(self) -> FreePool:
        """A copy that shares nothing this pool changes: for a pool kept across passes
        (`put`, `drop`), a pass's own (which may run on another thread meanwhile)."""
        other = self.copy()
        other.views = dict(self.views)
        other._all = dict(self._all)
        # Shared on purpose: the filters' answers hold until a node's shape or up/down
        # state changes, and then this pool starts a new dict.
        other._eligible = self._eligible
        return other

    def _add_shared(
        self, node_id: str, shared: Mapping[int, int], every: frozenset[int], free: frozenset[int]
    ) -> frozenset[int]:
        """Index the node's shared GPUs by room; returns `free` without them."""
        used = {g: min(u, SHARE_UNITS) for g, u in shared.items() if g in every and u > 0}
        if not used:
            return free
        self._shared[node_id] = used
        for g, u in used.items():
            self._room_add(node_id, g, u)
        return free.difference(used)

    # -- kept across passes

    def put(self, node: NodeView) -> None:
        """Add or replace one node's view (a pool kept up to date by its caller)."""
        nid = node.node_id
        old = self.views.get(nid)
        if old is not None:
            self._remove(nid, old, node)
        else:
            self._eligible = {}  # a new dict: copies keep theirs
        self.views[nid] = node
        self._up = None  # a new dict when asked: copies keep theirs
        indices = node.gpu_indices
        if len(indices) > self.max_gpus:
            self._buckets.extend([] for _ in range(len(indices) - self.max_gpus))
            self.max_gpus = len(indices)
        elif old is not None and len(old.gpu_indices) == self.max_gpus > len(indices):
            self._fit_max()
        if node.schedulable:
            every = self._all[nid] = frozenset(indices)
            free = self._free[nid] = self._free_of(nid, node, every)
            bisect.insort(self._buckets[len(free)], nid)
            self.total_free += len(free)
            self.up_count += 1
            if node.cpus or node.mem_mb:
                self._own_room().put(node)
            if node.bare_jobs or node.whole:
                self._occupy(node)

    def drop(self, node_id: str) -> None:
        """Forget one node (a pool kept up to date by its caller)."""
        old = self.views.get(node_id)
        if old is not None:
            self._remove(node_id, old, None)
            del self.views[node_id]
            self._up = None
            if len(old.gpu_indices) == self.max_gpus:
                self._fit_max()

    def _fit_max(self) -> None:
        """`max_gpus` anew after the largest node shrank or went (rare: a look at all)."""
        self.max_gpus = max((len(v.gpu_indices) for v in self.views.values()), default=0)
        del self._buckets[self.max_gpus + 1 :]

    def _remove(self, nid: str, old: NodeView, new: NodeView | None) -> None:
        """Take the node out of the index before its view is replaced (`new`) or dropped;
        the cached answers go if what they are made of changed."""
        free = self._free.pop(nid, None)
        if free is not None:
            bucket = self._buckets[len(free)]
            del bucket[bisect.bisect_left(bucket, nid)]
            self.total_free -= len(free)
            self.up_count -= 1
            self._all.pop(nid, None)
            for g, used in self._shared.pop(nid, {}).items():
                self._room_remove(nid, g, used)
            if self._room is not None and nid in self._room.cpus:
                self._own_room().drop(nid)
            self._bare.pop(nid, None)
            self._whole.discard(nid)
        if (
            new is None
            or new.schedulable != old.schedulable
            or new.gpu_indices != old.gpu_indices
            or new.gpu_type != old.gpu_type
            or new.features != old.features
        ):
            self._eligible = {}  # a new dict: copies keep theirs

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

    # -- CPUs and memory

    def _own_room(self) -> NodeRoom:
        """This pool's CPU/memory index, copied first if it is shared with another pool."""
        if self._room is None:
            self._room = NodeRoom()
        elif not self._room_own:
            self._room = self._room.copy()
        self._room_own = True
        return self._room

    def free_cpus(self, node_id: str) -> int:
        room = self._room
        return 0 if room is None else room.cpus.get(node_id, 0)

    def free_mem(self, node_id: str) -> int:
        room = self._room
        return 0 if room is None else room.mem.get(node_id, 0)

    def most_room(self, nodes: Iterable[str] | None = None) -> tuple[int, int]:
        """The most free CPUs, and the most free memory, on one of `nodes` (None: any)."""
        return (0, 0) if self._room is None else self._room.most(nodes)

    def room_for(self, node_id: str, gpus: int, ask: ResourceAsk) -> tuple[int, int] | None:
        """(CPUs, MiB) `ask` holds on the node with `gpus` GPUs there, if both are free
        there (`--exclusive`: the node idle, all of both), else None."""
        view = self.views[node_id]
        cpus = ask.cpus_on(gpus, view.cpus)
        mem = ask.mem_on(gpus, cpus, view.mem_mb)
        room = self._room
        if ask.exclusive:
            return (cpus, mem) if self.idle(node_id) else None
        if room is None:
            return (0, 0) if not (cpus or mem) else None
        if (cpus and room.cpus.get(node_id, 0) < cpus) or (mem and room.mem.get(node_id, 0) < mem):
            return None
        return cpus, mem

    def has_free(self, cpus: int, mem_mb: int) -> Callable[[str], bool]:
        """Whether a node has `cpus` and `mem_mb` free: a test for one placement's walk
        over many nodes (valid until the pool next changes)."""
        room = self._room
        if room is None:
            return _ALWAYS if not (cpus or mem_mb) else _NEVER
        free_cpus, free_mem = room.cpus.get, room.mem.get

        def has(node_id: str) -> bool:
            return (not cpus or free_cpus(node_id, 0) >= cpus) and (
                not mem_mb or free_mem(node_id, 0) >= mem_mb
            )

        return has

    def idle(self, node_id: str) -> bool:
        """Nothing runs on the node: all its GPUs, CPUs and memory are free, and no job
        that holds none of them runs there either."""
        view = self.views[node_id]
        free = self._free.get(node_id)
        if free is None or len(free) != len(self._all[node_id]) or node_id in self._shared:
            return False
        if node_id in self._bare or node_id in self._whole:
            return False
        return self.free_cpus(node_id) == view.cpus and self.free_mem(node_id) == view.mem_mb

    def held_whole(self, node_id: str) -> bool:
        """An `--exclusive` job holds the node: no other job may start there."""
        return node_id in self._whole

    def bare_jobs(self, node_id: str) -> int:
        """Jobs running on the node that hold none of its GPUs, CPUs or memory."""
        return self._bare.get(node_id, 0)

    def could_hold(self, cpus: int, mem_mb: int) -> bool:
        """Whether some node might have `cpus` and `mem_mb` free (False: none has, O(1))."""
        room = self._room
        if room is None:
            return not (cpus or mem_mb)
        return cpus <= room.top_cpus and mem_mb <= room.top_mem

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
        self,
        share: int,
        policy: Policy,
        members: Set[str] | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> tuple[str, int] | None:
        """A shared GPU with room for `share` units (among `members`' nodes, on a node
        `accept`ed: one with the CPUs and memory the job asks), or None.

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
                if accept is not None and not accept(nid):
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
        whole = self._whole
        for k in sizes if policy == "fill_first" else reversed(sizes):
            if k == 0 and whole:  # a node held whole has no free GPU: only here
                yield from (nid for nid in self._buckets[0] if nid not in whole)
            else:
                yield from self._buckets[k]

    def best_node(self, need: int, policy: Policy, members: Set[str] | None = None) -> str | None:
        """The best node for `policy` with at least `need` free GPUs (among `members`)."""
        need = max(need, 0)
        top = self.max_gpus
        if need > top:
            return None
        buckets = self._buckets
        sizes = range(need, top + 1) if policy == "fill_first" else range(top, need - 1, -1)
        whole = self._whole
        for k in sizes:
            bucket = buckets[k]
            if bucket:
                if k == 0 and whole:  # a node held whole has no free GPU: only here
                    bucket = [nid for nid in bucket if nid not in whole]
                if members is None:
                    if bucket:
                        return bucket[0]
                    continue
                for nid in bucket:
                    if nid in members:
                        return nid
        return None

    def eligible(self, req: JobRequest) -> Eligible:
        """The schedulable nodes that pass the request's static filters (cached per pass)."""
        key = filter_key(req)
        found = self._eligible.get(key)
        if found is None:
            found = self._eligible[key] = accepted_nodes(req, key, self._free, self.views)
        return found

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
            if p.whole:
                self._whole.add(p.node_id)
            elif not (p.gpu_ids or p.cpus or p.mem_mb):
                self._bare[p.node_id] = self._bare.get(p.node_id, 0) + 1
            if p.cpus or p.mem_mb:
                self._own_room().take(p.node_id, p.cpus, p.mem_mb)
            if p.share:
                self._take_share(p.node_id, free, p.gpu_ids, p.share)
                continue
            self._replace(p.node_id, free, free.difference(p.gpu_ids))

    def release(
        self,
        node_id: str,
        gpu_ids: Sequence[int],
        share: int = 0,
        cpus: int = 0,
        mem_mb: int = 0,
        whole: bool = False,
    ) -> None:
        """Mark GPUs free again (simulation of a job ending); unknown GPUs are ignored.

        With `share`, a fractional job's units go back; its GPU is free once none are left.
        `cpus` and `mem_mb` the job held there come back too; `whole`: it held the node
        whole.  A job that held nothing there (no GPU, CPU or memory) leaves it too.
        """
        free = self._free.get(node_id)
        if free is None:
            return
        if whole:
            self._whole.discard(node_id)
        elif not (gpu_ids or cpus or mem_mb):
            left = self._bare.get(node_id, 0) - 1
            if left > 0:
                self._bare[node_id] = left
            else:
                self._bare.pop(node_id, None)
            return
        if cpus or mem_mb:
            self._own_room().give(self.views[node_id], cpus, mem_mb)
        if share:
            self._release_share(node_id, free, gpu_ids, share)
            return
        new = free.union(gpu_ids)
        if len(new) > len(free):
            if not new <= self._all[node_id]:
                new &= self._all[node_id]
            shared = self._shared.get(node_id)
            if shared:  # a GPU with shares left is not free, whatever was released
                new = new.difference(shared)
        self._replace(node_id, free, new)

    def release_all(self, placements: Iterable[Placement]) -> None:
        """`release` every placement (a job's GPUs, whole or shared)."""
        for p in placements:
            self.release(p.node_id, p.gpu_ids, p.share, p.cpus, p.mem_mb, p.whole)

    def block(self, placements: Iterable[Placement]) -> None:
        """Make the placements' GPUs unusable for good, free, shared or busy (whatever their
        share): not even a `release` brings them back."""
        placements = list(placements)
        if self._shared:
            self.withhold(placements)
            for p in placements:  # CPUs, memory and a whole node as `take` holds them
                if (p.cpus or p.mem_mb) and p.node_id in self._free:
                    self._own_room().take(p.node_id, p.cpus, p.mem_mb)
                if p.whole and p.node_id in self._free:
                    self._whole.add(p.node_id)
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
        """`block` the GPUs (their CPUs and memory are left alone: admin reservations hold
        GPUs only) and return what `restore` needs to put them back exactly."""
        taken: list[tuple[str, int, int]] = []
        for p in placements:
            nid = p.node_id
            free = self._free.get(nid)
            if free is None:
                continue
            shared = self._shared.get(nid)
            gone: list[int] = []
            for g in p.gpu_ids:
                if g in free and g not in gone:
                    gone.append(g)
                    taken.append((nid, g, 0))
                elif shared and g in shared:
                    used = shared.pop(g)
                    self._room_remove(nid, g, used)
                    taken.append((nid, g, used))
            if shared is not None and not shared:
                del self._shared[nid]
            if gone:
                self._replace(nid, free, free.difference(gone))
        return taken

    def restore(self, taken: Iterable[tuple[str, int, int]]) -> None:
        """Undo a `withhold` (nothing else may have changed those GPUs in between)."""
        for nid, g, used in taken:
            free = self._free[nid]
            if used:
                self._shared.setdefault(nid, {})[g] = used
                self._room_add(nid, g, used)
            else:
                self._replace(nid, free, free | {g})

    def _take_share(
        self, nid: str, free: frozenset[int], gpu_ids: Iterable[int], share: int
    ) -> None:
        shared = self._shared.get(nid)
        for g in gpu_ids:
            if g in free:
                free = self._replace(nid, free, free - {g})
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

    def _release_share(
        self, nid: str, free: frozenset[int], gpu_ids: Iterable[int], share: int
    ) -> None:
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
            free = self._replace(nid, free, free | {g})
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

    def _replace(self, node_id: str, old: frozenset[int], new: frozenset[int]) -> frozenset[int]:
        """The node's free set is now `new` (was `old`); returns `new`."""
        self._free[node_id] = new
        self._moved(node_id, len(old), len(new))
        return new

    def _moved(self, node_id: str, before: int, after: int) -> None:
        if before == after:
            return
        old = self._buckets[before]
        del old[bisect.bisect_left(old, node_id)]
        bisect.insort(self._buckets[after], node_id)
        self.total_free += after - before


def _ALWAYS(node_id: str) -> bool:
    return True


def _NEVER(node_id: str) -> bool:
    return False


_EMPTY: frozenset[int] = frozenset()
_NO_SHARES: Mapping[int, int] = {}


# --------------------------------------------------------------------------- placement
