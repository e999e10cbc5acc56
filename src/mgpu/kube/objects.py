"""Typed views of the core/v1 objects mgpu reads: a Node's capacity, readiness and taints, a
Pod's placement, phase, containers' ends and requests, and Kubernetes' resource quantities."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_SCALE = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60), "n": Decimal("1e-9"), "u": Decimal("1e-6"),
    "m": Decimal("1e-3"), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
    "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
}  # fmt: skip


def quantity(text: str | int | float) -> Decimal:
    """A resource quantity's value: `"2"`, `"500m"` (0.5), `"16Gi"`, `"1e3"`."""
    match = _QUANTITY.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * Decimal(10) ** int(suffix[1:])
    return number * _SCALE[suffix] if suffix else number


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule, PreferNoSchedule, NoExecute


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: dict[str, str]
    ready: bool
    unschedulable: bool
    taints: tuple[Taint, ...]
    allocatable: dict[str, Decimal]
    address: str  # InternalIP (else the first address), "" when none

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeView:
        spec, status = node.get("spec") or {}, node.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
        first = next(iter(addresses.values()), "")
        return cls(
            name=str(_meta(node).get("name", "")),
            labels=dict(_meta(node).get("labels") or {}),
            ready=conditions.get("Ready") == "True",
            unschedulable=bool(spec.get("unschedulable")),
            taints=tuple(
                Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
                for t in spec.get("taints") or []
            ),
            allocatable={k: quantity(v) for k, v in (status.get("allocatable") or {}).items()},
            address=str(addresses.get("InternalIP") or first or ""),
        )


@dataclass(frozen=True)
class ContainerEnd:
    """A container that has terminated: its exit code and Kubernetes' reason (`Completed`,
    `Error`, `OOMKilled`, ...)."""

    name: str
    exit_code: int
    reason: str
    message: str


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    uid: str
    node: str  # "" until scheduled
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    labels: dict[str, str]
    annotations: dict[str, str]
    deleting: bool  # deletionTimestamp set: terminating
    reason: str  # the Pod's own reason (`Evicted`, `NodeLost`, ...), "" when none
    requests: dict[str, Decimal]  # summed over the containers (limits where no request)
    ended: tuple[ContainerEnd, ...] = field(default=())
    waiting: dict[str, str] = field(default_factory=dict)  # container -> reason

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        meta, spec, status = _meta(pod), pod.get("spec") or {}, pod.get("status") or {}
        requests: dict[str, Decimal] = {}
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for key, value in wanted.items():
                requests[key] = requests.get(key, Decimal(0)) + quantity(value)
        ended, waiting = [], {}
        for cs in status.get("containerStatuses") or []:
            state = cs.get("state") or {}
            if "terminated" in state:
                t = state["terminated"]
                ended.append(
                    ContainerEnd(
                        name=str(cs.get("name", "")),
                        exit_code=int(t.get("exitCode", 0)),
                        reason=str(t.get("reason", "")),
                        message=str(t.get("message", "")),
                    )
                )
            elif "waiting" in state:
                waiting[str(cs.get("name", ""))] = str(state["waiting"].get("reason", ""))
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            node=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or "Pending"),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            reason=str(status.get("reason") or ""),
            requests=requests,
            ended=tuple(ended),
            waiting=waiting,
        )


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's sentence when it could not place `pod` (`0/3 nodes are available:
    2 Insufficient nvidia.com/gpu.`), else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        scheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if scheduled and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "unschedulable")
    return None
