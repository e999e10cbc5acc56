"""A Kubernetes partition's Node that goes away (its kubelet killed, as a machine that
dies): its job is requeued by mgpu's rules (a retry spent) and runs again on the other
Node, and its Pod, stuck Terminating on a Node nobody answers for, is force-deleted once
its grace is past: nothing held for ever.  Its own cluster: it leaves a Node dead."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import LocalCluster
from kubecluster import IMAGE_BUSYBOX, KubeCluster, wait_for
from mgpu import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a real Kubernetes)")


@pytest.fixture(scope="module")
def master(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = f"""
cluster: {{name: lost}}
networking: {{timeout: 10}}
scheduling: {{kill_grace: 2, retry_backoff_base: 0}}
partitions:
  - name: k8s
    kubernetes:
      kubeconfig: {kube.kubeconfig}
      image: {IMAGE_BUSYBOX}
      force_delete_after: 3
"""
    cluster = LocalCluster(tmp_path_factory.mktemp("kmaster"), config)
    try:
        cluster.start_master()
        wait_for(
            "both Nodes online",
            lambda: len([n for n in cluster.client().nodes() if n["state"] == "online"]) == 2,
            120,
        )
        yield cluster
    finally:
        cluster.stop()


def test_a_lost_node_requeues_its_job_and_its_stuck_pod_is_force_deleted(
    master: LocalCluster, kube: KubeCluster
) -> None:
    nobody = Client(master.address, token=master.client().create_token("nobody")["token"])
    job_id = nobody.submit("echo run; sleep 25", gpus=2, env={"PATH": "/bin"}).id

    def first_run() -> dict[str, Any] | None:
        job = nobody.show(job_id)
        return job if job["state"] == "running" and nobody.logs(job_id) == "run\n" else None

    lost = wait_for("the job's first run", first_run, 120)["pods"][0]["node"]
    first_pod = f"mgpu-lost-{job_id}-1-0"
    kube.stop_kubelet(lost)
    job = nobody.wait(job_id, timeout=240)
    assert job["state"] == "completed", job
    assert job["retries"] == 1 and len(job["attempts"]) == 2  # mgpu's rule: a retry spent
    assert job["attempts"][0]["end_reason"] == f"node {lost} lost"
    assert job["pods"][0]["node"] != lost
    assert nobody.logs(job_id) == "run\nrun\n"
    # Its first Pod could not stop (no kubelet): force-deleted past its grace.
    path = f"/api/v1/namespaces/default/pods/{first_pod}"
    wait_for("the first pod gone", lambda: kube.api.get(path).status_code == 404, 60)
    node = next(n for n in nobody.nodes() if n["node_id"] == lost)
    assert node["state"] == "offline" and not node["connected"]
