"""CPUs and memory beside GPUs: what a job needs on one node, and what each node has free.

A job's ask (`resources.ResourceAsk`) becomes counts on a node only once the node is known:
`need_on` gives the CPUs and memory it holds there for the GPUs it takes there.  `NodeRoom`
keeps the free CPUs and memory of the nodes of one free pool (`pool.FreePool`), so that a
fit check is two dict lookups; a pool whose nodes report neither has none, and then a job
that asks nothing costs nothing more than it did before CPUs and memory were counted.

Also the words: memory as a person reads it (`format_mb`), and what a job asks of one node
(`ask_text`), for reasons and refusals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mgpu.resources import ResourceAsk

from .types import NodeView

__all__ = ["NodeRoom", "ask_text", "format_mb", "need_on"]


def need_on(ask: ResourceAsk, gpus: int, node: NodeView) -> tuple[int, int]:
    """(CPUs, MiB) the job holds on `node` where it takes `gpus` GPUs."""
    cpus = ask.cpus_on(gpus, node.cpus)
    return cpus, ask.mem_on(gpus, cpus, node.mem_mb)


def format_mb(mb: int) -> str:
    """Memory as a person reads it: `512M`, `16G`, `12.5G`."""
    if mb < 1024:
        return f"{mb}M"
    if mb % 1024 == 0:
        return f"{mb // 1024}G"
    return f"{mb / 1024:.1f}G"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ask_text(cpus: int, mem_mb: int) -> str:
    """`8 CPUs and 16G of memory` (the parts asked for; "" for neither)."""
    parts = []
    if cpus:
        parts.append(_plural(cpus, "CPU"))
    if mem_mb:
        parts.append(f"{format_mb(mem_mb)} of memory")
    return " and ".join(parts)


class NodeRoom:
    """Free CPUs and memory per schedulable node (0 for a node that does not report them).

    `top_cpus` and `top_mem` are upper bounds of the most free on one node (exact when
    built, raised as resources come back, never lowered by a take): a need above them fits
    nowhere, found in O(1).  Pools share one until either writes (`FreePool` copies it
    then), so a pool's copy costs nothing more for it.
    """

    __slots__ = ("_most", "cpus", "mem", "top_cpus", "top_mem")

    def __init__(self) -> None:
        self.cpus: dict[str, int] = {}
        self.mem: dict[str, int] = {}
        self.top_cpus = 0
        self.top_mem = 0
        self._most: tuple[int, int] | None = None
        """`most()` over every node, until something changes."""

    @classmethod
    def of(cls, nodes: Sequence[NodeView]) -> NodeRoom:
        """The free CPUs and memory of `nodes` (each as `put` would take it), in bulk."""
        room = cls()
        cpus = room.cpus = {n.node_id: max(0, min(n.free_cpus, n.cpus)) for n in nodes}
        mem = room.mem = {n.node_id: max(0, min(n.free_mem_mb, n.mem_mb)) for n in nodes}
        room.top_cpus = max(cpus.values(), default=0)
        room.top_mem = max(mem.values(), default=0)
        return room

    def copy(self) -> NodeRoom:
        other = NodeRoom.__new__(NodeRoom)
        other.cpus, other.mem = dict(self.cpus), dict(self.mem)
        other.top_cpus, other.top_mem = self.top_cpus, self.top_mem
        other._most = self._most
        return other

    def put(self, node: NodeView) -> None:
        """The node's free CPUs and memory as its view says (never more than it has)."""
        nid = node.node_id
        cpus = node.free_cpus if node.free_cpus < node.cpus else node.cpus
        mem = node.free_mem_mb if node.free_mem_mb < node.mem_mb else node.mem_mb
        cpus, mem = (cpus if cpus > 0 else 0), (mem if mem > 0 else 0)
        self.cpus[nid], self.mem[nid] = cpus, mem
        self._most = None
        if cpus > self.top_cpus:
            self.top_cpus = cpus
        if mem > self.top_mem:
            self.top_mem = mem

    def drop(self, node_id: str) -> None:
        self.cpus.pop(node_id, None)
        self.mem.pop(node_id, None)
        self._most = None

    def take(self, node_id: str, cpus: int, mem_mb: int) -> None:
        """Hold `cpus` and `mem_mb` on the node (never below 0: a reserved head's hold on
        a node whose room is only now coming back leaves nothing to others)."""
        left = self.cpus.get(node_id)
        if left is not None:
            self._most = None
            if cpus:
                left -= cpus
                self.cpus[node_id] = left if left > 0 else 0
            if mem_mb:
                mem = self.mem[node_id] - mem_mb
                self.mem[node_id] = mem if mem > 0 else 0

    def give(self, node: NodeView, cpus: int, mem_mb: int) -> None:
        """`cpus` and `mem_mb` come back on the node (at most what it has)."""
        nid = node.node_id
        if nid in self.cpus:
            self._most = None
            if cpus:
                c = self.cpus[nid] = min(node.cpus, self.cpus[nid] + cpus)
                self.top_cpus = max(self.top_cpus, c)
            if mem_mb:
                m = self.mem[nid] = min(node.mem_mb, self.mem[nid] + mem_mb)
                self.top_mem = max(self.top_mem, m)

    def most(self, nodes: Iterable[str] | None = None) -> tuple[int, int]:
        """The most free CPUs, and the most free memory, on one of `nodes` (None: any);
        exact, O(nodes): for reasons, not for fits."""
        if nodes is None:
            if self._most is None:
                self._most = max(self.cpus.values(), default=0), max(self.mem.values(), default=0)
            return self._most
        cpus, mem = self.cpus, self.mem
        ids = [nid for nid in nodes if nid in cpus]
        return max(map(cpus.__getitem__, ids), default=0), max(map(mem.__getitem__, ids), default=0)
