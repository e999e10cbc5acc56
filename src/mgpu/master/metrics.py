"""Prometheus exposition of the master's state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mgpu.model import JobState, NodeState

if TYPE_CHECKING:
    from mgpu.master.cluster import Cluster


def render_metrics(cluster: Cluster) -> str:
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    reg = CollectorRegistry()
    jobs = Gauge("mgpu_jobs", "Active jobs by state", ["state"], registry=reg)
    counts = {s: 0 for s in (JobState.QUEUED, JobState.RUNNING)}
    for j in cluster.jobs.values():
        counts[j.state] = counts.get(j.state, 0) + 1
    for s, n in counts.items():
        jobs.labels(s.value).set(n)
    nodes = Gauge("mgpu_nodes", "Nodes by state", ["state"], registry=reg)
    ncount = {s: 0 for s in NodeState}
    for node in cluster.nodes.values():
        ncount[node.state] += 1
    for ns, n in ncount.items():
        nodes.labels(ns.value).set(n)
    gpus = Gauge("mgpu_gpus", "GPUs by use", ["state"], registry=reg)
    total = sum(len(n.gpus) for n in cluster.nodes.values())
    busy = sum(len(n.busy) for n in cluster.nodes.values())
    gpus.labels("busy").set(busy)
    gpus.labels("free").set(total - busy)
    events = Counter("mgpu_jobs_ended", "Jobs ended since start", ["outcome"], registry=reg)
    for k in ("completed", "failed"):
        events.labels(k).inc(cluster.counters[k])
    started = Counter("mgpu_jobs_started", "Jobs started since start", registry=reg)
    started.inc(cluster.counters["started"])
    passes = Gauge("mgpu_scheduler_pass_seconds", "Duration of the last pass", registry=reg)
    passes.set(cluster.last_pass_duration)
    return generate_latest(reg).decode()
