"""The controller's memory: active jobs, nodes, job steps, and the GPU ledger between them.

All of it lives on the asyncio loop, so there is no locking.  The ledger's rule, which
keeps a GPU from being given twice: a GPU is taken (`allocate`) only from a node's free set
while its job is written as running with a new epoch, and given back (`release`) only when
that slot has ended, the job ends or is requeued, or the node is declared lost.  A GPU is
free, whole (`NodeRecord.busy`: one job), or shared (`NodeRecord.shares`: fractional jobs'
share units, adding up to at most `SHARE_UNITS`); never whole and shared at once.  Shares are
not stored apart: at start-up `hold` rebuilds them from the running jobs' records.

CPUs and memory follow the same rule: a job that holds some (it asked, or the cluster's
defaults per GPU did) takes CPU ids (`NodeRecord.cpu_jobs`, picked by `pick_cpus`) and
MiB (`NodeRecord.mem_jobs`) with its GPUs, kept in its slots, and gives them back with
them; `hold` rebuilds them from the slots after a restart.  A job that holds none shares
the node's CPUs and memory, as every job did before they were scheduled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from mgpu.config import ClusterConfig
from mgpu.master.runtime.clock import Clock
from mgpu.master.state.cpus import pick_cpus
from mgpu.master.state.nodeindex import NodeIndex
from mgpu.master.state.registry import NodeRecord
from mgpu.master.state.shares import job_share_units
from mgpu.master.state.steps import Steps
from mgpu.model import Job, JobState, NodeEvent, Slot, SlotPhase
from mgpu.scheduler.shares import SHARE_UNITS

__all__ = ["ControllerState", "job_share_units"]


class ControllerState:
    def __init__(self, config: ClusterConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        """Active jobs (queued and running), in submit order; ended ones are in the store."""
        self.nodes: dict[str, NodeRecord] = {}
        self.node_index = NodeIndex(self.nodes)
        """The scheduler's views of the nodes, kept up to date as they change."""
        self.steps = Steps()
        self.wakeup = asyncio.Event()
        """Set when something happened that the scheduling loop should look at."""
        self._waiters: dict[str, asyncio.Event] = {}
        self.counters: dict[str, int] = {"started": 0, "failed": 0, "completed": 0}
        self.kube_nodes: dict[str, str] = {}
        """Node id → the Kubernetes-backed partition it is a Node of (mgpu.master.kube):
        only that partition's jobs run there, and its jobs nowhere else."""

    def wake(self) -> None:
        self.wakeup.set()

    # ---- waiting for a job ------------------------------------------------

    def job_event(self, job_id: str) -> asyncio.Event:
        """Set at the job's next change of state or start (then made anew)."""
        ev = self._waiters.get(job_id)
        if ev is None:
            ev = self._waiters[job_id] = asyncio.Event()
        return ev

    def notify(self, job: Job) -> None:
        ev = self._waiters.pop(job.id, None)
        if ev is not None:
            ev.set()

    # ---- nodes ------------------------------------------------------------

    def node(self, node_id: str) -> NodeRecord:
        """The node's record, made (from its entry in the config, if any) when unknown."""
        node = self.nodes.get(node_id)
        if node is None:
            node = self.nodes[node_id] = NodeRecord(node_id=node_id)
            node.watch(self.node_index.changed)
            self.node_index.changed(node_id, shape=True)
            entry = self.config.node(node_id)
            if entry is not None:
                node.gpu_type = entry.gpu_type
                node.rack = entry.rack or entry.switch
                node.hostname = entry.hostname or ""
                node.ip = entry.ip or ""
                node.heard_now(self.clock)
        return node

    def remove_node(self, node_id: str) -> None:
        del self.nodes[node_id]
        self.node_index.changed(node_id, shape=True)

    def sorted_nodes(self) -> list[NodeRecord]:
        return [self.nodes[k] for k in sorted(self.nodes)]

    def any_node_joined(self) -> bool:
        """Whether any node has ever said hello (nodes listed in the config but never seen
        have no GPUs to judge a job against)."""
        return any(n.gpu_source != "unknown" for n in self.nodes.values())

    def running_jobs_on(self, node: NodeRecord) -> list[Job]:
        jobs = (self.jobs.get(j) for j in sorted(node.jobs))
        return [j for j in jobs if j is not None and j.state == JobState.RUNNING]

    # ---- the GPU ledger ---------------------------------------------------

    def free(self, node_id: str, gpu_ids: Iterable[int], share: int = 0) -> bool:
        """May a start take these GPUs now: the node is there and schedulable, and none of
        them is held by a job or used outside mgpu.  With `share` (units of a fractional
        job): a GPU may be shared already, if that much room is left on it."""
        node = self.nodes.get(node_id)
        if node is None or not node.schedulable:
            return False
        if any(g in node.busy or g in node.foreign_blocked for g in gpu_ids):
            return False
        if not share:
            return not any(g in node.shares for g in gpu_ids)
        return all(sum(node.shares.get(g, {}).values()) + share <= SHARE_UNITS for g in gpu_ids)

    def room(self, node_id: str, cpus: int, mem_mb: int, whole: bool = False) -> bool:
        """Has the node `cpus` CPUs and `mem_mb` MiB free now (0 of each: always), and no
        `--exclusive` job on it?  `whole`: a start that takes the node whole needs it idle."""
        node = self.nodes.get(node_id)
        if node is None or node.whole_job is not None or (whole and node.jobs):
            return False
        return (not cpus or node.free_cpu_count() >= cpus) and (
            not mem_mb or node.free_mem_mb() >= mem_mb
        )

    def pick_cpus(self, node_id: str, count: int, gpu_ids: Iterable[int]) -> list[int] | None:
        """Which `count` free CPUs of the node a job on `gpu_ids` gets (near them, whole
        cores where it can); None when fewer are free."""
        node = self.nodes[node_id]
        wanted = set(gpu_ids)
        near = {g.numa_node for g in node.gpus if g.index in wanted and g.numa_node is not None}
        return pick_cpus(node.cpus, node.cpu_jobs, count, near)

    def allocate(
        self,
        job: Job,
        node_id: str,
        gpu_ids: Iterable[int],
        cpu_ids: Iterable[int] = (),
        mem_mb: int | None = None,
    ) -> None:
        node = self.nodes[node_id]
        node.jobs.add(job.id)
        if job.ask.exclusive:
            node.whole_job = job.id
        for c in cpu_ids:
            node.cpu_jobs[c] = job.id
        if mem_mb:
            node.mem_jobs[job.id] = mem_mb
        units = job_share_units(job)
        for g in gpu_ids:
            if units:
                node.shares.setdefault(g, {})[job.id] = units
            else:
                node.busy[g] = job.id
        node.changed()

    def release(self, job: Job, slot: Slot) -> None:
        node = self.nodes.get(slot.node_id)
        if node is None:
            return
        node.jobs.discard(job.id)
        if node.whole_job == job.id:
            node.whole_job = None
        for c in slot.cpu_ids or ():
            if node.cpu_jobs.get(c) == job.id:
                del node.cpu_jobs[c]
        node.mem_jobs.pop(job.id, None)
        for g in slot.gpu_ids:
            if node.busy.get(g) == job.id:
                del node.busy[g]
            tenants = node.shares.get(g)
            if tenants is not None and tenants.pop(job.id, None) is not None and not tenants:
                del node.shares[g]
        node.changed()
        if not node.jobs:
            node.move(NodeEvent.EMPTIED)
        self.wake()

    def hold(self, job: Job) -> None:
        """Mark the GPUs, CPUs and memory of a running job held (a job loaded as running
        at start-up)."""
        for slot in job.allocation:
            node = self.node(slot.node_id)
            if slot.phase != SlotPhase.EXITED:  # held ranks of an --mpi job too
                self.allocate(job, node.node_id, slot.gpu_ids, slot.cpu_ids or (), slot.mem_mb)
