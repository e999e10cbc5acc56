"""A Kubernetes partition's Nodes as /metrics, the dashboard and `mgpu nodes` show them:
their partition, their GPUs, and who holds them, mgpu's jobs (with their Pods) and other
workloads' Pods (issue 33, item 5)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from mgpu.client.render import render_nodes
from mgpu.master.kube.link import KubeLink
from mgpu.master.monitor.dashboard import gpu_letters, node_details
from mgpu.master.monitor.metrics import _kube_gauges
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job, JobState, NodeState
from mgpu.protocol import GpuDesc


def _kube_node() -> NodeRecord:
    """k8s-node1 with 4 GPUs: job 7 holds 1 (its Pod there), another Pod holds 2."""
    gpus = [GpuDesc(index=i, name="gpu", memory_mb=0) for i in range(4)]
    node = NodeRecord("k8s-node1", gpus=gpus)
    node.state = NodeState.ONLINE
    node.partition = "k8s"
    node.link = KubeLink("k8s-node1", lambda node_id, message: None)
    node.busy = {0: "7"}
    node.jobs = {"7"}
    node.foreign_blocked = frozenset({2, 3})
    node.others = [
        {"name": "ml/train", "gpus": 2, "phase": "Running"},
        {"name": "kube-system/dns", "gpus": 0, "phase": "Running"},
    ]
    return node


def _jobs() -> dict[str, Job]:
    job = Job(id="7", user="alice", argv=["true"], command="true", state=JobState.RUNNING)
    job.pods = [{"name": "mgpu-lab-7-1-0", "node": "k8s-node1", "phase": "Running"}]
    return {"7": job}


def test_metrics_name_the_partition_its_gpus_and_who_holds_them() -> None:
    own = NodeRecord("gpu001", gpus=[GpuDesc(index=0, name="A100", memory_mb=0)])
    source = SimpleNamespace(nodes={"k8s-node1": _kube_node(), "gpu001": own}, jobs=_jobs())
    reg = CollectorRegistry()
    _kube_gauges(source, reg)  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    assert 'mgpu_kubernetes_node{node="k8s-node1",partition="k8s"} 1.0' in text
    assert 'mgpu_kubernetes_gpus{holder="mgpu",node="k8s-node1"} 1.0' in text
    assert 'mgpu_kubernetes_gpus{holder="others",node="k8s-node1"} 2.0' in text
    assert 'mgpu_kubernetes_gpus{holder="free",node="k8s-node1"} 1.0' in text
    assert 'mgpu_kubernetes_pod_gpus{job="7",node="k8s-node1",pod="mgpu-lab-7-1-0"} 1.0' in text
    assert 'mgpu_kubernetes_pod_gpus{job="",node="k8s-node1",pod="ml/train"} 2.0' in text
    assert "kube-system/dns" not in text  # it holds no GPU
    assert "gpu001" not in text  # a node of mgpu's own agent is not a Kubernetes Node


def test_the_dashboard_card_says_who_holds_a_kubernetes_nodes_gpus() -> None:
    node = _kube_node()
    details = node_details(node, _jobs())
    assert details["partition"] == "k8s" and details["kubernetes"] is True
    assert details["gpu_holders"] == [
        {"kind": "job", "job": "7", "user": "alice", "pod": "mgpu-lab-7-1-0", "gpus": 1,
         "phase": "Running"},
        {"kind": "pod", "job": None, "user": None, "pod": "ml/train", "gpus": 2,
         "phase": "Running"},
    ]  # fmt: skip
    assert gpu_letters(node) == "bfxx"  # the heat map: busy, free, held outside mgpu
    assert "gpu_holders" not in node_details(NodeRecord("gpu001"), {})


def test_mgpu_nodes_names_the_pods_that_hold_a_nodes_gpus() -> None:
    gpus = [{"index": i, "name": "nvidia.com/gpu", "foreign_blocked": i > 1} for i in range(4)]
    gpus[0]["busy_job"] = "7"
    node = {"node_id": "k8s-node1", "state": "online", "connected": True, "gpus": gpus,
            "kubernetes": True, "partition": "k8s", "pods": _kube_node().others}  # fmt: skip
    row = render_nodes([node]).splitlines()[1]
    assert "pod ml/train holds 2 GPUs (Running)" in row, row
    assert "outside mgpu" not in row and "dns" not in row
    assert row.split()[2:5] == ["4", "1", "1"]  # GPUS FREE BUSY
