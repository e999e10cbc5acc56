"""A partition's `kubernetes:` section: the cluster config's words for a partition whose
nodes are a Kubernetes cluster's Nodes and whose jobs run as Pods (mgpu.master.kube).

Only the model is here (pydantic, no Kubernetes client): a config without such a
partition, and every CLI command, import nothing more."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["KubernetesSection", "PodSteps"]

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class PodSteps(BaseModel):
    """`kubernetes.steps`: each Pod of a job runs mgpu's pod agent for that job's steps
    (`srun`, `mgpu rsh` in its batch script: mgpu.podagent).  Absent: steps are refused."""

    model_config = ConfigDict(extra="forbid")

    master: str = Field(min_length=1)
    """How the Pods reach the master(s), `[SCHEME://]HOST:PORT[,HOST:PORT]`: the Pods'
    `$MGPU_MASTER`, which the pod agent and the job's `srun` dial."""
    bin: str = Field(pattern=r"^/[^\x00]*$")
    """A directory in the Pods (the image's, or a volume of the template) holding mgpu's
    `mgpu` (whose `pod-agent` runs there) and Slurm's commands: first on the job's PATH."""
    agent_wait: float = Field(default=60.0, gt=0)
    """Seconds a step waits for its Pod's agent to connect before it fails with a sentence."""


class KubernetesSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kubeconfig: str | None = None
    """A kubeconfig file; None: the in-cluster service account (the master runs in a Pod)."""
    context: str | None = None
    """The kubeconfig's context to use; None: its current one."""
    namespace: str = Field(default="default", pattern=_NAMESPACE)
    """Where the jobs' Pods are made."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Labels a Node must carry to belong to the partition (empty: every Node)."""
    gpu_resource: str = "nvidia.com/gpu"
    """The extended resource the device plugin advertises GPUs as."""
    image: str | None = None
    """The image of jobs that name none, when the template's container has none."""
    pod_template: dict[str, Any] = Field(default_factory=dict)
    """A core/v1 Pod fragment (`metadata` labels/annotations, `spec`) every job's Pod is
    made from: volumes, pull secrets, service account, tolerations, its container's image,
    mounts and working directory.  Checked against the API server at start (dry run)."""
    allow_root: bool = False
    """Jobs of root may run as uid 0 in their Pod (never privileged either way)."""
    unschedulable_timeout: float = Field(default=30.0, gt=0)
    """Seconds a Pod may stay unschedulable before its job goes back to the queue."""
    image_pull_timeout: float = Field(default=60.0, gt=0)
    """Seconds a Pod may fail to pull its image before its job fails with the reason."""
    requeue_backoff: float = Field(default=5.0, ge=0)
    """Seconds before a job sent back for want of room may start again (doubling, to 5 min)."""
    force_delete_after: float = Field(default=30.0, ge=0)
    """Seconds past a Pod's grace before one stuck Terminating is force-deleted."""
    steps: PodSteps | None = None
    """Job steps in the Pods (mgpu's pod agent); None: a job's steps are refused."""

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if not _LABEL_KEY.match(key) or len(key.rpartition("/")[2]) > 63:
                raise ValueError(f"{key!r} is not a Kubernetes label key")
            if not _LABEL_VALUE.match(value) or len(value) > 63:
                raise ValueError(f"{value!r} (label {key}) is not a Kubernetes label value")
        return selector

    def label_selector(self) -> str | None:
        """The Nodes' label selector, as the API takes it (None: every Node)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items())) or None
