"""The nodes as the scheduler sees them, kept up to date per node instead of rebuilt.

A pass (and every submit, which checks that the job could ever run) needs a `NodeView`
of every node.  Rebuilt from all the records each time, that cost grows with the cluster:
at 1,000 nodes it was most of the master's time per job.  Here each view is rebuilt only
when its node changed: a `NodeRecord` reports an assignment to a field its view reads
(`registry.VIEW_FIELDS`) by itself, and the GPU ledger (state.py) reports the changes it
makes in place (`NodeRecord.changed()`); nodes added or removed go through
`ControllerState.node` / `remove_node`.

Three answers: `views()` (every node, sorted by id: the scheduler's input), `pool()` (those
views as the scheduler's free-GPU index, `FreePool`, kept up to date a node at a time as the
views are and handed to each pass, which works on a copy: a pass does not index every
node's free GPUs anew), and `shape()` (the same list object for as long as no node's
*shape* changed — GPUs, type, rack, features, the set of nodes — so that what depends on
the shape alone, like the never-fits verdict at submit, can be remembered against it).
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu.master.state.registry import NodeRecord
from mgpu.master.state.snapshot import node_views
from mgpu.scheduler import FreePool, NodeView

__all__ = ["NodeIndex"]


class NodeIndex:
    def __init__(self, nodes: Mapping[str, NodeRecord]) -> None:
        self._nodes = nodes
        self._views: dict[str, NodeView] = {}
        self._dirty: set[str] = set()
        self._order: list[NodeView] | None = None
        self._pos: dict[str, int] = {}
        self._shape: list[NodeView] | None = None
        self._gpus = 0
        self._pool: FreePool | None = None
        """Made at the first `pool()`, then kept up to date by `_refresh`."""

    def changed(self, node_id: str, shape: bool = False) -> None:
        """The node's view is stale (`shape`: its GPUs, type, rack or features changed, or
        it was added or removed)."""
        self._dirty.add(node_id)
        if shape:
            self._shape = None

    def views(self) -> list[NodeView]:
        """Every node's view, sorted by node id (a new list: the caller may keep it)."""
        self._refresh()
        assert self._order is not None
        return list(self._order)

    def pool(self, fork: bool = True) -> FreePool:
        """The free pool of `views()` as they are now: a fork the caller may change, or
        hand to a pass on another thread; with `fork` False the kept pool itself, for a
        pass run at once on the loop (`schedule` works on a copy: nothing changes it)."""
        self._refresh()
        if self._pool is None:
            assert self._order is not None
            self._pool = FreePool(self._order)
        return self._pool.fork() if fork else self._pool

    def shape(self) -> list[NodeView]:
        """Every node's view, sorted by id: the same list until the cluster's shape changes
        (its views' free GPUs and states may be old; use it for the shape alone)."""
        self._refresh()
        if self._shape is None:
            assert self._order is not None
            self._shape = list(self._order)
            self._gpus = sum(len(view.gpu_indices) for view in self._shape)
        return self._shape

    def gpu_count(self) -> int:
        """Every GPU of every node, up or not (the job-size factor's cluster size)."""
        self.shape()
        return self._gpus

    def _refresh(self) -> None:
        if self._dirty:
            nodes = self._nodes
            dirty, self._dirty = self._dirty, set()
            records = [nodes[nid] for nid in dirty if nid in nodes]
            moved = False  # a node added or removed: a new order (and shape)
            pool = self._pool
            for view in node_views(records):
                moved = moved or view.node_id not in self._views
                self._views[view.node_id] = view
                if pool is not None:
                    pool.put(view)
            for nid in dirty:
                if nid not in nodes and self._views.pop(nid, None) is not None:
                    moved = True
                    if pool is not None:
                        pool.drop(nid)
            if moved:
                self._order = None
            elif self._order is not None:
                for rec in records:
                    self._order[self._pos[rec.node_id]] = self._views[rec.node_id]
        if len(self._views) != len(self._nodes):
            # A node added or removed without a word (not through ControllerState): start
            # again rather than answer wrong.
            self._views = {view.node_id: view for view in node_views(self._nodes.values())}
            self._order = None
            self._pool = None
        if self._order is None:
            ids = sorted(self._views)
            self._order = [self._views[nid] for nid in ids]
            self._pos = {nid: i for i, nid in enumerate(ids)}
            self._shape = None
