"""The Secrets of a job's Pods: the job's credential and batch script, kept out of the Pod's
spec (mgpu.master.kube.podspec.keep_private) so that whoever may read the namespace's Pods
may not act as the job's user nor read its script.

A Pod's Secret has the Pod's name.  It is made before its Pod (the kubelet would otherwise
wait on it), then given to the Pod as its owner, so that Kubernetes' garbage collector
deletes it with the Pod whoever deletes the Pod; deleted at once when the Pod is refused.
A master that stopped between the two leaves it unowned: the next master's start gives it
to its Pod, or deletes it once it is older than a launch takes (`sweep`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mgpu.kube import KubeConflict, KubeError
from mgpu.master.kube.podspec import LABEL_CLUSTER, label_value

if TYPE_CHECKING:
    from mgpu.kube import KubeClient

__all__ = ["SWEEP_AGE", "PodSecrets"]

log = logging.getLogger("mgpu.master.kube")

SWEEP_AGE = 120.0
"""Seconds a Secret of mgpu's without its Pod is left at a master's start: a launch in
flight (another master's, or this one's) makes its Pod well within this."""


class PodSecrets:
    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    async def create(self, secret: dict[str, Any]) -> None:
        """A Pod's Secret; one of the same name is a left-over of this run's earlier try
        (a launch sent again, a deposed master's): made afresh."""
        try:
            await self.client.create_secret(secret, self.namespace)
        except KubeConflict:
            await self.client.delete_secret(secret["metadata"]["name"], self.namespace)
            await self.client.create_secret(secret, self.namespace)

    async def own(self, name: str, uid: str) -> None:
        """The Pod `name` (of `uid`) owns its Secret: Kubernetes deletes it with the Pod."""
        owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
        try:
            await self.client.own_secret(name, owner, self.namespace)
        except KubeError as e:
            log.warning("%s", e)

    async def delete(self, name: str) -> None:
        try:
            await self.client.delete_secret(name, self.namespace)
        except KubeError as e:
            log.warning("%s", e)

    async def sweep(self, pods: Mapping[str, str], cluster: str) -> None:
        """At a master's start (`pods`: the names and uids of mgpu's Pods; `cluster`: the
        cluster's name): a Secret of its Pods whose Pod is there but does not own it is
        given to it; one without a Pod, made more than SWEEP_AGE ago (a master stopped
        between making it and its Pod), deleted."""
        selector = f"{LABEL_CLUSTER}={label_value(cluster)}"
        try:
            found = await self.client.list_secrets(self.namespace, label_selector=selector)
        except KubeError as e:
            log.warning("%s", e)
            return
        for item in found.items:
            meta = item.get("metadata") or {}
            name = str(meta.get("name") or "")
            if meta.get("ownerReferences"):
                continue
            if name in pods:
                await self.own(name, pods[name])
            elif _age(meta.get("creationTimestamp")) > SWEEP_AGE:
                log.info("deleting secret %s: its pod is gone", name)
                await self.delete(name)


def _age(stamp: Any) -> float:
    """Seconds since a Kubernetes timestamp (0 when there is none to read)."""
    try:
        made = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, time.time() - made.timestamp())
