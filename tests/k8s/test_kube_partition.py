"""A partition backed by a real Kubernetes 1.20 (tests/kubecluster.py): mgpu decides when,
Kubernetes where.  One cluster and one master for the module; the master's restart comes
last.

Jobs run as Pods with their environment, user and exit code; GPUs another workload's Pod
holds are not given; a Pod Kubernetes cannot place sends its job back to the queue with
Kubernetes' own sentence, and it starts once there is room; cancel, time limit, a real
memory limit (OUT_OF_MEMORY), an image that cannot be pulled, a job of root, `mgpu logs
-f`, and a master killed mid-job that finds its Pod again (nothing run twice) and deletes
a Pod of mgpu's for a job it does not know."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster
from kubecluster import GPU_RESOURCE, IMAGE_BUSYBOX, KubeCluster, wait_for
from kubemaster import job_pods as _pods
from kubemaster import kube_master
from mgpu import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a real Kubernetes)")

ROOM_LABEL = "mgpu-test/room"
ENV = {"PATH": "/bin:/usr/bin"}


def _config(kube: KubeCluster) -> str:
    return f"""
cluster: {{name: lab}}
networking: {{timeout: 20}}
scheduling: {{kill_grace: 2}}
partitions:
  - name: k8s
    default: true
    kubernetes:
      kubeconfig: {kube.kubeconfig}
      namespace: default
      image: {IMAGE_BUSYBOX}
      unschedulable_timeout: 8
      image_pull_timeout: 8
      requeue_backoff: 1
      force_delete_after: 5
      pod_template:
        spec:
          nodeSelector: {{"{ROOM_LABEL}": "yes"}}
          containers:
            - name: main
              workingDir: /tmp
"""


def _label(kube: KubeCluster, node: str, value: str | None) -> None:
    patch = {"metadata": {"labels": {ROOM_LABEL: value}}}
    resp = kube.api.patch(
        f"/api/v1/nodes/{node}",
        json=patch,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text


@pytest.fixture(scope="module")
def master(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    for node in kube.nodes:
        _label(kube, node, "yes")
    with kube_master(tmp_path_factory.mktemp("kmaster"), _config(kube)) as cluster:
        yield cluster


def _running(client: Client, job_id: str, timeout: float = 120) -> dict[str, Any]:
    def started() -> dict[str, Any] | None:
        job = client.show(job_id)
        assert job["state"] in ("queued", "running"), job
        return job if job["state"] == "running" and job.get("start_time") else None

    return wait_for(f"job {job_id} running", started, timeout)


def test_a_template_the_api_server_refuses_stops_the_master(
    kube: KubeCluster, tmp_path: Path
) -> None:
    workdir = "              workingDir: /tmp\n"
    mount = "              volumeMounts: [{name: nas, mountPath: /n}]\n"
    bad = _config(kube).replace(workdir, workdir + mount)
    (tmp_path / "c.yaml").write_text(bad)
    argv = [str(BIN / "mgpu"), "master", "--config", str(tmp_path / "c.yaml")]
    argv += ["--state-dir", str(tmp_path / "state"), "--port", "0"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert (
        "partition k8s: the pod template is refused: spec.containers[0].volumeMounts[0].name:"
        ' Not found: "nas".'
    ) in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "state").exists()  # stopped before anything was made


def test_the_nodes_are_the_partitions_nodes(master: LocalCluster, kube: KubeCluster) -> None:
    nodes = {n["node_id"]: n for n in master.client().nodes()}
    assert set(nodes) == set(kube.nodes)
    for node in nodes.values():
        assert node["partition"] == "k8s" and node["kubernetes"] is True
        assert len(node["gpus"]) == 2 and node["gpu_source"] == "kubernetes"
        assert node["cpus"] and node["mem_mb"]
    parts = master.client()._request("GET", "/api/partitions")["partitions"]
    assert parts[0]["name"] == "k8s" and sorted(parts[0]["nodes"]) == sorted(kube.nodes)


def test_a_job_runs_as_a_pod_as_its_user_with_its_environment(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str
) -> None:
    command = 'id -u; id -g; echo "job=$MGPU_JOB_ID gpus=$NVIDIA_VISIBLE_DEVICES"; pwd; exit 3'
    job_id = nobody.submit(command, gpus=1, env=ENV).id
    job = nobody.wait(job_id, timeout=150)
    assert job["state"] == "failed" and job["exit_code"] == 3, job
    assert job["end_reason"] == "exit"
    uid, gid, line, cwd = nobody.logs(job_id).splitlines()
    assert (uid, gid) == ("65534", "65534")
    node = job["pods"][0]["node"]
    assert node in kube.nodes and job["allocation"][0]["hostname"] == node
    # The device plugin gave the Pod one of its node's GPUs, as mgpu asked.
    assert line.startswith(f"job={job_id} gpus=GPU-{node}-"), line
    assert cwd == "/tmp"  # the template's working directory
    assert job["pods"][0]["name"] == f"mgpu-lab-{job_id}-1-0"
    shown = subprocess.run(
        [str(BIN / "mgpu"), "show", job_id],
        env={**master.env, "MGPU_TOKEN": nobody_token},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert f"pod:        mgpu-lab-{job_id}-1-0  node {node}  " in shown, shown
    # Its Pod is deleted once its end and output are stored.
    wait_for("the job's pod gone", lambda: not _pods(kube, f"mgpu.io/job={job_id}"), 60)


def test_a_batch_script_runs_with_slurms_variables(master: LocalCluster, nobody: Client) -> None:
    script = (
        "#!/bin/sh\n"
        'echo "id=$SLURM_JOB_ID part=$SLURM_JOB_PARTITION gpus=$SLURM_GPUS_ON_NODE"\n'
        'echo "args=$*"\n'
    )
    slurm = {"batch": True, "partition": "k8s", "job_name_default": "job.sh", "submit_dir": "/"}
    job_id = nobody.submit_script(
        script, args=["a", "b"], name="job.sh", gpus=2, env=ENV, slurm=slurm
    ).id
    job = nobody.wait(job_id, timeout=150)
    assert job["state"] == "completed", job
    assert nobody.logs(job_id) == f"id={job_id} part=k8s gpus=2\nargs=a b\n"


def test_the_jobs_credential_and_script_are_in_its_pods_secret(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    """Whoever may read the namespace's Pods sees neither the job's credential (it acts as
    the job's user) nor its script: they are in the Pod's Secret, which the job still
    reads, and which Kubernetes deletes with the Pod."""
    script = '#!/bin/sh\n# the-private-part\necho "token=${#MGPU_TOKEN}"\nsleep 300\n'
    slurm = {"batch": True, "partition": "k8s", "job_name_default": "s.sh", "submit_dir": "/"}
    job_id = nobody.submit_script(script, name="s.sh", env=ENV, slurm=slurm).id
    _running(nobody, job_id)
    wait_for("the job's output", lambda: nobody.logs(job_id).startswith("token="), 90)
    assert nobody.logs(job_id) != "token=0\n"  # the job has its credential
    [pod] = _pods(kube, f"mgpu.io/job={job_id}")
    assert "the-private-part" not in str(pod) and "mgpujob_" not in str(pod)
    name = pod["metadata"]["name"]
    secret = kube.get(f"/api/v1/namespaces/default/secrets/{name}")
    assert set(secret["data"]) == {"MGPU_TOKEN", "MGPU_BATCH_SCRIPT"}
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", name, pod["metadata"]["uid"])
    nobody.cancel(job_id)
    assert nobody.wait(job_id, timeout=60)["state"] == "cancelled"

    def secret_gone() -> bool:
        names = kube.get("/api/v1/namespaces/default/secrets")["items"]
        return name not in [s["metadata"]["name"] for s in names]

    wait_for("the pod's secret deleted with it", secret_gone, 90)


def test_a_job_of_root_does_not_run_as_root(master: LocalCluster) -> None:
    job = master.client().submit("id -u", env=ENV)
    ended = master.client().wait(job.id, timeout=120)
    assert ended["state"] == "failed", ended
    assert "jobs do not run as root on Kubernetes partition k8s" in ended["reason"]


def test_gpus_another_workload_holds_are_not_given(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    name = f"other-{uuid.uuid4().hex[:6]}"
    other = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": "k8s-node1",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE_BUSYBOX,
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {GPU_RESOURCE: 2}},
                }
            ],
        },
    }
    resp = kube.api.post("/api/v1/namespaces/default/pods", json=other)
    assert resp.status_code == 201, resp.text
    try:

        def blocked() -> dict[str, Any] | None:
            node = next(n for n in master.client().nodes() if n["node_id"] == "k8s-node1")
            held = [g for g in node["gpus"] if g["foreign_blocked"]]
            return node if len(held) == 2 else None

        node1 = wait_for("k8s-node1's GPUs held by the other Pod", blocked, 60)
        assert [p["name"] for p in node1["pods"]] == [f"default/{name}"]
        first = nobody.submit("sleep 6", gpus=2, env=ENV).id
        second = nobody.submit("echo second", gpus=2, env=ENV).id
        assert _running(nobody, first)["allocation"][0]["node_id"] == "k8s-node2"
        time.sleep(2)  # not a sync: a window in which the second must not start
        assert nobody.show(second)["state"] == "queued"
        assert nobody.wait(first, timeout=60)["state"] == "completed"
        done = nobody.wait(second, timeout=90)
        assert done["state"] == "completed" and done["allocation"][0]["node_id"] == "k8s-node2"
    finally:
        kube.api.delete(f"/api/v1/namespaces/default/pods/{name}", params={"gracePeriodSeconds": 0})


def test_a_pod_kubernetes_cannot_place_goes_back_to_the_queue(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    for node in kube.nodes:  # the template's nodeSelector now matches no Node
        _label(kube, node, "no")
    try:
        job_id = nobody.submit("echo placed", gpus=1, env=ENV).id

        def requeued() -> dict[str, Any] | None:
            job = nobody.show(job_id)
            return job if job["state"] == "queued" and job["restart_count"] >= 1 else None

        job = wait_for("the job back in the queue", requeued, 120)
        assert job["end_reason"] == "no_room" and job["retries"] == 0
        why = job["attempts"][0]["end_reason"]  # the waiting reason is the backoff's now
        assert why.startswith("Kubernetes has no room: 0/2 nodes are available"), why
        assert "2 node(s) didn't match" in why  # the template's nodeSelector
        assert not _pods(kube, f"mgpu.io/job={job_id}")  # nothing held meanwhile
        assert all(n["state"] == "online" for n in nobody.nodes())  # no node blamed
    finally:
        for node in kube.nodes:
            _label(kube, node, "yes")
    done = nobody.wait(job_id, timeout=150)
    assert done["state"] == "completed" and nobody.logs(job_id) == "placed\n"


def test_a_job_on_two_nodes_is_all_its_pods_or_none(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    _label(kube, "k8s-node2", "no")  # room for one of its two Pods only
    try:
        command = "sleep 12; echo rank $MGPU_NODE_RANK"  # the placed one still runs when sent back
        job_id = nobody.submit(command, nodes=2, gpus_per_node=1, env=ENV).id

        def requeued() -> dict[str, Any] | None:
            job = nobody.show(job_id)
            return job if job["state"] == "queued" and job["restart_count"] >= 1 else None

        job = wait_for("the job back in the queue", requeued, 120)
        assert job["end_reason"] == "no_room", job
        # Its Pod that was placed is not left holding a GPU.
        wait_for("no pod of the job", lambda: not _pods(kube, f"mgpu.io/job={job_id}"), 60)
    finally:
        _label(kube, "k8s-node2", "yes")
    done = nobody.wait(job_id, timeout=150)
    assert done["state"] == "completed", done
    assert sorted(p["node"] for p in done["pods"]) == ["k8s-node1", "k8s-node2"]
    assert sorted(nobody.logs(job_id).splitlines()) == ["rank 0", "rank 1"]


def test_cancel_deletes_the_pod(master: LocalCluster, kube: KubeCluster, nobody: Client) -> None:
    job_id = nobody.submit("echo up; sleep 300", env=ENV).id
    _running(nobody, job_id)
    wait_for("the job's output", lambda: nobody.logs(job_id) == "up\n", 60)
    nobody.cancel(job_id)
    job = nobody.wait(job_id, timeout=60)
    assert job["state"] == "cancelled", job
    wait_for("the job's pod gone", lambda: not _pods(kube, f"mgpu.io/job={job_id}"), 60)


def test_time_limit(master: LocalCluster, nobody: Client) -> None:
    job = nobody.wait(nobody.submit("sleep 300", time="0:04", env=ENV).id, timeout=120)
    assert job["state"] == "timeout" and job["end_reason"] == "timeout", job


def test_a_job_past_its_memory_limit_is_out_of_memory(master: LocalCluster, nobody: Client) -> None:
    # busybox's tail keeps a line without end: it grows until the cgroup's limit kills it.
    job_id = nobody.submit("head -c 400m /dev/zero | tail", mem="32M", env=ENV).id
    job = nobody.wait(job_id, timeout=120)
    assert job["state"] == "failed" and job["end_reason"] == "out_of_memory", job
    assert job["mem_mb"] == 32


def test_an_image_that_cannot_be_pulled_fails_the_job(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    job_id = nobody.submit("true", image="mgpu.test/absent:1", env=ENV).id
    job = nobody.wait(job_id, timeout=120)
    assert job["state"] == "failed", job
    assert "the image mgpu.test/absent:1 cannot be pulled" in job["reason"]
    wait_for("the job's pod gone", lambda: not _pods(kube, f"mgpu.io/job={job_id}"), 60)


def test_logs_follow_a_pod(master: LocalCluster, nobody: Client, nobody_token: str) -> None:
    job_id = nobody.submit("for i in 1 2 3 4 5; do echo line $i; sleep 1; done", env=ENV).id
    _running(nobody, job_id)
    out = subprocess.run(
        [str(BIN / "mgpu"), "logs", "-f", job_id],
        env={**master.env, "MGPU_TOKEN": nobody_token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(f"line {i}\n" for i in range(1, 6))


def test_a_restarted_master_finds_its_pod_again(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    job_id = nobody.submit("echo start; sleep 15; echo end", env=ENV).id
    _running(nobody, job_id)
    wait_for("the job's first line", lambda: nobody.logs(job_id) == "start\n", 60)
    # A Pod of mgpu's for a job this master never had: deleted once it is back.
    stray = f"mgpu-lab-{uuid.uuid4().hex[:6]}-1-0"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": stray,
            "labels": {"mgpu.io/cluster": "lab", "mgpu.io/job": "999999", "mgpu.io/epoch": "1",
                       "mgpu.io/rank": "0"},
            "annotations": {"mgpu.io/job-id": "999999", "mgpu.io/node": "k8s-node1"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "job", "image": IMAGE_BUSYBOX, "command": ["sleep", "600"]}],
        },
    }  # fmt: skip
    assert master.master is not None
    master.master.send_signal(signal.SIGKILL)
    master.master.wait(timeout=30)
    resp = kube.api.post("/api/v1/namespaces/default/pods", json=pod)
    assert resp.status_code == 201, resp.text
    master.start_master()
    job = nobody.wait(job_id, timeout=150)
    assert job["state"] == "completed", job
    assert nobody.logs(job_id) == "start\nend\n"  # once each: not run again, nothing repeated
    assert len(job["attempts"]) == 1 and job["restart_count"] == 0
    wait_for(
        "the stray pod deleted",
        lambda: kube.api.get(f"/api/v1/namespaces/default/pods/{stray}").status_code == 404,
        60,
    )
