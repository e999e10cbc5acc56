"""The test Kubernetes itself works: a Pod holding a GPU runs on a kubelet, its log is read
through the API (pods/log: the API server reaches the kubelet at its node address) and its
exit code is reported; a Pod asking for more GPUs than any node has stays Pending with the
scheduler's own reason."""

from __future__ import annotations

import re
import socket
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


def _run_to_end(
    kube: KubeCluster, name: str, command: str, node: str, gpus: int = 0
) -> dict[str, Any]:
    pod = _pod(name, command, gpus)
    pod["spec"]["nodeName"] = node  # placed by hand: one Pod on each node
    path = _create(kube, pod)

    def finished() -> dict[str, Any] | None:
        got = kube.get(path)
        return got if got["status"].get("phase") in ("Succeeded", "Failed") else None

    return dict(wait_for(f"pod {name} to finish", finished, 180))


def test_pods_reach_each_other_across_nodes_and_the_tests(kube: KubeCluster) -> None:
    """The pod network: a Pod on node 2 connects to a Pod on node 1 by its Pod IP, and a
    Pod connects to a socket of this test process on the gateway address."""
    server = f"server-{uuid.uuid4().hex[:6]}"
    server_pod = _pod(server, "echo pong | nc -l -p 7000", 0)
    server_pod["spec"]["nodeName"] = "k8s-node1"
    server_path = _create(kube, server_pod)
    ip = wait_for("the server pod's IP", lambda: kube.get(server_path)["status"].get("podIP"), 120)
    assert ip.startswith("10.232.")
    # Retried: the server may not listen yet when the client first connects.
    client = _run_to_end(
        kube,
        f"client-{uuid.uuid4().hex[:6]}",
        f"for i in $(seq 60); do nc {ip} 7000 && exit 0; sleep 1; done; exit 1",
        "k8s-node2",
    )
    assert client["status"]["phase"] == "Succeeded"
    log = kube.api.get(f"/api/v1/namespaces/default/pods/{client['metadata']['name']}/log")
    assert log.text == "pong\n"

    with socket.socket() as listener:
        listener.bind((kube.vc.gateway_ip, 0))
        listener.listen(1)
        listener.settimeout(120)
        port = listener.getsockname()[1]
        name = f"caller-{uuid.uuid4().hex[:6]}"
        pod = _pod(name, f"echo hello from $(hostname) | nc {kube.vc.gateway_ip} {port}", 0)
        _create(kube, pod)
        conn, (peer, _) = listener.accept()
        with conn:
            conn.settimeout(60)
            assert conn.recv(100) == f"hello from {name}\n".encode()
        assert peer.startswith("10.232.")  # the Pod's own address: no masquerading


def test_a_restarted_kubelet_gets_its_gpus_back(kube: KubeCluster) -> None:
    """A kubelet started again removes the device plugins' sockets; the fake plugin
    registers again and the node's GPUs can be given to a Pod again."""
    plugin_log = kube.logs / "k8s-node2-fakegpu.log"
    registered_before = plugin_log.read_text().count("registered 2 x")
    old_kubelet = kube.nodes["k8s-node2"].kubelet
    kube.stop_kubelet("k8s-node2")
    kube.start_kubelet("k8s-node2")
    assert kube.nodes["k8s-node2"].kubelet is not old_kubelet
    # Until the plugin has registered again the kubelet has no GPU to give: a Pod bound to
    # the node then fails admission (Kubernetes' own behaviour, not this test's to hide).
    wait_for(
        "the fake GPU plugin registered with the new kubelet",
        lambda: plugin_log.read_text().count("registered 2 x") > registered_before,
        120,
    )
    pod = _run_to_end(
        kube, f"again-{uuid.uuid4().hex[:6]}", "echo $NVIDIA_VISIBLE_DEVICES", "k8s-node2", 1
    )
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    log = kube.api.get(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/log")
    assert re.fullmatch("GPU-k8s-node2-[01]\n", log.text), log.text
