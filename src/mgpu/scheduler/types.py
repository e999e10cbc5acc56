"""The scheduler core's inputs and outputs.

The core is pure: the master (and the simulator) build a `Snapshot`, call
`schedule(snapshot)` and apply the returned `Decisions`.  Nothing here does I/O;
`Snapshot.now` is the only time there is (the planner reads a clock only to stop
estimating when `SchedulerConfig.plan_seconds` is spent).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from mgpu.model import WaitCode
from mgpu.resources import NO_ASK, ResourceAsk

Policy = Literal["fill_first", "spread"]
QueuePolicy = Literal["fifo", "priority", "backfill"]

SHARE_UNITS = 1000
"""A whole GPU in share units: fractional requests (`--gpu-share F`) are whole thousandths
of one GPU, so shares add up exactly (ten jobs of 0.1 fill a GPU, no rounding residue)."""


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
    shared: Mapping[int, int] = field(default_factory=dict)
    """GPUs holding fractional jobs: index -> share units in use (1..`SHARE_UNITS`).
    Such a GPU is not in `free_gpus`: no whole-GPU job may use it until its shares are gone."""
    cpus: int = 0
    """CPUs the node offers to jobs; 0: it does not say (an older agent), and then it holds
    no job that asks for CPUs."""
    free_cpus: int = 0
    """Of those, not held by a running job."""
    mem_mb: int = 0
    """Memory (MiB) the node offers to jobs; 0: it does not say, as for `cpus`."""
    free_mem_mb: int = 0
    bare_jobs: int = 0
    """Running jobs that hold none of its GPUs, CPUs or memory (a `--gpus 0` job that asks
    nothing): the node is not idle while one runs, so no `--exclusive` job starts here."""
    whole: bool = False
    """An `--exclusive` job holds it: nothing else starts here while that job runs, not
    even a job that would hold nothing."""


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
    begin_time: float = 0.0
    """Not before this time (`--begin`)."""
    array_id: str | None = None
    """The array the job is a task of."""
    array_max_running: int | None = None
    """The array's `%N`: at most this many of its tasks run at once."""
    gpu_share: int = 0
    """A fraction of one GPU (`--gpu-share F`) in share units (1..999 of `SHARE_UNITS`), with
    `gpus=1`; 0 = whole GPUs.  Packed with other shares on one GPU, never beside a whole job."""
    reservation: str | None = None
    """`--reservation NAME`: runs only inside that reservation's window, on its GPUs (the
    master has checked the user may use it)."""
    held: bool = False
    """Held (`--hold`, `mgpu hold`): never eligible until released."""
    ask: ResourceAsk = NO_ASK
    """CPUs and memory it needs on each node, beside its GPUs (`ResourceAsk.cpus_on` and
    `mem_on` for a given node); the cluster's per-GPU defaults already applied."""
    kill_invalid_dep: bool = True
    """A dependency that can never be satisfied cancels it; False (a Slurm job's default):
    it waits, as DependencyNeverSatisfied."""
    over_partition_time: bool = False
    """Its time limit is over its Slurm partition's `max_time`: it waits (PartitionTimeLimit)."""
    # Derived once here rather than in every pass: a pass tests them over the whole queue.
    counted: bool = field(init=False, repr=False, compare=False)
    """Asks for `gpus` whole GPUs with no per-GPU or per-node shape (no `--gpu-ids`,
    `--node-gpu-ids`, `--nodes`, share): its whole-GPU need is `gpus`."""
    plain: bool = field(init=False, repr=False, compare=False)
    """`counted`, and no node filter, split, reservation or CPU/memory ask either: "N GPUs
    anywhere"."""
    asks: bool = field(init=False, repr=False, compare=False)
    """Asks for CPUs, memory or whole nodes (`ask` is not empty): every fit counts them."""
    fit_key: object = field(init=False, repr=False, compare=False)
    """A cheap key of everything that decides where the job fits, for a "N GPUs anywhere"
    job: `gpus` when `plain`, `gpus` and the ask's numbers (as text) when it is plain but
    for its ask; None otherwise (then `shape.shape_key`).  A pass keys its per-shape answers
    by it."""

    def __post_init__(self) -> None:
        ask = self.ask
        asks = ask is not NO_ASK and not ask.empty
        object.__setattr__(self, "asks", asks)
        counted = (
            self.node_gpu_ids is None
            and self.nodes is None
            and self.gpu_ids is None
            and not self.gpu_share
        )
        object.__setattr__(self, "counted", counted)
        object.__setattr__(
            self,
            "plain",
            counted
            and self.nodelist is None
            and self.gpu_type is None
            and self.allowed_nodes is None
            and not self.exclude
            and not self.requires
            and not self.distributed
            and self.reservation is None
            and not asks,
        )
        key: object = None
        if self.plain:
            key = self.gpus
        elif asks and counted and self._unfiltered():
            # A string: it keeps its hash, which a pass over a long queue asks for twice;
            # interned, so that the queue's jobs of one shape share one object (a pass keys
            # dicts by it 50,000 times: one object stays in the CPU's cache, a copy each not).
            key = sys.intern(
                f"{self.gpus} {ask.cpus_per_node} {ask.cpus_per_gpu} {ask.mem_per_node_mb} "
                f"{ask.mem_per_gpu_mb} {ask.mem_per_cpu_mb} {ask.exclusive:d}"
            )
        object.__setattr__(self, "fit_key", key)

    def _unfiltered(self) -> bool:
        return (
            self.nodelist is None
            and self.gpu_type is None
            and self.allowed_nodes is None
            and not self.exclude
            and not self.requires
            and not self.distributed
            and self.reservation is None
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs on one node."""

    node_id: str
    gpu_ids: tuple[int, ...]
    share: int = 0
    """Share units of each GPU listed that the job holds (a fractional job); 0 = whole GPUs."""
    cpus: int = 0
    """CPUs the job holds on the node (a count: the master picks which)."""
    mem_mb: int = 0
    """Memory (MiB) the job holds on the node."""
    whole: bool = False
    """The job holds the node whole (`--exclusive`): nothing else may start there."""


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
    # Derived once: every pass reads it for every running job (usage, per-user counts).
    gpu_units: int = field(init=False, repr=False, compare=False)
    """GPUs held in share units: a fractional job holds its share, a whole GPU 1000."""
    cpus: int = field(init=False, repr=False, compare=False)
    """CPUs held over all its nodes."""
    mem_mb: int = field(init=False, repr=False, compare=False)
    """Memory (MiB) held over all its nodes."""

    def __post_init__(self) -> None:
        units = cpus = mem = 0
        for p in self.placements:
            units += len(p.gpu_ids) * (p.share or SHARE_UNITS)
            cpus += p.cpus
            mem += p.mem_mb
        object.__setattr__(self, "gpu_units", units)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "mem_mb", mem)

    @property
    def gpus(self) -> int:
        """GPUs the job runs on, a shared one counting as one."""
        return sum(len(p.gpu_ids) for p in self.placements)

    @property
    def gpu_amount(self) -> float:
        """GPUs held, a fractional job counting F (what usage and the job size charge)."""
        return self.gpu_units / SHARE_UNITS


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs set aside for a window (`mgpu reserve create`).

    Inside [start, end) only jobs with `JobRequest.reservation == name` run on `placements`
    (and only there); before the window, another job may use them only if its time limit
    ends it by `start`.  After `end` they are ordinary GPUs again.
    """

    name: str
    placements: tuple[Placement, ...]
    """Whole GPUs on nodes, chosen when the reservation is made (`pick_reservation_gpus`)."""
    start: float
    end: float
    users: frozenset[str] = frozenset()
    """Who may submit into it: checked by the master at submit, not by the core."""

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
class BillingWeights:
    """What fairshare charges per second of a running job (Slurm's `TRESBillingWeights`):
    per GPU held (a share counting F), per CPU, per GiB of memory.  The default charges
    GPU-seconds alone."""

    gpu: float = 1.0
    cpu: float = 0.0
    mem_gb: float = 0.0

    @property
    def gpu_only(self) -> bool:
        """Charges GPUs alone, at 1 per GPU-second (what usage was before weights)."""
        return self.gpu == 1.0 and not self.cpu and not self.mem_gb

    def rate(self, gpus: float, cpus: int = 0, mem_mb: int = 0) -> float:
        """Billing units per second of a job holding these (GPU-seconds by default)."""
        if self.gpu_only:
            return gpus
        return self.gpu * gpus + self.cpu * cpus + self.mem_gb * mem_mb / 1024


GPU_BILLING = BillingWeights()


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
    plan_jobs: int = 5000
    """At most this many waiting jobs get an estimated start per pass (`plan.py`); 0 = only
    the blocked head's (EASY) reservation, as before the planner."""
    plan_seconds: float | None = 0.02
    """Wall-time budget of the estimates per pass (the only clock the core reads, and only
    to stop estimating: decisions never depend on it); None = no time budget."""
    billing: BillingWeights = GPU_BILLING
    """What fairshare usage charges (`usage.py`, `running.py`): GPU-seconds by default."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: Sequence[NodeView]
    pending: Sequence[JobRequest]
    """Jobs that may start now (`eligibility()` let them through), in submit order."""
    running: Sequence[RunningJob] = ()
    usage: Mapping[str, float] = field(default_factory=dict)
    """Each user's decayed usage (fairshare): GPU-seconds, or billing units by
    `SchedulerConfig.billing`."""
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    reservations: Sequence[Reservation] = ()
    """Active and future reservations (those ended are left out)."""
    users: frozenset[str] = frozenset()
    """Users with queued jobs besides those of `pending`: they take part in the fairshare
    normalisation (a pass over the head of a long queue weighs users as the full pass)."""


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
    factors: Mapping[str, dict[str, float]] = field(default_factory=dict)
    """Each pending job's priority broken down by factor (each made when it is read)."""
    expected_start: dict[str, float] = field(default_factory=dict)
    """Estimated start of each waiting job whose start follows from time limits (the blocked
    head's backfill reservation, then the planner's projection within its budget)."""
    waiting_on: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """For each job in `expected_start`: what uses the GPUs it will get until then, in the
    order they let go of them — job ids (running, or queued ahead of it and planned earlier)
    and `reservation:NAME` entries; under fifo/priority first the job ahead that it may not
    pass; at most 16 (the last before its start); empty when it could start now."""
    order: list[str] = field(default_factory=list)
    """The pending jobs' ids in the order the pass took them (priority order; submit order
    under fifo): the master's quick passes start from its head."""


class WaitReason(str):
    """Why a job waits: its English text (a `str`: what `mgpu show` says, and what every
    reason comparison sees) with its typed `code`, which Slurm's commands map."""

    code: WaitCode

    def __new__(cls, text: str, code: WaitCode) -> WaitReason:
        self = super().__new__(cls, text)
        self.code = code
        return self

    def __reduce__(self) -> tuple[object, ...]:
        return (WaitReason, (str(self), self.code))


def code_of(reason: str | None) -> WaitCode | None:
    """The typed code of a reason (None for a plain text)."""
    return reason.code if isinstance(reason, WaitReason) else None
