"""One job's run as a Pod, as the driver follows it (mgpu.master.kube.pods).

A `PodRun` is what an agent's run record is: which job, run (epoch) and rank it is,
mgpu's slot node, and where its Pod stands (bound, started, ended, being killed, waiting
for room or for its image), with the clocks of the bounded waits."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mgpu.kube import PodView
from mgpu.master.kube.podspec import (
    ANN_GENERATION,
    ANN_HOLDS,
    ANN_JOB,
    ANN_NODE,
    CONTAINER,
    LABEL_EPOCH,
    LABEL_RANK,
)
from mgpu.protocol import SignalRun

__all__ = [
    "IMAGE_FAILURES",
    "NO_ROOM_REASONS",
    "PodRun",
    "container_end",
    "container_state",
    "generation_of",
    "run_of",
    "waiting_message",
]

IMAGE_FAILURES = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
"""A container waiting for one of these will not start until its image can be pulled."""
NO_ROOM_REASONS = ("OutOf", "UnexpectedAdmissionError")
"""A bound Pod's kubelet refused it for want of a resource (a pinned Pod, `nodeName`)."""


@dataclass
class PodRun:
    name: str
    job_id: str
    epoch: int
    rank: int
    slot_node: str
    created: float
    """Monotonic seconds when it was made (or found again)."""
    time_limit: float | None = None
    kill_grace: float = 10.0
    warning: SignalRun | None = None
    """`--signal`'s warning, sent by the Pod's agent `warn_lead` seconds before the time
    limit (with kubernetes.steps); None once sent."""
    warn_lead: float = 0.0
    image: str = ""
    uid: str = ""
    node: str = ""
    phase: str = "Pending"
    started_at: float | None = None
    """Monotonic seconds when its container was first seen running."""
    ended: bool = False
    """Its end was told to the master (or its job dealt with): nothing more is."""
    killing: bool = False
    force_at: float | None = None
    """When a Pod being deleted that is still there is force-deleted."""
    timed_out: bool = False
    unschedulable_since: float | None = None
    unschedulable_why: str = ""
    pull_since: float | None = None
    pull_why: str = ""
    gone: bool = False
    log_task: asyncio.Task[None] | None = None
    finishing: bool = False
    holds: bool = False
    """It only holds a batch job's slot (mgpu.master.kube.gang): no start, output or exit
    of it is the job's."""
    ip: str = ""
    """Its Pod's address, once it has one."""
    first_line: str | None = None
    """The first line of its log (where the -o/-e runner says a file could not be
    opened: mgpu.master.kube.podoutput)."""


def generation_of(view: PodView) -> int | None:
    """The generation of the master that made the Pod (its lease's: mgpu.master.ha), None
    when it does not say (a master of one SQLite store has none)."""
    try:
        return int(view.annotations[ANN_GENERATION])
    except (KeyError, ValueError):
        return None


def run_of(view: PodView, now: float) -> PodRun | None:
    """The run a Pod of mgpu's carries in its labels and annotations (None: not one)."""
    try:
        epoch, rank = int(view.labels[LABEL_EPOCH]), int(view.labels[LABEL_RANK])
        job_id, slot_node = view.annotations[ANN_JOB], view.annotations[ANN_NODE]
    except (KeyError, ValueError):
        return None
    run = PodRun(view.name, job_id, epoch, rank, slot_node, created=now, uid=view.uid)
    run.holds = view.annotations.get(ANN_HOLDS) == "true"
    return run


def container_state(pod: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The job container's state: `running`, `terminated`, `waiting` or "" (none yet),
    with its details."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            state = status.get("state") or {}
            for key in ("terminated", "running", "waiting"):
                if key in state:
                    return key, dict(state[key] or {})
    return "", {}


def container_end(details: Mapping[str, Any]) -> int | None:
    """A terminated container's exit code, or -N where `mgpu pod-init` says signal N
    killed the job (its termination message; Kubernetes says 128+N either way)."""
    code = details.get("exitCode")
    if code is None:
        return None
    told = str(details.get("message") or "").strip()
    if told.startswith("-") and told[1:].isdigit() and int(code) == 128 + int(told[1:]):
        return int(told)
    return int(code)


def waiting_message(details: Mapping[str, Any]) -> str:
    """`Reason: message` of a waiting container, one line."""
    reason = str(details.get("reason") or "")
    message = " ".join(str(details.get("message") or "").split())
    return f"{reason}: {message}" if message else reason
