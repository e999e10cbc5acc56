"""A job on several Pods of a real Kubernetes 1.20 (tests/kubecluster.py): a 2-node
torchrun with a gloo all-reduce across Pods on two kubelets, meeting at the rank-0 Pod's
address, followed by `mgpu logs -f`; and a batch job on two nodes that is two Pods (its
held slot's Pod holds its GPU in Kubernetes too), all deleted when it ends.

The Pods' image is a static busybox: the test's own Python and torch (the venv, its base
interpreter and the machine's C libraries) reach them as hostPath volumes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster
from kubecluster import IMAGE_BUSYBOX, KubeCluster, wait_for
from kubemaster import host_volumes, job_pods, kube_master
from mgpu import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a real Kubernetes)")

ENV = {"PATH": "/bin:/usr/bin", "HOME": "/tmp", "GLOO_SOCKET_IFNAME": "eth0"}
ALLREDUCE = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank} of {size} sum {total.item():g} at {os.environ['MGPU_POD_IP']}", flush=True)
dist.destroy_process_group()
"""


def _config(kube: KubeCluster, code: Path) -> str:
    volumes, volume_mounts = host_volumes([code])
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
      unschedulable_timeout: 30
      requeue_backoff: 1
      pod_template:
        spec:
          volumes: [{volumes}]
          containers:
            - name: main
              workingDir: /tmp
              volumeMounts: [{volume_mounts}]
"""


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("gangcode")
    where.chmod(0o755)  # read by the Pods' user, through its hostPath
    (where / "allreduce.py").write_text(ALLREDUCE)
    (where / "allreduce.py").chmod(0o644)
    return where


@pytest.fixture(scope="module")
def master(
    kube: KubeCluster, code: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with kube_master(tmp_path_factory.mktemp("kmaster"), _config(kube, code)) as cluster:
        yield cluster


def _pods(kube: KubeCluster, job_id: str) -> list[dict[str, Any]]:
    return job_pods(kube, f"mgpu.io/job={job_id}")


def test_torchrun_all_reduces_across_two_pods(
    master: LocalCluster, kube: KubeCluster, nobody: Client, nobody_token: str, code: Path
) -> None:
    torchrun = f"{sys.prefix}/bin/torchrun"
    if not os.access(torchrun, os.X_OK):
        pytest.skip("no torchrun in this venv (make test installs torch)")
    command = f"{torchrun} {code}/allreduce.py"  # its flags from mgpu's PET_* variables
    job_id = nobody.submit(command, nodes=2, gpus_per_node=1, env=ENV).id
    wait_for("the job running", lambda: nobody.show(job_id)["state"] != "queued", 120)
    follow = subprocess.run(
        [str(BIN / "mgpu"), "logs", "-f", job_id],
        env={**master.env, "MGPU_TOKEN": nobody_token},
        capture_output=True,
        text=True,
        timeout=300,
    )
    job = nobody.wait(job_id, timeout=120)
    assert job["state"] == "completed", (job, nobody.logs(job_id))
    assert follow.returncode == 0, follow.stderr
    stored = subprocess.run(
        [str(BIN / "mgpu"), "logs", job_id],
        env={**master.env, "MGPU_TOKEN": nobody_token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert follow.stdout == stored.stdout  # followed: no line lost or repeated
    # Lines of a job on several nodes are shown with their node: one line from each Pod.
    lines = sorted(x.split("] ", 1)[1] for x in follow.stdout.splitlines() if "] rank " in x)
    assert [x.split(" at ")[0] for x in lines] == ["rank 0 of 2 sum 3", "rank 1 of 2 sum 3"]
    addresses = {x.split(" at ")[1] for x in lines}
    assert len(addresses) == 2 and all(a.startswith("10.232.") for a in addresses), lines
    assert sorted(s["hostname"] for s in job["allocation"]) == sorted(kube.nodes)


def test_a_batch_job_on_two_nodes_is_two_pods(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    script = '#!/bin/sh\necho "nodes=$SLURM_JOB_NUM_NODES"\nsleep 10\necho done\n'
    slurm = {"batch": True, "partition": "k8s", "job_name_default": "job.sh", "submit_dir": "/"}
    job_id = nobody.submit_script(
        script, name="job.sh", nodes=2, gpus_per_node=1, env=ENV, slurm=slurm
    ).id

    def both() -> list[dict[str, Any]] | None:
        pods = _pods(kube, job_id)
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return pods if len(running) == 2 else None

    pods = wait_for("the job's two pods running", both, 120)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(kube.nodes)
    held = [p for p in pods if p["metadata"]["annotations"].get("mgpu.io/holds") == "true"]
    assert len(held) == 1 and held[0]["metadata"]["labels"]["mgpu.io/rank"] == "1"
    limits = held[0]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"  # Kubernetes holds what mgpu's ledger holds
    # The held Pod is the ledger's, not another workload's: no GPU counted twice.
    for node in nobody.nodes():
        assert not [g for g in node["gpus"] if g["foreign_blocked"]], node
    job = nobody.wait(job_id, timeout=120)
    assert job["state"] == "completed", job
    assert nobody.logs(job_id) == "nodes=2\ndone\n"  # the script ran once, on rank 0
    wait_for("the job's pods gone", lambda: not _pods(kube, job_id), 60)


def test_a_gang_whose_rank0_fails_at_once_ends(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    """Rank 0 fails before rank 1's Pod is made (rank 1 waits for rank 0's address): the
    master's kill reaches rank 1 while it waits, and the job ends failed, no Pod left;
    it once stayed running for ever."""
    job_id = nobody.submit("exit 3", nodes=2, gpus_per_node=1, env=ENV).id
    job = nobody.wait(job_id, timeout=180)
    assert job["state"] == "failed" and job["exit_code"] == 3, job
    wait_for("the job's pods gone", lambda: not _pods(kube, job_id), 60)
