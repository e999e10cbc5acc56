"""The test Kubernetes itself works: a Pod holding a GPU runs on a kubelet, its log is read
through the API (pods/log: the API server reaches the kubelet at its node address) and its
exit code is reported; a Pod asking for more GPUs than any node has stays Pending with the
scheduler's own reason."""

from __future__ import annotations

import re
import uuid
from typing import Any

from kubecluster import GPU_RESOURCE, IMAGE_BUSYBOX, KubeCluster, wait_for


def _pod(name: str, command: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE_BUSYBOX,
                    "command": ["sh", "-c", command],
                    "resources": {"limits": {GPU_RESOURCE: gpus}},
                }
            ],
        },
    }


def _create(kube: KubeCluster, pod: dict[str, Any]) -> str:
    resp = kube.api.post("/api/v1/namespaces/default/pods", json=pod)
    assert resp.status_code == 201, resp.text
    return f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}"


def test_nodes_advertise_fake_gpus(kube: KubeCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.get("/api/v1/nodes")["items"]}
    assert set(nodes) == {"k8s-node1", "k8s-node2"}
    for name, node in nodes.items():
        assert node["status"]["allocatable"][GPU_RESOURCE] == "2"
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == kube.nodes[name].ip  # not loopback


def test_gpu_pod_runs_and_reports_exit_code_and_log(kube: KubeCluster) -> None:
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    command = 'echo "hello from $(hostname) gpus=$NVIDIA_VISIBLE_DEVICES"; exit 3'
    path = _create(kube, _pod(name, command, 1))

    def finished() -> dict[str, Any] | None:
        pod = kube.get(path)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(f"pod {name} to finish", finished, 180)
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    node = pod["spec"]["nodeName"]
    assert node in kube.nodes
    resp = kube.api.get(path + "/log")
    assert resp.status_code == 200, resp.text
    # The device plugin handed the container one of its node's fake GPUs.
    assert re.fullmatch(f"hello from {name} gpus=GPU-{node}-[01]\n", resp.text), resp.text
    assert kube.api.delete(path, params={"gracePeriodSeconds": 0}).status_code == 200


def test_pod_asking_for_too_many_gpus_stays_pending(kube: KubeCluster) -> None:
    name = f"toobig-{uuid.uuid4().hex[:6]}"
    path = _create(kube, _pod(name, "true", 3))  # each node has 2

    def unschedulable() -> str | None:
        conditions = kube.get(path)["status"].get("conditions", [])
        for cond in conditions:
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return str(cond.get("message", ""))
        return None

    message = wait_for(f"pod {name} marked unschedulable", unschedulable, 120)
    assert "Insufficient nvidia.com/gpu" in message
    assert message.startswith("0/2 nodes are available")
    assert kube.get(path)["status"]["phase"] == "Pending"
    assert kube.api.delete(path, params={"gracePeriodSeconds": 0}).status_code == 200
