"""The pure scheduler core: `schedule(Snapshot) -> Decisions`, no I/O and no clock.

`eligibility(queued, now, ...)` decides beforehand which queued jobs may be scheduled at all
(retry backoff, dependencies, array caps); `UsageLedger` keeps the decayed usage that
fairshare reads.  The master and the simulator use all three alike.

`could_ever_fit(request, nodes)` tells the master at submit time whether a request could
ever run on the cluster (None) or why not (one sentence).
"""

from .core import schedule
from .eligibility import DependencyTarget, Eligibility, eligibility
from .placement import FreePool, could_ever_fit, place, requested_gpus, wait_reason
from .priority import compute_priorities, fairshare_factors, running_priorities
from .types import (
    Decisions,
    Dependency,
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
from .usage import UsageLedger

__all__ = [
    "Decisions",
    "Dependency",
    "DependencyTarget",
    "Eligibility",
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
    "UsageLedger",
    "compute_priorities",
    "could_ever_fit",
    "eligibility",
    "fairshare_factors",
    "place",
    "requested_gpus",
    "running_priorities",
    "schedule",
    "wait_reason",
]
