"""Building jobs from a checked submission: a `JobSpec` into `Job`s (one, or one per array
task), with the defaults, the time and an id source passed in: no I/O, no clock.  A job
submitted the Slurm way is placed by its partition here (`mgpu.slurmenv`)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mgpu import execspec, slurmenv
from mgpu import spec as specs
from mgpu.config import ClusterConfig, Scheduling
from mgpu.master.control.slurmblock import PartitionChoice, choose_partition
from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.store import arrays
from mgpu.model import ALLOCATION, Job, SlurmOptions, WaitCode
from mgpu.signalspec import format_signal
from mgpu.slurmasks import slurm_ask

__all__ = ["SubmitDefaults", "build_jobs", "build_template", "submit_warnings"]


@dataclass(frozen=True, slots=True)
class SubmitDefaults:
    """What a job gets for the options it leaves out (from `scheduling` in the config)."""

    time_limit: float | None = None
    """Seconds; None = no limit."""
    max_retries: int = 5
    cluster: ClusterConfig = field(default_factory=ClusterConfig, compare=False)
    """The partitions of Slurm jobs (`partitions` in the config)."""

    @classmethod
    def from_config(
        cls, scheduling: Scheduling, cluster: ClusterConfig | None = None
    ) -> SubmitDefaults:
        limit = scheduling.default_time_limit
        return cls(
            time_limit=specs.parse_time_limit(limit) if limit else None,
            max_retries=scheduling.max_retries,
            cluster=cluster or ClusterConfig(),
        )


def submit_warnings(spec: JobSpec, defaults: SubmitDefaults) -> list[str]:
    """Lines for the submit's answer about what was asked for and ignored."""
    if spec.slurm is None:
        return []
    warning = choose_partition(spec.slurm.partition, defaults.cluster).warning
    return [] if warning is None else [warning]


def _slurm_placement(
    spec: JobSpec, slurm: SlurmOptions, defaults: SubmitDefaults
) -> tuple[SlurmOptions, PartitionChoice]:
    """The job's SlurmOptions as stored (its partition resolved, its array's shape) and
    the partition it runs in."""
    part = choose_partition(slurm.partition, defaults.cluster)
    slurm = replace(
        slurm,
        partition=part.name,
        partition_nodes=part.nodes,
        partition_max_time=None
        if part.max_time is None or math.isinf(part.max_time)
        else part.max_time,
    )
    if spec.array is not None:
        count, low, high, step = slurmenv.array_shape(spec.array.indices)
        slurm = replace(slurm, array_count=count, array_min=low, array_max=high, array_step=step)
    return slurm, part


def _within_partition(
    part: PartitionChoice,
    nodelist: tuple[str, ...] | None,
    time_limit: float | None,
    asked: bool,
) -> float | None:
    """The time limit of a job in partition `part`: its max_time, for a job that gives
    none (or the cluster's default, if shorter); a --time over it is kept, and the job
    waits as PartitionTimeLimit (Slurm's default, EnforcePartLimits=NO).  A --nodelist
    that names none of its nodes is refused."""
    outside = nodelist is not None and not set(nodelist) & set(part.nodes or nodelist)
    if part.nodes is not None and outside:
        raise specs.SpecError(
            f"--nodelist names no node of partition {part.name!r} ({', '.join(part.nodes)})"
        )
    if part.max_time is not None and not math.isinf(part.max_time) and not asked:
        time_limit = min(time_limit or math.inf, part.max_time)  # the default, within it
    return time_limit


def build_template(
    spec: JobSpec,
    user: str,
    defaults: SubmitDefaults,
    now: float,
    new_id: Callable[[int], str],
) -> Job:
    """The queued job `spec` asks for; for an array, the template its tasks are made of
    (`mgpu.master.store.arrays`), with the array's id.  `new_id(block)` gives the id, and
    takes `block` ids from it on (an array's tasks each have a number of their own:
    `specs.task_job_number`)."""
    if spec.script is not None:
        argv = list(spec.argv or ())  # the script's arguments
        command = shlex.join([spec.script_name or "script", *argv])
    elif spec.argv is not None:
        argv = list(spec.argv)
        command = shlex.join(argv)
    else:
        assert spec.command is not None  # the model validator saw to it
        command = spec.command
        argv = ["/bin/sh", "-c", command]
    if spec.time is None:
        time_limit = defaults.time_limit
    else:
        time_limit = None if math.isinf(spec.time) else spec.time
    shape = spec.shape
    kept = spec.slurm is not None  # a Slurm job's own MASTER_ADDR... (execspec)
    env = {k: v for k, v in (spec.env or {}).items() if not execspec.is_reserved_env_name(k, kept)}
    slurm = spec.slurm
    if slurm is not None:
        try:
            slurm, part = _slurm_placement(spec, slurm, defaults)
            time_limit = _within_partition(part, spec.nodelist, time_limit, spec.time is not None)
        except specs.SpecError as e:
            raise SubmitError(str(e)) from None
    block = 1 if spec.array is None else max(spec.array.indices) + 1
    base = Job(
        id=new_id(block),
        user=user,
        argv=argv,
        command=command,
        name=spec.name,
        reason="waiting to be scheduled",
        gpus=shape.gpus,
        gpu_ids=None if spec.gpu_ids is None else list(spec.gpu_ids),
        node_gpu_ids=(
            None if spec.node_gpu_ids is None else [(n, list(g)) for n, g in spec.node_gpu_ids]
        ),
        nodes=shape.nodes,
        gpus_per_node=shape.gpus_per_node,
        nodelist=None if spec.nodelist is None else list(spec.nodelist),
        exclude=list(spec.exclude or ()),
        gpu_type=specs.normalize_gpu_type(spec.gpu_type),
        policy=spec.policy,
        distributed=spec.distributed,
        mpi=spec.mpi,
        time_limit=time_limit,
        priority=spec.priority,
        max_retries=defaults.max_retries if spec.retries is None else spec.retries,
        preemptible=spec.preemptible,
        dependency=[(d.kind, d.job_id) for d in spec.dependency],
        waited_on_dependency=False,
        cwd=spec.cwd,
        env=env,
        interactive=spec.interactive,
        submit_time=now,
        eligible_time=now,
        begin_time=spec.begin,
        image=spec.image,
        container=None if spec.container is None else spec.container.model_dump(),
        held=spec.hold,
        held_by=user if spec.hold else None,
        signal=None if spec.signal is None else format_signal(spec.signal),
        notify=spec.notify,
        script=spec.script,
        script_name=(spec.script_name or "script") if spec.script is not None else None,
        option_sources=dict(spec.option_sources or {}),
        gpu_share=spec.gpu_share,
        reservation=spec.reservation,
        slurm=slurm,
        # A Slurm job's -c, --mem... (mgpu's own --cpus/--mem over them, each kind alone).
        ask=spec.ask if slurm is None else slurm_ask(slurm, shape.nodes or 1, own=spec.ask),
    )
    if base.held:
        base.reason, base.reason_code = "held", WaitCode.HELD
    if spec.pty or spec.allocation:  # a person waits at the other end: idle rules apply
        base.interactive = True
        base.pty = spec.pty
        base.pty_size = None if spec.pty_size is None else list(spec.pty_size)
    if spec.allocation:
        base.kind, base.max_retries = ALLOCATION, 0
    return base


def build_jobs(
    spec: JobSpec,
    user: str,
    defaults: SubmitDefaults,
    now: float,
    new_id: Callable[[int], str],
) -> list[Job]:
    """The queued job `spec` asks for, or one per task of an array (ids ``ID_INDEX``)."""
    base = build_template(spec, user, defaults, now, new_id)
    if spec.array is None:
        return [base]
    # The tasks share the request's fields, argv and env included (nothing changes them
    # after submit; a launch copies the env): 100,000 tasks must not mean 100,000 copies.
    return list(arrays.tasks(base, spec.array.indices, spec.array.max_running))
