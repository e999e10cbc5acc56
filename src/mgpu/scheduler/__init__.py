"""The pure scheduler core: `schedule(Snapshot) -> Decisions`, no I/O and no clock.

`eligibility(queued, now, ...)` decides beforehand which queued jobs may be scheduled at all
(retry backoff, dependencies, array caps); `UsageLedger` keeps the decayed usage that
fairshare reads.  The master and the simulator use all three alike.

`could_ever_fit(request, nodes)` tells the master at submit time whether a request could
ever run on the cluster (None) or why not (one sentence); `share_units(F)` turns
`--gpu-share F` into exact share units; `pick_reservation_gpus(...)` chooses the GPUs of a
new reservation (or refuses with `ReservationError`), `could_fit_reservation` checks a
`--reservation` job at submit.
"""

from .core import schedule
from .eligibility import ARRAY_LIMIT, DependencyTarget, Eligibility, eligibility
from .placement import FreePool, could_ever_fit, place, requested_gpus, wait_reason
from .priority import compute_priorities, fairshare_factors, running_priorities
from .reservations import (
    RESERVATION_PREFIX,
    ReservationError,
    could_fit_reservation,
    pick_reservation_gpus,
)
from .shares import format_share, share_units
from .types import (
    SHARE_UNITS,
    BillingWeights,
    Decisions,
    Dependency,
    JobRequest,
    NodeView,
    Placement,
    Policy,
    PriorityWeights,
    QueuePolicy,
    Reservation,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    Start,
)
from .usage import UsageLedger

__all__ = [
    "ARRAY_LIMIT",
    "RESERVATION_PREFIX",
    "SHARE_UNITS",
    "BillingWeights",
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
    "Reservation",
    "ReservationError",
    "RunningJob",
    "SchedulerConfig",
    "Snapshot",
    "Start",
    "UsageLedger",
    "compute_priorities",
    "could_ever_fit",
    "could_fit_reservation",
    "eligibility",
    "fairshare_factors",
    "format_share",
    "pick_reservation_gpus",
    "place",
    "requested_gpus",
    "running_priorities",
    "schedule",
    "share_units",
    "wait_reason",
]
