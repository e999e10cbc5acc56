"""The scheduler's view of the master's state: jobs, nodes and usage into a `Snapshot`.

Plain functions over the controller's records, with no store, clock or agent link of their
own.  The scheduling loop (master/control/loop.py) gathers a pass's `SchedulerInputs` in
one place, and `assemble` turns them into the eligibility verdicts and the `Snapshot`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from mgpu import spec as specs
from mgpu.config import Scheduling
from mgpu.master.state.asks import AskRules
from mgpu.master.state.registry import NodeRecord
from mgpu.master.state.shares import job_share_units
from mgpu.model import Job, JobState
from mgpu.scheduler import (
    BillingWeights,
    Dependency,
    DependencyTarget,
    Eligibility,
    FreePool,
    JobRequest,
    NodeView,
    Placement,
    PriorityWeights,
    Reservation,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    eligibility,
)

__all__ = [
    "Prepared",
    "SchedulerInputs",
    "assemble",
    "collect",
    "dependency_targets",
    "job_request",
    "node_views",
    "running_job",
    "scheduler_config",
]

DEFAULT_TIME_LIMIT = 24 * 3600.0
"""The scheduler's assumed limit of a job without one, when none is configured."""


def node_views(nodes: Iterable[NodeRecord]) -> list[NodeView]:
    """The nodes as the scheduler sees them (GPUs used outside mgpu are not free)."""
    return [
        NodeView(
            node_id=n.node_id,
            gpu_indices=tuple(g.index for g in n.gpus),
            free_gpus=n.free_gpus() - n.foreign_blocked,
            schedulable=n.schedulable,
            gpu_type=specs.normalize_gpu_type(n.gpu_type or (n.gpus[0].name if n.gpus else None)),
            rack=n.rack,
            features=frozenset(n.features),
            shared=n.shared_units() if n.shares else {},
            cpus=len(n.cpus),
            free_cpus=n.free_cpu_count(),
            mem_mb=n.mem_mb,
            free_mem_mb=n.free_mem_mb(),
            bare_jobs=n.bare_job_count(),
            whole=n.whole_job is not None,
        )
        for n in nodes
    ]


def job_request(
    job: Job, allowed_nodes: frozenset[str] | None = None, asks: AskRules | None = None
) -> JobRequest:
    """What a queued job asks for; `allowed_nodes` are the nodes its user may use, `asks`
    the cluster's defaults of CPUs and memory per GPU (None: the job's ask as given)."""
    return JobRequest(
        job_id=job.id,
        user=job.user,
        submit_time=job.submit_time,
        gpus=job.gpus,
        gpu_ids=tuple(job.gpu_ids) if job.gpu_ids is not None else None,
        node_gpu_ids=(
            tuple((n, tuple(g)) for n, g in job.node_gpu_ids)
            if job.node_gpu_ids is not None
            else None
        ),
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        nodelist=frozenset(job.nodelist) if job.nodelist is not None else None,
        exclude=frozenset(job.exclude),
        gpu_type=job.gpu_type,
        distributed=job.distributed or job.mpi,
        policy=job.policy,  # type: ignore[arg-type]
        priority=job.priority,
        time_limit=job.time_limit,
        preemptible=job.preemptible,
        allowed_nodes=_in_partition(job, allowed_nodes),
        requires=frozenset({"container"}) if job.image else frozenset(),
        dependencies=tuple(Dependency(kind, dep) for kind, dep in job.dependency),
        eligible_time=job.eligible_time,
        begin_time=job.begin_time or 0.0,
        array_id=job.array_job_id,
        array_max_running=job.array_max_running,
        held=job.held,
        gpu_share=job_share_units(job),
        reservation=job.reservation,
        kill_invalid_dep=job.slurm is None or job.slurm.kill_invalid_dep,
        over_partition_time=_over_partition_time(job),
        ask=job.ask if asks is None else asks.effective(job),
    )


def _over_partition_time(job: Job) -> bool:
    """A Slurm job's time limit (None: unlimited) is over its partition's `max_time`."""
    top = job.slurm.partition_max_time if job.slurm is not None else None
    return top is not None and (job.time_limit is None or job.time_limit > top)


def _in_partition(job: Job, allowed: frozenset[str] | None) -> frozenset[str] | None:
    """The nodes a job may use: its user's (None: any), within its Slurm partition's."""
    part = job.slurm.partition_nodes if job.slurm is not None else None
    if part is None:
        return allowed
    return frozenset(part) if allowed is None else frozenset(part) & allowed


def running_job(job: Job, now: float) -> RunningJob:
    """A running job: its GPUs, its expected end, and what its priority is computed from."""
    return RunningJob(
        job_id=job.id,
        user=job.user,
        placements=tuple(
            Placement(
                s.node_id,
                tuple(s.gpu_ids),
                job_share_units(job),
                s.cpus or 0,
                s.mem_mb or 0,
                job.ask.exclusive,
            )
            for s in job.allocation
        ),
        start_time=now if job.start_time is None else job.start_time,  # None: launching
        time_limit=job.time_limit,
        priority=job.priority,
        preemptible=job.preemptible,
        submit_time=job.submit_time,
    )


def scheduler_config(s: Scheduling) -> SchedulerConfig:
    """The scheduler's settings from the cluster config's `scheduling` section."""
    w = s.weights
    return SchedulerConfig(
        queue_policy=s.policy,
        placement_policy=s.default_policy,
        default_time_limit=(
            specs.parse_time_limit(s.default_time_limit)
            if s.default_time_limit
            else DEFAULT_TIME_LIMIT
        ),
        weights=PriorityWeights(
            age=w.age,
            fairshare=w.fairshare,
            job_size=w.job_size,
            user_priority=w.user_priority,
            max_age=w.max_age_hours * 3600,
        ),
        shares=s.shares,
        billing=BillingWeights(s.billing.gpu, s.billing.cpu, s.billing.mem_gb),
        max_gpus_per_user=s.max_gpus_per_user,
        max_running_jobs_per_user=s.max_running_jobs_per_user,
        preemption=s.preemption,
    )


@dataclass(frozen=True, slots=True)
class SchedulerInputs:
    """Everything one scheduling pass reads, as plain values: made in one place by the loop
    (`SchedulingLoop.inputs`), so that a pass may run off the event loop."""

    now: float
    queued: Sequence[JobRequest]
    """The queued jobs the pass looks at, in submit order (every one, or a quick pass's)."""
    running: Sequence[RunningJob]
    array_running: Mapping[str, int]
    """Each array's running tasks (its `%N` cap)."""
    targets: Mapping[str, Sequence[DependencyTarget]]
    """The targets of the queued jobs' dependencies not known to be met."""
    usage: Mapping[str, float]
    """Each user's usage: ended work, decayed, plus the running work."""
    config: SchedulerConfig
    nodes: Sequence[NodeView]
    reservations: Sequence[Reservation] = ()
    users: frozenset[str] = frozenset()
    """See `Snapshot.users`."""
    pool: FreePool | None = None
    """The free pool of `nodes` when the caller keeps one (else made from them)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    eligibility: Eligibility
    """Which queued jobs wait, and which must be cancelled: the caller applies these."""
    snapshot: Snapshot | None
    """The scheduler's input; None when no queued job is eligible (no pass is needed)."""


def _none(job_id: str) -> None:
    return None


def collect(
    now: float,
    jobs: Iterable[Job],
    request_for: Callable[[Job], JobRequest] = job_request,
    requests: Mapping[str, JobRequest] | None = None,
    running_for: Callable[[Job, float], RunningJob] | None = running_job,
) -> tuple[list[JobRequest], list[RunningJob], dict[str, int]]:
    """The queued jobs' requests, the running jobs, and each array's running tasks
    (`running_for` None: the queued jobs alone, when the caller keeps the running ones)."""
    running: list[RunningJob] = []
    queued: list[JobRequest] = []
    array_running: dict[str, int] = {}
    # This runs over every active job each pass: identity tests and a C-level cache lookup
    # before the (Python) `request_for`.
    queued_state, running_state = JobState.QUEUED, JobState.RUNNING
    cached = requests.get if requests is not None else _none
    for j in jobs:
        state = j.state
        if state is queued_state:
            queued.append(cached(j.id) or request_for(j))
        elif state is running_state and running_for is not None:
            running.append(running_for(j, now))
            if j.array_job_id is not None:
                array_running[j.array_job_id] = array_running.get(j.array_job_id, 0) + 1
    return queued, running, array_running


def dependency_targets(
    queued: Iterable[JobRequest],
    known_met: Set[tuple[str, str]],
    targets: Callable[[str], Sequence[DependencyTarget]],
) -> dict[str, tuple[DependencyTarget, ...]]:
    """The targets of the queued jobs' dependencies not known to be met (looked up by the
    caller: in memory or in its store, so on its own thread)."""
    wanted = {d.job_id for r in queued for d in r.dependencies if d not in known_met}
    return {dep_id: tuple(targets(dep_id)) for dep_id in wanted}


def assemble(inputs: SchedulerInputs) -> Prepared:
    """Eligibility, then the snapshot of what may start.  Pure (plain values in, new values
    out): the master may run it off its event loop."""
    verdict = eligibility(inputs.queued, inputs.now, inputs.targets, inputs.array_running)
    if not verdict.eligible:
        return Prepared(verdict, None)
    snapshot = Snapshot(
        now=inputs.now,
        nodes=inputs.nodes,
        pending=verdict.eligible,
        running=inputs.running,
        usage=inputs.usage,  # running work counts too, as in Slurm
        config=inputs.config,
        reservations=inputs.reservations,
        users=inputs.users,
    )
    return Prepared(verdict, snapshot)
