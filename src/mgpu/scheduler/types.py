"""The scheduler core's inputs and outputs.

The core is pure: the master (and the simulator) build a `Snapshot`, call
`schedule(snapshot)` and apply the returned `Decisions`.  Nothing here does I/O
or reads a clock; `Snapshot.now` is the only time there is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Policy = Literal["fill_first", "spread"]
QueuePolicy = Literal["fifo", "priority", "backfill"]


class Dependency(NamedTuple):
    """`--dependency KIND:JOB`: KIND is afterok, afterany or afternotok; JOB a job or array id."""

    kind: str
    job_id: str


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the scheduler sees it."""

    node_id: str
    gpu_indices: tuple[int, ...]
    """Every GPU index the node has."""
    free_gpus: frozenset[int]
    """GPUs neither allocated nor blocked (e.g. used outside mgpu)."""
    schedulable: bool = True
    """Online and not draining/drained."""
    gpu_type: str | None = None
    rack: str | None = None
    features: frozenset[str] = frozenset()
    """Capabilities such as container runtimes ("podman")."""


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A pending job: what it asks for, and what orders it."""

    job_id: str
    user: str
    submit_time: float
    gpus: int = 1
    """Total GPUs.  With `nodes` set, `nodes * gpus_per_node`."""
    gpu_ids: tuple[int, ...] | None = None
    """These indices on one node."""
    node_gpu_ids: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    """Exactly these GPUs on these nodes (strict)."""
    nodes: int | None = None
    gpus_per_node: int | None = None
    nodelist: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    gpu_type: str | None = None
    distributed: bool = False
    """May be split across nodes when no single node could ever hold `gpus`."""
    policy: Policy | None = None
    """Per-job placement policy; None = the cluster default."""
    priority: int = 0
    """User priority (higher first, within policy)."""
    time_limit: float | None = None
    """Seconds; None = the configured default limit."""
    preemptible: bool = False
    requires: frozenset[str] = frozenset()
    """Node features the job needs."""
    allowed_nodes: frozenset[str] | None = None
    """Nodes the job's user may use (access rules); None = all."""
    # What the job waits for besides GPUs: `eligibility()` looks at these, `schedule()` not.
    dependencies: tuple[Dependency, ...] = ()
    eligible_time: float = 0.0
    """Not before this time (retry backoff after a requeue)."""
    array_id: str | None = None
    """The array the job is a task of."""
    array_max_running: int | None = None
    """The array's `%N`: at most this many of its tasks run at once."""
    held: bool = False
    """Held (`--hold`, `mgpu hold`): never eligible until released."""


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs on one node."""

    node_id: str
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running job: where it runs, until when, and what its priority is computed from.

    A pass that weighs preempting the job computes its priority as of `Snapshot.now` by the
    formula of the pending jobs (`priority.py`), so its own running work counts against its
    user exactly as it would if it were waiting.
    """

    job_id: str
    user: str
    placements: tuple[Placement, ...]
    start_time: float
    time_limit: float | None = None
    priority: int = 0
    """User priority (`--priority`), as `JobRequest.priority`."""
    preemptible: bool = False
    submit_time: float | None = None
    """When the job was submitted (its age); None = `start_time`."""

    @property
    def gpus(self) -> int:
        return sum(len(p.gpu_ids) for p in self.placements)


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    age: float = 1000.0
    fairshare: float = 10000.0
    job_size: float = 100.0
    user_priority: float = 1000.0
    max_age: float = 7 * 24 * 3600.0
    """Age at which the age factor saturates (seconds)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    queue_policy: QueuePolicy = "backfill"
    placement_policy: Policy = "fill_first"
    default_time_limit: float = 24 * 3600.0
    weights: PriorityWeights = field(default_factory=PriorityWeights)
    shares: Mapping[str, float] = field(default_factory=dict)
    """Configured fairshare per user; users absent get an equal share."""
    max_gpus_per_user: int | None = None
    max_running_jobs_per_user: int | None = None
    backfill_depth: int = 1000
    """How many queued jobs a pass looks at for backfill."""
    preemption: bool = True
    cluster_gpus: int = 0
    """Total GPUs in the cluster, for the job-size factor; 0 = derive from nodes."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: Sequence[NodeView]
    pending: Sequence[JobRequest]
    """Jobs that may start now (`eligibility()` let them through), in submit order."""
    running: Sequence[RunningJob] = ()
    usage: Mapping[str, float] = field(default_factory=dict)
    """Each user's decayed GPU-seconds (fairshare)."""
    config: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    placements: tuple[Placement, ...]


@dataclass(slots=True)
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    """Running job ids to stop and requeue so that higher-priority work can start."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each pending job that did not start waits ("waiting for 2 GPUs", "priority")."""
    priorities: dict[str, float] = field(default_factory=dict)
    factors: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each pending job's priority broken down by factor."""
    expected_start: dict[str, float] = field(default_factory=dict)
    """Reservation times for jobs that must wait (backfill)."""
