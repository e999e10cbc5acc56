"""Jobs through mgpu on a Kubernetes partition, beside Pods made directly (issue 33).

On the test Kubernetes of tests/kubecluster.py (2 kubelets, 2 fake GPUs each; built by
scripts/k8s/build.sh), N short jobs are submitted at once through mgpu to a Kubernetes
partition, then N Pods of the same command are created directly through the API server.
Both are watched the same way (a list every 0.2 s): submit (or create) → first seen
running, its p50 and p95, and the jobs (Pods) started per second from the first submit
to the last start.  Needs root.  Prints a summary and writes bench/results/kubernetes.json.

    python bench/kubernetes.py [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kubecluster import IMAGE_BUSYBOX, KubeCluster, build
from mgpu import Client
from mgpu.testing import LocalCluster, wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "kubernetes.json"
COMMAND = "sleep 3"
POLL = 0.2


def _config(kube: KubeCluster) -> str:
    return f"""
cluster: {{name: bench}}
partitions:
  - name: k8s
    default: true
    kubernetes: {{kubeconfig: {kube.kubeconfig}, namespace: default, image: {IMAGE_BUSYBOX}}}
"""


def _figures(submitted: dict[str, float], started: dict[str, float]) -> dict[str, float]:
    waits = sorted(started[k] - submitted[k] for k in started)
    span = max(started.values()) - min(submitted.values())
    return {
        "jobs": len(started),
        "p50_s": round(statistics.median(waits), 3),
        "p95_s": round(waits[min(len(waits) - 1, int(0.95 * len(waits)))], 3),
        "started_per_s": round(len(started) / span, 2),
    }


def _watch(submitted: dict[str, float], running: Callable[[], set[str]]) -> dict[str, float]:
    started: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while len(started) < len(submitted) and time.monotonic() < deadline:
        now = time.monotonic()
        for key in running() - set(started):
            started[key] = now
        time.sleep(POLL)
    return started


def through_mgpu(kube: KubeCluster, jobs: int, root: Path) -> dict[str, float]:
    cluster = LocalCluster(root, _config(kube))
    try:
        cluster.start_master()
        admin = cluster.client()
        wait_for(lambda: len([n for n in admin.nodes() if n.get("kubernetes")]) == 2, 120)
        token = str(admin.create_token("nobody")["token"])
        client = Client(cluster.address, token=token)
        submitted: dict[str, float] = {}
        for _ in range(jobs):
            t = time.monotonic()
            submitted[client.submit(COMMAND, env={"PATH": "/bin"}).id] = t

        def running() -> set[str]:
            return {
                j["id"]
                for j in (client.show(i) for i in submitted)
                if j["state"] != "queued" and j.get("start_time")
            }

        started = _watch(submitted, running)
        for job_id in submitted:
            client.wait(job_id, timeout=300)
        return _figures(submitted, started)
    finally:
        cluster.stop()


def direct(kube: KubeCluster, jobs: int) -> dict[str, float]:
    submitted: dict[str, float] = {}
    for i in range(jobs):
        name = f"bench-direct-{i}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"bench": "direct"}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "job", "image": IMAGE_BUSYBOX, "command": ["sh", "-c", COMMAND]}
                ],
            },
        }
        t = time.monotonic()
        resp = kube.api.post("/api/v1/namespaces/default/pods", json=pod)
        resp.raise_for_status()
        submitted[name] = t

    def running() -> set[str]:
        items = kube.get("/api/v1/namespaces/default/pods", labelSelector="bench=direct")
        phases = ("Running", "Succeeded", "Failed")
        return {p["metadata"]["name"] for p in items["items"] if p["status"].get("phase") in phases}

    started = _watch(submitted, running)
    for name in submitted:
        kube.api.delete(f"/api/v1/namespaces/default/pods/{name}")
    return _figures(submitted, started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    cache, why = build()
    if cache is None:
        print(f"no test Kubernetes here: {why}", file=sys.stderr)
        return 1
    with (
        tempfile.TemporaryDirectory(prefix="mgpu-bench-k8s-") as tmp,
        KubeCluster(cache, nodes=2, gpus_per_node=2) as kube,
    ):
        pods = direct(kube, args.jobs)
        mgpu = through_mgpu(kube, args.jobs, Path(tmp))
    result: dict[str, Any] = {"mgpu": mgpu, "direct_pods": pods, "command": COMMAND}
    for what, figures in (("through mgpu", mgpu), ("Pods directly", pods)):
        print(
            f"{what:14} {figures['jobs']:3d} jobs  submit→running p50 {figures['p50_s']:.2f} s"
            f"  p95 {figures['p95_s']:.2f} s  {figures['started_per_s']:.2f} started/s"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
