"""One Kubernetes-backed partition: its Nodes as mgpu's nodes, its jobs as Pods.

mgpu decides *when* (its queue, priority, fairshare, backfill, limits: the scheduler sees
these nodes like its own), Kubernetes decides *where* (the kube-scheduler places the Pods).

* Two watches (mgpu.kube.Watch: list, then watch, resumed after a drop or a 410): the
  partition's Nodes (its `node_selector`), and every Pod of the cluster, mgpu's and
  others', since what others hold is not free (mgpu.master.kube.capacity).
* Each ready Node is a node of the controller with a `KubeLink` (no agent): it "says
  hello" with its allocatable GPUs, CPUs and memory and the runs its Pods carry, so the
  controller's reconcile finds a restarted master's Pods again (nothing run twice) and
  says which to delete; Pods of mgpu's cluster for jobs it does not run are deleted.  A
  Node that is not ready, or gone, is silent: after `networking.timeout` it is lost and
  its jobs requeued, by mgpu's rules.  A cordoned Node, or one whose taints the template
  does not tolerate, takes no new job.
* Runs: mgpu.master.kube.pods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mgpu.config import Partition
from mgpu.kube import KubeClient, KubeError, NodeView, PodView, Watch, WatchEvent
from mgpu.kubesection import KubernetesSection
from mgpu.master.control.admission import CONTAINER_FEATURE
from mgpu.master.kube.capacity import (
    OTHERS,
    blocked_cpus,
    blocked_gpus,
    offer,
    others_on,
    tolerated,
)
from mgpu.master.kube.link import KubeLink
from mgpu.master.kube.podagents import PodAgents
from mgpu.master.kube.pods import PodRuns, past_limit
from mgpu.master.kube.podspec import (
    ANN_HOLDS,
    ANN_JOB,
    ANN_NODE,
    LABEL_CLUSTER,
    label_value,
    template_parts,
)
from mgpu.master.kube.runs import PodRun, container_state, generation_of, run_of
from mgpu.model import JobState, Slot, SlotPhase
from mgpu.protocol import Hello, RunningReport
from mgpu.signalspec import parse_signal

if TYPE_CHECKING:
    from mgpu.master.control.cluster import Cluster

log = logging.getLogger("mgpu.master.kube")

__all__ = ["KubePartition"]

TICK = 0.5
"""Seconds between checks of the bounded waits and of what others hold."""
WATCH_RETRY = 10.0
"""Seconds before a watch refused (403, ...) is tried again."""


class KubePartition:
    def __init__(
        self, cluster: Cluster, partition: Partition, agents: PodAgents | None = None
    ) -> None:
        assert partition.kubernetes is not None
        self.cl = cluster
        self.agents = agents
        self.name = partition.name
        self.section: KubernetesSection = partition.kubernetes
        self.cluster_label = label_value(cluster.config.cluster.name)
        _, spec = template_parts(self.section.pod_template)
        self.tolerations: list[dict[str, Any]] = list(spec.get("tolerations") or [])
        self.client: KubeClient | None = None
        self.runs: PodRuns | None = None
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}
        """Every Pod of the cluster, by uid."""
        self.on_node: dict[str, dict[str, PodView]] = {}
        """The same, by Node and uid (bound Pods only)."""
        self.mine: dict[str, dict[str, Any]] = {}
        """mgpu's Pods (of this cluster and namespace), by name."""
        self.links: dict[str, KubeLink] = {}
        self._synced = {"nodes": False, "pods": False}
        self.started = False
        """Both watches have listed, and the Nodes have said hello."""
        self.left_alone: set[str] = set()
        """Pods of a newer master seen: each is warned of once, not at every event
        (forgotten once deleted)."""

    # ---- running ----------------------------------------------------------

    async def run(self) -> None:
        section = self.section
        try:
            self.client = KubeClient.from_config(section.kubeconfig, section.context)
        except KubeError as e:
            log.error("Kubernetes partition %s: %s", self.name, e)
            return
        self.runs = PodRuns(self.cl, self.name, section, self.client, self.agents)
        nodes = self._watching(
            lambda c: c.watch_nodes(section.label_selector()), "nodes", self._node_event
        )
        pods = self._watching(lambda c: c.watch_pods(all_namespaces=True), "pods", self._pod_event)
        try:
            await asyncio.gather(nodes, pods, self._ticking())
        finally:
            self.runs.cancel_all()
            await self.client.aclose()

    async def _watching(
        self,
        make: Callable[[KubeClient], Watch],
        what: str,
        handle: Callable[[WatchEvent], None],
    ) -> None:
        """Follow one watch for ever; a refusal (RBAC, ...) is one line, tried again."""
        assert self.client is not None
        while True:
            try:
                async for event in make(self.client):
                    handle(event)
                    if event.type == "SYNC" and not self._synced[what]:
                        self._synced[what] = True
                        if all(self._synced.values()):
                            self._start()
            except KubeError as e:
                log.error(
                    "Kubernetes partition %s: %s (again in %.0f s)", self.name, e, WATCH_RETRY
                )
                await asyncio.sleep(WATCH_RETRY)

    async def _ticking(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            if not self.started or self.runs is None:
                continue
            for name, link in self.links.items():
                node = self.cl.nodes.get(name)
                if node is not None and node.link is link:
                    node.heard_now(self.cl.clock)
            self.runs.check(time.monotonic())
            for name in self.nodes:
                self._recount(name)

    # ---- Nodes ------------------------------------------------------------

    def _node_event(self, event: WatchEvent) -> None:
        if event.type == "SYNC":
            self.nodes = {v.name: v for v in map(NodeView.of, event.items)}
        elif event.type == "DELETED":
            self.nodes.pop(NodeView.of(event.object).name, None)
        else:
            view = NodeView.of(event.object)
            self.nodes[view.name] = view
        if self.started:
            self._sync_nodes()

    def _sync_nodes(self) -> None:
        """Links for the ready Nodes, none for the others; the partition's members."""
        for name, view in self.nodes.items():
            if view.ready:
                self._link(name, view)
            else:
                self._unlink(name)
        for name in [n for n in self.links if n not in self.nodes]:
            self._unlink(name)
        members = {
            name: self.name
            for name, view in self.nodes.items()
            if not view.unschedulable and tolerated(view.taints, self.tolerations)
        }
        kube_nodes = self.cl.state.kube_nodes
        before = {n for n, p in kube_nodes.items() if p == self.name}
        if before != set(members):
            for name in before - set(members):
                kube_nodes.pop(name, None)
            kube_nodes.update(members)
            self.cl.loop.rescope()

    def _link(self, name: str, view: NodeView) -> None:
        link = self.links.get(name)
        node = self.cl.nodes.get(name)
        fresh = offer(view, self.section.gpu_resource)
        if link is not None and not link.closed and node is not None and node.link is link:
            if [g.index for g in node.gpus] != [g.index for g in fresh.gpus]:
                node.gpus = fresh.gpus
            if len(node.cpus) != len(fresh.cpus):
                node.cpus = fresh.cpus
            if node.mem_mb != fresh.mem_mb:
                node.mem_mb = fresh.mem_mb
            return
        assert self.runs is not None
        no_signal = None
        if self.section.steps is None:  # nothing of mgpu's in the Pod to send a signal
            no_signal = (
                f"its Kubernetes partition {self.name} runs no mgpu pod agents "
                "(kubernetes.steps): it can be cancelled, not signalled"
            )
        link = self.links[name] = KubeLink(name, self.runs.deliver, no_signal)
        hello = Hello(
            node_id=name,
            hostname=name,
            ip=view.address or "0.0.0.0",
            gpus=fresh.gpus,
            gpu_source="kubernetes",
            running=self._reports(name),
            cpus=fresh.cpus,
            mem_mb=fresh.mem_mb,
            features=[CONTAINER_FEATURE],  # every Pod is a container: `--image` is its image
        )
        welcome = self.cl.agent_hello(hello, link)
        node = self.cl.nodes[name]
        node.partition = self.name
        for report in welcome.kill:  # runs the master does not expect there
            for run in list(self.runs.runs.values()):
                if (run.job_id, run.epoch, run.slot_node) == (report.job_id, report.epoch, name):
                    run.ended = True
                    self.runs.spawn(self.runs.delete(run, grace=None, force=True))
        log.info("Kubernetes partition %s: node %s joined", self.name, name)

    def _unlink(self, name: str) -> None:
        link = self.links.pop(name, None)
        if link is not None:
            link.close()
            self.cl.agent_disconnected(name, link)
            log.warning("Kubernetes partition %s: node %s is not ready or gone", self.name, name)

    def _reports(self, name: str) -> list[RunningReport]:
        """The runs the Pods of mgpu on `name` carry, as an agent's hello lists them."""
        assert self.runs is not None
        reports = []
        for run in self.runs.runs.values():
            if run.slot_node != name or run.ended or run.holds:
                continue  # a held slot's Pod: an agent would report nothing there
            state, details = container_state(self.mine.get(run.name) or {})
            code = details.get("exitCode") if state == "terminated" else None
            reports.append(
                RunningReport(
                    job_id=run.job_id,
                    epoch=run.epoch,
                    pid=1 if state else None,
                    exited=state == "terminated",
                    exit_code=int(code) if code is not None else None,
                )
            )
        for step_id, epoch in self.agents.on_node(name) if self.agents is not None else []:
            reports.append(RunningReport(job_id=step_id, epoch=epoch, pid=1))  # in its Pod
        return reports

    # ---- Pods -------------------------------------------------------------

    def _ours(self, view: PodView) -> bool:
        return (
            view.namespace == self.section.namespace
            and view.labels.get(LABEL_CLUSTER) == self.cluster_label
            and ANN_JOB in view.annotations
        )

    def _pod_event(self, event: WatchEvent) -> None:
        if event.type == "SYNC":
            gone = dict(self.pods)
            for obj in event.items:
                view = PodView.of(obj)
                gone.pop(view.uid, None)
                self._pod(obj, view, deleted=False)
            for view in gone.values():  # deleted while the watch was away
                self._pod(self.mine.get(view.name) or {}, view, deleted=True)
            return
        view = PodView.of(event.object)
        self._pod(event.object, view, deleted=event.type == "DELETED")

    def _pod(self, obj: dict[str, Any], view: PodView, deleted: bool) -> None:
        before = self.pods.pop(view.uid, None)
        if before is not None and before.node:
            self.on_node.get(before.node, {}).pop(view.uid, None)
        if not deleted:
            self.pods[view.uid] = view
            if view.node:
                self.on_node.setdefault(view.node, {})[view.uid] = view
        if view.node in self.nodes and self.started:
            self._recount(view.node)
        if not self._ours(view):
            return
        if deleted:
            self.mine.pop(view.name, None)
            self.left_alone.discard(view.name)
        else:
            self.mine[view.name] = obj
        if not self.started or self.runs is None:
            return
        run = self.runs.runs.get(view.name)
        if run is None:
            if deleted:
                return
            run = self._adopt(view)
            if run is None:
                return
        self.runs.observe(run, obj, deleted)

    def _adopt(self, view: PodView) -> PodRun | None:
        """A Pod of mgpu's not followed yet (a master restart): its run, when the master
        runs that job there; else it is deleted."""
        assert self.runs is not None
        run = run_of(view, time.monotonic())
        made_by, mine = generation_of(view), self.runs.generation()
        if made_by is not None and mine is not None and made_by > mine:
            # A newer leader's Pod: this master is the deposed one, and judges nothing.
            if view.name not in self.left_alone:
                self.left_alone.add(view.name)
                log.warning(
                    "pod %s is of a newer master (generation %d): left alone", view.name, made_by
                )
            return None
        job = None if run is None else self.cl.jobs.get(run.job_id)
        if (
            run is None
            or job is None
            or job.state != JobState.RUNNING
            or job.epoch != run.epoch
            or not any(_live(s, run.holds) and s.node_id == run.slot_node for s in job.allocation)
        ):
            log.info("deleting pod %s: of no job this master runs", view.name)
            stray = PodRun(view.name, "", 0, 0, view.annotations.get(ANN_NODE, ""), 0.0)
            self.runs.spawn(self.runs.delete(stray, grace=None, force=True))
            return None
        run.time_limit = job.time_limit
        run.kill_grace = self.cl.config.scheduling.kill_grace
        if job.start_time is not None:
            run.started_at = time.monotonic() - max(0.0, time.time() - job.start_time)
        warning = None if job.signal is None else parse_signal(job.signal)
        if warning is not None and not past_limit(run, time.monotonic(), lead=warning.seconds):
            # Not yet warned (within its lead: the master that launched it did, once).
            self.runs.arm_warning(run, warning.number, warning.seconds, warning.batch_only)
        self.runs.runs[run.name] = run
        return run

    def _start(self) -> None:
        """Both watches listed: mgpu's Pods are followed again, the Nodes say hello (the
        controller's reconcile decides), then every Pod is looked at."""
        assert self.runs is not None
        self.started = True
        for name in sorted(self.mine):
            view = PodView.of(self.mine[name])
            if self.runs.runs.get(name) is None:
                self._adopt(view)
        if self.agents is not None:  # their steps, before the Nodes' hellos
            for adopted in list(self.runs.runs.values()):
                self.agents.adopt(self.runs, adopted)
        self._sync_nodes()
        pods = {name: PodView.of(obj).uid for name, obj in self.mine.items()}
        self.runs.spawn(self.runs.secrets.sweep(pods, self.cl.config.cluster.name))
        for name, obj in sorted(self.mine.items()):
            run = self.runs.runs.get(name)
            if run is not None and not run.ended:
                self.runs.observe(run, obj, deleted=False)
        log.info(
            "Kubernetes partition %s: %d node(s), %d pod(s) of mgpu's",
            self.name,
            len(self.nodes),
            len(self.mine),
        )

    # ---- what others hold -------------------------------------------------

    def _in_ledger(self, view: PodView) -> bool:
        """A Pod the ledger holds on its Node: a run of a running job, on its slot's node."""
        if not self._ours(view) or view.annotations.get(ANN_NODE) != view.node:
            return False
        job = self.cl.jobs.get(view.annotations[ANN_JOB])
        if job is None or job.state != JobState.RUNNING:
            return False
        if str(job.epoch) != view.labels.get("mgpu.io/epoch"):
            return False
        holds = view.annotations.get(ANN_HOLDS) == "true"
        return any(_live(s, holds) and s.node_id == view.node for s in job.allocation)

    def _recount(self, name: str) -> None:
        node = self.cl.nodes.get(name)
        if node is None or node.partition != self.name:
            return
        on = self.on_node.get(name, {}).values()
        others = others_on(on, self.section.gpu_resource, self._in_ledger)
        blocked = blocked_gpus((g.index for g in node.gpus), node.busy, others.gpus)
        freed = len(blocked) < len(node.foreign_blocked)
        if blocked != node.foreign_blocked:
            node.foreign_blocked = blocked
        cpus = blocked_cpus((c.id for c in node.cpus), node.cpu_jobs, others.cpus)
        held = sorted(c for c, j in node.cpu_jobs.items() if j == OTHERS)
        mem_before = node.mem_jobs.get(OTHERS, 0)
        if held != sorted(cpus) or mem_before != others.mem_mb:
            for c in held:
                del node.cpu_jobs[c]
            node.cpu_jobs.update(dict.fromkeys(cpus, OTHERS))
            node.mem_jobs[OTHERS] = others.mem_mb
            freed = freed or len(cpus) < len(held) or others.mem_mb < mem_before
            node.changed()
        node.others = others.pods
        if freed:
            self.cl.state.wake()


def _live(slot: Slot, holds: bool) -> bool:
    """The slot has a live process (a run's Pod), or is held (a holder's Pod)."""
    return slot.phase == SlotPhase.HELD if holds else not slot.done


def services(cluster: Cluster) -> list[Callable[[], Awaitable[None]]]:
    """The config's Kubernetes partitions, each a task for the master to run; their pod
    agents (the jobs' steps) are the cluster's `pod_agents`."""
    agents = cluster.pod_agents = PodAgents()
    return [KubePartition(cluster, p, agents).run for p in cluster.config.kube_partitions()]
