"""A Kubernetes partition's Pod template, checked against its API server at start.

A server-side dry run (`dryRun=All`) of the Pod a job would get: the API server validates
and admits it as it would a real one (schema, admission plugins, quotas) and stores
nothing.  Each problem is one sentence; a master whose template is refused does not start."""

from __future__ import annotations

from mgpu.config import ClusterConfig, Partition
from mgpu.kube import KubeClient, KubeError, KubeInvalid
from mgpu.master.kube.podspec import PodShape, build_pod, template_parts
from mgpu.protocol import Grant, Launch

__all__ = ["check_partitions", "sample_pod"]


def sample_pod(config: ClusterConfig, part: Partition) -> dict[str, object]:
    """The Pod of a small job of `nobody` in the partition."""
    assert part.kubernetes is not None
    launch = Launch(
        job_id="0", epoch=1, argv=["true"], env={"MGPU_JOB_ID": "0"}, grant=Grant(gpus=[0])
    )
    shape = PodShape(
        cluster=config.cluster.name, rank=0, slot_node="mgpu-dry-run", pinned=False,
        gang=1, gpus=1, uid=65534, gid=65534,
    )  # fmt: skip
    pod = build_pod(launch, part.kubernetes, shape)
    pod["metadata"]["name"] = "mgpu-dry-run"
    return pod


async def check_partition(config: ClusterConfig, part: Partition) -> list[str]:
    """What is wrong with one partition's template, a sentence each (empty: nothing)."""
    section = part.kubernetes
    assert section is not None
    where = f"partition {part.name}"
    _, spec = template_parts(section.pod_template)
    containers = spec.get("containers") or [{}]
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        return [f"{where}: pod_template.spec.containers must be a list of containers."]
    if not (containers[0].get("image") or section.image):
        return [f"{where}: no image for jobs: set kubernetes.image or the template's image."]
    try:
        async with KubeClient.from_config(section.kubeconfig, section.context) as client:
            await client.create_pod(sample_pod(config, part), section.namespace, dry_run=True)
    except KubeInvalid as e:
        return [f"{where}: the pod template is refused: {c}" for c in e.causes] or [f"{where}: {e}"]
    except KubeError as e:
        return [f"{where}: {e}"]
    return []


async def check_partitions(config: ClusterConfig) -> list[str]:
    errors: list[str] = []
    for part in config.kube_partitions():
        errors += await check_partition(config, part)
    return errors
