"""The pure scheduler core: `schedule(Snapshot) -> Decisions`, no I/O and no clock.

`could_ever_fit(request, nodes)` tells the master at submit time whether a request could
ever run on the cluster (None) or why not (one sentence).
"""

from .core import schedule
from .placement import FreePool, could_ever_fit, place, requested_gpus, wait_reason
from .priority import compute_priorities, fairshare_factors
from .types import (
    Decisions,
    JobRequest,
    NodeView,
    Placement,
    Policy,
    PriorityWeights,
    QueuePolicy,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    Start,
)

__all__ = [
    "Decisions",
    "FreePool",
    "JobRequest",
    "NodeView",
    "Placement",
    "Policy",
    "PriorityWeights",
    "QueuePolicy",
    "RunningJob",
    "SchedulerConfig",
    "Snapshot",
    "Start",
    "compute_priorities",
    "could_ever_fit",
    "fairshare_factors",
    "place",
    "requested_gpus",
    "schedule",
    "wait_reason",
]
