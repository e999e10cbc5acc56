"""Prometheus exposition of the master's state.

Most series are read from the controller when `/metrics` is scraped (jobs, nodes, GPU
telemetry), through the small `MetricsSource` protocol.  Histograms need every
observation, so `JobMetrics` keeps them: the controller calls `started` when a job's process
first starts and `finished` when a job ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mgpu.master.monitor.kubeholders import gpu_holders
from mgpu.master.runtime.looplag import LoopLag
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job, JobState, NodeState
from mgpu.scheduler.types import SHARE_UNITS

WAIT_BUCKETS = (0.1, 0.5, 1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400)
RUNTIME_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 2 * 3600, 6 * 3600, 12 * 3600, 86400)
_MIB = 1024 * 1024


class JobMetrics:
    """Histograms and counters observed as jobs start and end (since the master started)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue_wait = Histogram(
            "mgpu_job_queue_wait_seconds",
            "Time from submit to the first start of a job",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.runtime = Histogram(
            "mgpu_job_runtime_seconds",
            "Run time of ended jobs (last attempt, start to end)",
            buckets=RUNTIME_BUCKETS,
            registry=self.registry,
        )
        self.ended = Counter(
            "mgpu_jobs_finished",
            "Jobs ended since the master started, by final state",
            ["state"],
            registry=self.registry,
        )
        self.failed = Counter(
            "mgpu_jobs_failed",
            "Jobs that ended failed or timed out since the master started",
            registry=self.registry,
        )
        self._ended = {s: self.ended.labels(s.value) for s in JobState if s.terminal}
        """The children by state, looked up once: a 100,000-task cancel counts each."""

    def started(self, job: Job) -> None:
        """The job's process started for the first time in this attempt."""
        if job.start_time is not None and job.retries == 0 and len(job.attempts) <= 1:
            self.queue_wait.observe(max(0.0, job.start_time - job.submit_time))

    def finished(self, job: Job, state: JobState) -> None:
        self._ended[state].inc()
        if state in (JobState.FAILED, JobState.TIMEOUT):
            self.failed.inc()
        if job.start_time is not None and job.end_time is not None:
            self.runtime.observe(max(0.0, job.end_time - job.start_time))


class MetricsSource(Protocol):
    """What /metrics reads of the controller."""

    @property
    def jobs(self) -> Mapping[str, Job]: ...

    @property
    def nodes(self) -> Mapping[str, NodeRecord]: ...

    @property
    def counters(self) -> Mapping[str, int]: ...

    @property
    def last_pass_duration(self) -> float: ...

    @property
    def job_metrics(self) -> JobMetrics: ...

    @property
    def last_full_pass_duration(self) -> float: ...

    @property
    def loop_lag(self) -> LoopLag: ...

    def stored_counts(self) -> dict[str, int]: ...


def render_metrics(cluster: MetricsSource) -> str:
    reg = CollectorRegistry()
    jobs = Gauge("mgpu_jobs", "Jobs known to the master, by state", ["state"], registry=reg)
    counts = {s: 0 for s in JobState}
    for state, n in cluster.stored_counts().items():
        if state in counts and JobState(state).terminal:
            counts[JobState(state)] = n
    for j in cluster.jobs.values():
        counts[j.state] += 1
    for s, n in counts.items():
        jobs.labels(s.value).set(n)
    nodes = Gauge("mgpu_nodes", "Nodes by state", ["state"], registry=reg)
    ncount = {s: 0 for s in NodeState}
    for node in cluster.nodes.values():
        ncount[node.state] += 1
    for ns, n in ncount.items():
        nodes.labels(ns.value).set(n)
    Gauge(
        "mgpu_nodes_reconnecting",
        "Nodes up but their agent not connected (a new leader not yet heard from it): "
        "offered no work, offline once silent for their timeout",
        registry=reg,
    ).set(
        sum(1 for n in cluster.nodes.values() if n.state != NodeState.OFFLINE and not n.connected)
    )
    gpus = Gauge("mgpu_gpus", "GPUs by use", ["state"], registry=reg)
    total = sum(len(n.gpus) for n in cluster.nodes.values())
    busy = sum(len(n.busy) + len(n.shares) for n in cluster.nodes.values())  # shared: busy
    foreign = sum(
        len(n.foreign_blocked - n.busy.keys() - n.shares.keys()) for n in cluster.nodes.values()
    )
    gpus.labels("busy").set(busy)
    gpus.labels("foreign").set(foreign)
    gpus.labels("free").set(total - busy - foreign)
    _gpu_gauges(cluster, reg)
    _host_gauges(cluster, reg)
    _kube_gauges(cluster, reg)
    events = Counter("mgpu_jobs_ended", "Jobs ended since start", ["outcome"], registry=reg)
    for k in ("completed", "failed"):
        events.labels(k).inc(cluster.counters[k])
    started = Counter("mgpu_jobs_started", "Jobs started since start", registry=reg)
    started.inc(cluster.counters["started"])
    passes = Gauge("mgpu_scheduler_pass_seconds", "Duration of the last pass", registry=reg)
    passes.set(cluster.last_pass_duration)
    full = Gauge(
        "mgpu_scheduler_full_pass_seconds",
        "Wall time of the last full pass of a long queue (off the event loop)",
        registry=reg,
    )
    full.set(cluster.last_full_pass_duration)
    text = generate_latest(reg).decode()
    text += generate_latest(cluster.loop_lag.registry).decode()
    return text + generate_latest(cluster.job_metrics.registry).decode()


def _gpu_gauges(cluster: MetricsSource, reg: CollectorRegistry) -> None:
    labels = ["node", "gpu"]
    util = Gauge("mgpu_gpu_utilization_percent", "GPU utilisation", labels, registry=reg)
    used = Gauge("mgpu_gpu_memory_used_bytes", "GPU memory in use", labels, registry=reg)
    size = Gauge("mgpu_gpu_memory_total_bytes", "GPU memory size", labels, registry=reg)
    temp = Gauge("mgpu_gpu_temperature_celsius", "GPU temperature", labels, registry=reg)
    power = Gauge("mgpu_gpu_power_watts", "GPU power draw", labels, registry=reg)
    held = Gauge(
        "mgpu_gpu_allocated",
        "1 if an mgpu job holds the GPU, the share in use if fractional jobs share it",
        labels,
        registry=reg,
    )
    outside = Gauge(
        "mgpu_gpu_foreign_memory_bytes", "GPU memory used outside mgpu", labels, registry=reg
    )
    sim = Gauge("mgpu_gpu_simulated", "1 if the GPU is simulated", labels, registry=reg)
    for node in cluster.nodes.values():
        for g in node.gpus:
            key = (node.node_id, str(g.index))
            shared = sum(node.shares.get(g.index, {}).values()) / SHARE_UNITS
            held.labels(*key).set(1 if g.index in node.busy else shared)
            tel = node.telemetry.get(g.index)
            if tel is None:
                continue
            sim.labels(*key).set(1 if tel.simulated else 0)
            if tel.utilization_pct is not None:
                util.labels(*key).set(tel.utilization_pct)
            if tel.memory_used_mb is not None:
                used.labels(*key).set(tel.memory_used_mb * _MIB)
            if tel.memory_total_mb is not None:
                size.labels(*key).set(tel.memory_total_mb * _MIB)
            if tel.temperature_c is not None:
                temp.labels(*key).set(tel.temperature_c)
            if tel.power_w is not None:
                power.labels(*key).set(tel.power_w)
            if tel.foreign_memory_mb is not None:
                outside.labels(*key).set(tel.foreign_memory_mb * _MIB)


def _host_gauges(cluster: MetricsSource, reg: CollectorRegistry) -> None:
    """CPUs and memory each node offers and has free (only nodes that say them), and what
    each running job holds (only jobs that hold some: the others share their nodes')."""
    cpus = Gauge("mgpu_node_cpus", "CPUs a node offers to jobs", ["node"], registry=reg)
    free = Gauge("mgpu_node_cpus_free", "Of those, not held by a job", ["node"], registry=reg)
    mem = Gauge("mgpu_node_memory_bytes", "Memory a node offers to jobs", ["node"], registry=reg)
    mem_free = Gauge(
        "mgpu_node_memory_free_bytes", "Of that, not held by a job", ["node"], registry=reg
    )
    for node in cluster.nodes.values():
        if node.cpus:
            cpus.labels(node.node_id).set(len(node.cpus))
            free.labels(node.node_id).set(node.free_cpu_count())
        if node.mem_mb:
            mem.labels(node.node_id).set(node.mem_mb * _MIB)
            mem_free.labels(node.node_id).set(node.free_mem_mb() * _MIB)
    job_cpus = Gauge(
        "mgpu_job_cpus", "CPUs a running job holds on a node", ["job", "node"], registry=reg
    )
    job_mem = Gauge(
        "mgpu_job_memory_bytes",
        "Memory a running job holds on a node",
        ["job", "node"],
        registry=reg,
    )
    for job in cluster.jobs.values():
        if job.state != JobState.RUNNING:
            continue
        for slot in job.allocation:
            if slot.cpus:
                job_cpus.labels(job.id, slot.node_id).set(slot.cpus)
            if slot.mem_mb:
                job_mem.labels(job.id, slot.node_id).set(slot.mem_mb * _MIB)


def _kube_gauges(cluster: MetricsSource, reg: CollectorRegistry) -> None:
    """A Kubernetes partition's Nodes: which partition each is in, its GPUs by holder
    (mgpu's jobs, other workloads' Pods, free) and who holds them, Pod by Pod."""
    member = Gauge(
        "mgpu_kubernetes_node",
        "1 for each node that is a Kubernetes Node of a Kubernetes-backed partition",
        ["node", "partition"],
        registry=reg,
    )
    by = Gauge(
        "mgpu_kubernetes_gpus",
        "A Kubernetes Node's GPUs by holder: mgpu (its jobs), others (other Pods), free",
        ["node", "holder"],
        registry=reg,
    )
    held = Gauge(
        "mgpu_kubernetes_pod_gpus",
        "GPUs a Pod holds on a Kubernetes Node: an mgpu job's (job is its id) or another "
        "workload's (job empty; pod is namespace/name)",
        ["node", "pod", "job"],
        registry=reg,
    )
    for node in cluster.nodes.values():
        if node.partition is None:
            continue
        member.labels(node.node_id, node.partition).set(1)
        holders = gpu_holders(node, cluster.jobs)
        mine = sum(h["gpus"] for h in holders if h["kind"] == "job")
        others = min(len(node.gpus) - mine, sum(h["gpus"] for h in holders if h["kind"] == "pod"))
        by.labels(node.node_id, "mgpu").set(mine)
        by.labels(node.node_id, "others").set(max(0, others))
        by.labels(node.node_id, "free").set(max(0, len(node.gpus) - mine - others))
        for h in holders:
            held.labels(node.node_id, h["pod"] or "", h["job"] or "").set(h["gpus"])
