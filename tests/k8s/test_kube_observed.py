"""A Kubernetes-backed partition seen and used from outside (issue 33): `/metrics`, the
dashboard and `mgpu nodes` name who holds each Node's GPUs (an mgpu job's Pod, another
workload's Pod); a batch job's -o file is written in its Pod, on the template's volume,
with what its log has; an allocation there is refused with one sentence; and a master
whose RBAC is narrowed says so in one line and starts once it is allowed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster
from kubecluster import GPU_RESOURCE, IMAGE_BUSYBOX, KubeCluster, wait_for
from kubemaster import kube_master
from mgpu import Client
from mgpu.errors import MgpuError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a real Kubernetes)")

ENV = {"PATH": "/bin:/usr/bin"}


def _config(kube: KubeCluster, shared: Path, name: str = "lab", kubeconfig: str = "") -> str:
    return f"""
cluster: {{name: {name}}}
networking: {{timeout: 20}}
scheduling: {{kill_grace: 2}}
partitions:
  - name: k8s
    default: true
    kubernetes:
      kubeconfig: {kubeconfig or kube.kubeconfig}
      namespace: default
      image: {IMAGE_BUSYBOX}
      pod_template:
        spec:
          volumes: [{{name: shared, hostPath: {{path: {shared}}}}}]
          containers:
            - name: main
              workingDir: /tmp
              volumeMounts: [{{name: shared, mountPath: {shared}}}]
"""


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A directory every Node sees (the nodes share this machine's filesystem), writable
    by the jobs' user: the lab's NAS in the template."""
    path = Path(tempfile.mkdtemp(prefix="mgpu-nas-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def master(
    kube: KubeCluster, shared: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with kube_master(tmp_path_factory.mktemp("kmaster"), _config(kube, shared)) as cluster:
        yield cluster


def _other_pod(kube: KubeCluster, node: str, gpus: int) -> str:
    name = f"other-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": IMAGE_BUSYBOX, "command": ["sleep", "3600"],
                            "resources": {"limits": {GPU_RESOURCE: gpus}}}],
        },
    }  # fmt: skip
    resp = kube.api.post("/api/v1/namespaces/default/pods", json=pod)
    assert resp.status_code == 201, resp.text
    return name


def test_metrics_dashboard_and_nodes_say_who_holds_the_gpus(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    other = _other_pod(kube, "k8s-node1", 1)
    try:
        job_id = nobody.submit("sleep 300", gpus=1, nodelist=["k8s-node1"], env=ENV).id
        wait_for(f"job {job_id} running", lambda: nobody.show(job_id)["state"] == "running", 120)
        pod = f"mgpu-lab-{job_id}-1-0"

        def metrics() -> str | None:
            text = urllib.request.urlopen(f"http://{master.address}/metrics", timeout=10)
            text = text.read().decode()
            wanted = [
                'mgpu_kubernetes_node{node="k8s-node1",partition="k8s"} 1.0',
                'mgpu_kubernetes_gpus{holder="mgpu",node="k8s-node1"} 1.0',
                'mgpu_kubernetes_gpus{holder="others",node="k8s-node1"} 1.0',
                'mgpu_kubernetes_gpus{holder="free",node="k8s-node1"} 0.0',
                f'mgpu_kubernetes_pod_gpus{{job="{job_id}",node="k8s-node1",pod="{pod}"}} 1.0',
                f'mgpu_kubernetes_pod_gpus{{job="",node="k8s-node1",pod="default/{other}"}} 1.0',
            ]
            return text if all(w in text for w in wanted) else None

        wait_for("the holders in /metrics", metrics, 60)
        overview = master.client()._request("GET", "/api/dashboard/overview")
        card = next(d for d in overview["details"] if d["node_id"] == "k8s-node1")
        assert [(h["kind"], h["job"], h["pod"], h["gpus"]) for h in card["gpu_holders"]] == [
            ("job", job_id, pod, 1), ("pod", None, f"default/{other}", 1)
        ]  # fmt: skip
        shown = subprocess.run(
            [str(BIN / "mgpu"), "nodes"], env={**master.env, "MGPU_TOKEN": nobody_token},
            capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        row = next(line for line in shown.splitlines() if line.startswith("k8s-node1"))
        assert f"pod default/{other} holds 1 GPU (" in row, shown  # (its phase)
        nobody.cancel(job_id)
        nobody.wait(job_id, timeout=60)
    finally:
        kube.api.delete(
            f"/api/v1/namespaces/default/pods/{other}", params={"gracePeriodSeconds": 0}
        )


def test_a_batch_jobs_output_file_is_written_in_its_pod(
    master: LocalCluster, nobody: Client, shared: Path
) -> None:
    script = "#!/bin/sh\nfor i in 1 2 3 4 5; do echo line $i; echo warn $i >&2; done\nexit 4\n"
    slurm = {"batch": True, "partition": "k8s", "job_name_default": "job.sh",
             "submit_dir": str(shared), "output": "out-%j.txt"}  # fmt: skip
    job_id = nobody.submit_script(script, name="job.sh", env=ENV, slurm=slurm, cwd=str(shared)).id
    job = nobody.wait(job_id, timeout=150)
    assert job["state"] == "failed" and job["exit_code"] == 4, job
    written = (shared / f"out-{job_id}.txt").read_text()
    assert sorted(written.splitlines()) == sorted(
        [f"line {i}" for i in range(1, 6)] + [f"warn {i}" for i in range(1, 6)]
    )
    assert written == nobody.logs(job_id)  # the same bytes, none lost or repeated
    assert (shared / f"out-{job_id}.txt").stat().st_uid == 65534  # the job's user wrote it


def test_an_allocation_is_refused_with_one_sentence(master: LocalCluster, nobody: Client) -> None:
    with pytest.raises(MgpuError) as refused:
        nobody.submit("true", allocation=True, env=ENV)
    assert "partition k8s runs jobs as Kubernetes Pods and holds no allocation" in str(
        refused.value
    )


RBAC_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
    "metadata": {"name": "mgpu-jobs", "namespace": "default"},
    "rules": [{"apiGroups": [""], "resources": ["pods"],
               "verbs": ["create", "get", "list", "watch", "delete"]},
              {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
              {"apiGroups": [""], "resources": ["secrets"],
               "verbs": ["create", "list", "patch", "delete"]}],
}  # fmt: skip
NOBODY = [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "mgpu-test-nobody"}]


def _post(kube: KubeCluster, path: str, body: dict[str, Any]) -> None:
    resp = kube.api.post(path, json=body)
    assert resp.status_code == 201, resp.text


def test_a_narrowed_rbac_is_one_sentence_until_allowed(
    kube: KubeCluster, shared: Path, tmp_path: Path
) -> None:
    """The master's account may make Pods in its namespace but not read Nodes and Pods
    cluster-wide: its watches are refused, one line each in its log, no traceback; once the
    ClusterRole is bound its Nodes join and a job runs."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    _post(kube, f"{rbac}/namespaces/default/roles", RBAC_ROLE)
    _post(kube, f"{rbac}/namespaces/default/rolebindings", {
        "metadata": {"name": "mgpu-jobs", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mgpu-jobs"},
        "subjects": NOBODY})  # fmt: skip
    config = _config(kube, shared, name="rbac", kubeconfig=str(kube.nobody_kubeconfig))
    cluster = LocalCluster(tmp_path, config)
    try:
        cluster.start_master()
        log = cluster.root / "master.log"
        wait_for(
            "the refusals in the master's log",
            lambda: (
                "Kubernetes refused to watch nodes: nodes is forbidden" in log.read_text()
                and "Kubernetes refused to watch pods: pods is forbidden" in log.read_text()
            ),
            90,
        )
        assert not cluster.client().nodes()
        _post(kube, f"{rbac}/clusterroles", {
            "metadata": {"name": "mgpu-read"},
            "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"],
                       "verbs": ["get", "list", "watch"]}]})  # fmt: skip
        _post(kube, f"{rbac}/clusterrolebindings", {
            "metadata": {"name": "mgpu-read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "mgpu-read"},
            "subjects": NOBODY})  # fmt: skip
        wait_for("both Nodes joined", lambda: len(cluster.client().nodes()) == 2, 90)
        client = cluster.client()
        token = client.create_token("nobody")["token"]
        nobody = Client(cluster.address, token=token)
        job = nobody.wait(nobody.submit("echo allowed", env=ENV).id, timeout=150)
        assert job["state"] == "completed" and nobody.logs(job["id"]) == "allowed\n", job
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
    finally:
        cluster.stop()


def test_an_output_file_that_cannot_be_opened_fails_the_job_with_slurms_sentence(
    master: LocalCluster, nobody: Client, shared: Path
) -> None:
    """`-o` in a directory that does not exist: the runner ends with 53 and Slurm's
    sentence, and the job fails with that sentence as its reason, the script never run."""
    script = "#!/bin/sh\necho the-script-ran\n"
    slurm = {"batch": True, "partition": "k8s", "job_name_default": "job.sh",
             "submit_dir": str(shared), "output": "no-such-dir/out-%j.txt"}  # fmt: skip
    job_id = nobody.submit_script(script, name="job.sh", env=ENV, slurm=slurm, cwd=str(shared)).id
    job = nobody.wait(job_id, timeout=150)
    assert job["state"] == "failed", job
    path = f"{shared}/no-such-dir/out-{job_id}.txt"
    assert f"Could not open stdout file {path}: No such file or directory" in job["reason"], job
    assert "the-script-ran" not in nobody.logs(job_id)
