"""The standalone executable (`make dist`, PyInstaller) as a Pod's mgpu: a site puts it,
and a link named `srun` to it, in its image or on a volume (`kubernetes.steps.bin`), with
no Python in the image.  A batch script's `srun` steps then run through the frozen pod
agent, as with the test shims of test_kube_steps.py.  Skipped where PyInstaller is not
installed (the e2e tier's test of `make dist` skips there too)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_kube_steps import ENV, SLURM, pod_network_master

from helpers import LocalCluster, dist_dir
from kubecluster import KubeCluster, wait_for
from kubemaster import job_pods
from mgpu import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a real Kubernetes)")


@pytest.fixture(scope="module")
def frozen_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mgpu` as `make dist` builds it, with a link `srun`, in a directory of its own."""
    dist = dist_dir()
    where = tmp_path_factory.mktemp("frozenbin")
    where.chmod(0o755)
    shutil.copy2(dist / "mgpu", where / "mgpu")
    (where / "srun").symlink_to("mgpu")
    return where


@pytest.fixture(scope="module")
def master(
    kube: KubeCluster, frozen_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with pod_network_master(kube, frozen_bin, tmp_path_factory.mktemp("kdist")) as cluster:
        yield cluster


def test_a_step_runs_through_the_frozen_pod_agent(
    master: LocalCluster, kube: KubeCluster, nobody: Client
) -> None:
    script = '#!/bin/sh\nsrun sh -c \'echo "step in $(hostname)"; exit 6\'\necho "srun=$?"\n'
    job_id = nobody.submit_script(script, name="job.sh", gpus=1, env=ENV, slurm=SLURM).id
    [pod] = wait_for("the job's pod", lambda: job_pods(kube, f"mgpu.io/job={job_id}"), 120)
    job = nobody.wait(job_id, timeout=240)
    out = nobody.logs(job_id)
    log = (master.root / "master.log").read_text()[-3000:]
    assert job["state"] == "completed", (job, out, log)
    assert out.splitlines()[0] == f"step in {pod['metadata']['name']}", out
    assert out.splitlines()[-1] == "srun=6", out
