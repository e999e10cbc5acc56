"""mgpu's Kubernetes API client: the core/v1 calls a Kubernetes-backed partition needs."""

from mgpu.kube.client import KubeClient, ObjectList
from mgpu.kube.credentials import Credentials, KubeConfigError, from_kubeconfig, in_cluster
from mgpu.kube.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeGone,
    KubeInvalid,
    KubeNotFound,
    KubeUnauthorized,
    KubeUnreachable,
)
from mgpu.kube.loglines import LogLine
from mgpu.kube.objects import NodeView, PodView, quantity, unschedulable_message
from mgpu.kube.watch import Watch, WatchEvent

__all__ = [
    "Credentials",
    "KubeClient",
    "KubeConfigError",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeGone",
    "KubeInvalid",
    "KubeNotFound",
    "KubeUnauthorized",
    "KubeUnreachable",
    "LogLine",
    "NodeView",
    "ObjectList",
    "PodView",
    "Watch",
    "WatchEvent",
    "from_kubeconfig",
    "in_cluster",
    "quantity",
    "unschedulable_message",
]
