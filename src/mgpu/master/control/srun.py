"""`srun` inside a job: Slurm's step, its tasks spread over the job's allocation.

A batch job (`sbatch`) runs its script on its first node only, its other nodes held
(master/control/lifecycle.py); an allocation (`salloc`, `mgpu alloc`) runs nothing of its
own.  Either way `srun` in there asks for a step: N tasks on the job's nodes and GPUs,
never a new job.  Where they go follows srun's options within what the job holds
(`plan_tasks`, pure), then each task is one process (a `Step` of its own, id
`JOBID.sN.T`) with Slurm's per-task variables (`mgpu.slurmenv.task_env`).  Its tasks'
ends make the step's: the highest exit code, as srun's; with `--kill-on-bad-exit` the
first task that fails stops the others, and its code is the step's, unless it killed
some: then the step is cancelled with their signal, as Slurm's (CANCELLED 0:15, 143).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence

from mgpu import gpubind
from mgpu.config import ClusterConfig
from mgpu.containeropts import ContainerOptions
from mgpu.master.control import launch
from mgpu.master.control.admission import CONTAINER_FEATURE
from mgpu.master.control.launch import job_env, known_hostname, slurm_node_names, terminal_size
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.control.nodes import Conflict
from mgpu.master.control.sessions import Sessions
from mgpu.master.control.submit import SubmitError
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.registry import NodeRecord
from mgpu.master.state.steps import Step, TaskStep
from mgpu.model import ALLOCATION, Job, JobState
from mgpu.protocol import Launch
from mgpu.slurmenv import task_env

log = logging.getLogger("mgpu.master")

__all__ = ["SrunRequest", "Sruns", "TaskPlan", "plan_tasks"]


@dataclasses.dataclass(frozen=True, slots=True)
class SrunRequest:
    """A step as `srun` inside a job asks for it (already validated)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    nodes: int | None = None
    """-N: how many of the job's nodes (the first ones; with -w, at least those)."""
    ntasks: int | None = None
    """-n; None: the job's own task count (or one per node, with -N/-w)."""
    ntasks_per_node: int | None = None
    nodelist: Sequence[str] = ()
    """-w: these of the job's nodes (ids or hostnames)."""
    gpus_per_task: int | None = None
    """Each task its own GPUs of its node; None: the job's, else all of the node's."""
    cpus_per_task: int | None = None
    """-c: each task's CPUs, within the job's on its node (None: the job's -c)."""
    gpu_bind: str | None = None
    """`--gpu-bind` (or srun's SLURM_GPU_BIND); None: the job's (mgpu.gpubind)."""
    kill_on_bad_exit: bool = False
    pty: bool = False
    pty_size: Sequence[int] | None = None
    image: str | None = None
    """Run each task in this image (pyxis's `--container-image`)."""
    container: ContainerOptions | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskPlan:
    """Where each task runs: `ranks[t]` is task t's index in the job's allocation."""

    ranks: list[int]
    localids: list[int]
    gpu_ids: list[list[int]]
    warnings: list[str]
    bind_notes: list[str | None] = dataclasses.field(default_factory=list)
    """Each task's `--gpu-bind=verbose,` line (None: not verbose)."""


def job_tasks_per_node(job: Job) -> list[int] | None:
    """What the job asked for (`--ntasks`, `--ntasks-per-node`): its tasks on each node, in
    Slurm's block layout; None when it said nothing (no task count limits its steps)."""
    nnodes = len(job.allocation)
    if job.slurm is None:
        return None
    per_node, ntasks = job.slurm.ntasks_per_node, job.slurm.ntasks
    if isinstance(per_node, int) and per_node > 0:
        counts = [per_node] * nnodes
        if isinstance(ntasks, int) and 0 < ntasks < per_node * nnodes:
            counts = _spread(ntasks, nnodes, per_node)
        return counts
    if isinstance(ntasks, int) and ntasks > 0:
        return _spread(ntasks, nnodes)
    return None


def _spread(ntasks: int, nnodes: int, cap: int | None = None) -> list[int]:
    """`ntasks` over `nnodes` in blocks: each node one at least, the first ones one more
    (or up to `cap` each, in order)."""
    if cap is not None:
        counts = []
        left = ntasks
        for _ in range(nnodes):
            counts.append(min(cap, left))
            left -= counts[-1]
        return counts
    base, extra = divmod(ntasks, nnodes)
    return [base + (1 if i < extra else 0) for i in range(nnodes)]


def plan_tasks(
    job_label: str,
    names: Sequence[Sequence[str]],
    gpus: Sequence[Sequence[int]],
    job_counts: Sequence[int] | None,
    job_gpus_per_task: int | None,
    request: SrunRequest,
    job_gpu_bind: str | None = None,
    node_sizes: Sequence[int] | None = None,
    node_cpus: Sequence[int | None] | None = None,
) -> TaskPlan:
    """Place `request`'s tasks on the job's nodes (rank r: `names[r]` its id and hostname,
    `gpus[r]` its GPUs, `node_sizes[r]` its node's GPU count, `node_cpus[r]` the CPUs the
    job holds there (None or 0: it holds none of its own); `job_counts`: the job's tasks
    per node, or None), or SubmitError with srun's sentence.  Each task sees the GPUs its
    `--gpu-bind` gives it (the request's, else the job's; without one, `--gpus-per-task`'s
    own slice, else every GPU of the step on its node)."""
    refused = f"Unable to create step for job {job_label}: "
    warnings: list[str] = []
    size = len(names)
    ranks = list(range(size))
    if request.nodelist:
        ranks = []
        for name in request.nodelist:
            found = [r for r in range(size) if name in names[r]]
            if not found:
                raise SubmitError(refused + "Requested node configuration is not available")
            ranks += [r for r in found if r not in ranks]
        ranks.sort()
    if request.nodes is not None:
        if request.nodes > size:
            raise SubmitError(f"Only allocated {size} nodes asked for {request.nodes}")
        if request.nodes < len(ranks) and request.nodelist:
            raise SubmitError(refused + "Requested node configuration is not available")
        if not request.nodelist:
            ranks = ranks[: request.nodes]
        else:  # -w's nodes, and others of the job's up to -N, as srun picks them
            others = [r for r in range(size) if r not in ranks]
            ranks = sorted(ranks + others[: request.nodes - len(ranks)])
    chosen = request.nodes is not None or bool(request.nodelist)
    if request.ntasks is not None:
        ntasks = request.ntasks
    elif request.ntasks_per_node is not None:
        ntasks = request.ntasks_per_node * len(ranks)
    elif request.pty:
        ntasks = 1
    elif job_counts is not None and not chosen:
        ntasks = sum(job_counts)
    else:
        ntasks = len(ranks)
    if ntasks < len(ranks):
        if request.nodes is not None:
            warnings.append(
                f"can't run {ntasks} processes on {len(ranks)} nodes, setting nnodes to {ntasks}"
            )
        ranks = ranks[:ntasks]
    if request.ntasks_per_node is not None:
        if ntasks > request.ntasks_per_node * len(ranks):
            raise SubmitError(refused + "More processors requested than permitted")
        counts = _spread(ntasks, len(ranks), request.ntasks_per_node)
    elif job_counts is not None and request.ntasks is None and not chosen:
        counts = [job_counts[r] for r in ranks]
    else:
        counts = _spread(ntasks, len(ranks))
    pairs = list(zip(ranks, counts, strict=True))
    if job_counts is not None and any(c > job_counts[r] for r, c in pairs):
        raise SubmitError(refused + "More processors requested than permitted")
    if request.cpus_per_task is not None and node_cpus is not None:
        for rank, count in pairs:
            held = node_cpus[rank]
            if held and count * request.cpus_per_task > held:
                raise SubmitError(refused + "More processors requested than permitted")
    per_task = request.gpus_per_task if request.gpus_per_task is not None else job_gpus_per_task
    bind = _binding(request.gpu_bind or job_gpu_bind, per_task)
    plan = TaskPlan([], [], [], warnings)
    for rank, count in pairs:
        node_gpus = list(gpus[rank])
        if per_task and count * per_task > len(node_gpus):
            raise SubmitError(refused + "Requested node configuration is not available")
        step_gpus = node_gpus[: count * per_task] if per_task else node_gpus
        size = node_sizes[rank] if node_sizes is not None else max(node_gpus, default=-1) + 1
        for local in range(count):
            own = gpubind.task_gpus(bind, step_gpus, local, size)
            plan.ranks.append(rank)
            plan.localids.append(local)
            plan.gpu_ids.append(own)
            verbose = bind is not None and bind.verbose
            plan.bind_notes.append(gpubind.verbose_line(own, step_gpus) if verbose else None)
    return plan


def _binding(text: str | None, per_task: int | None) -> gpubind.GpuBind | None:
    """The step's binding: `--gpu-bind`'s, else `--gpus-per-task=N`'s implied `per_task:N`
    (as srun's), else none (SubmitError: a bad one, in srun's words)."""
    if text is not None:
        try:
            return gpubind.parse(text)
        except ValueError as e:
            raise SubmitError(str(e)) from None
    return gpubind.GpuBind("per_task", number=per_task) if per_task else None


class Sruns:
    """Starts srun steps in running jobs, and ends them as their tasks end."""

    def __init__(
        self, state: ControllerState, life: Lifecycle, sessions: Sessions, config: ClusterConfig
    ) -> None:
        self.state = state
        self.life = life
        self.uow = life.uow
        self.sessions = sessions
        self.config = config
        state.steps.on_task_end.append(self._task_ended)
        state.steps.on_group_end.append(self._step_ended)

    def start(self, job_id: str, request: SrunRequest) -> tuple[TaskStep, list[str]]:
        """Start `request` in the running job `job_id`: the step and srun's warnings
        (SubmitError: a step the job cannot hold; Conflict: a job not running)."""
        job = self.state.jobs.get(job_id) or self.uow.pending(job_id)
        if job is None or job.state == JobState.QUEUED:
            raise Conflict(f"job {job_id} has not started: it runs no steps yet")
        if job.state != JobState.RUNNING:
            raise Conflict(f"job {job_id} has ended ({job.state.value}): it runs no steps")
        nodes = self.state.nodes
        slurm_names = list(slurm_node_names(job, nodes))
        names = []  # what -w may call each node: its id, its hostname, its Slurm name
        for slot, slurm_name in zip(job.allocation, slurm_names, strict=True):
            hostname = _hostname(nodes, slot.node_id)
            names.append([slot.node_id, hostname, slurm_name])
        gpus_per_task = job.slurm.gpus_per_task if job.slurm is not None else None
        plan = plan_tasks(
            job.id,
            names,
            [s.gpu_ids for s in job.allocation],
            job_tasks_per_node(job),
            gpus_per_task if isinstance(gpus_per_task, int) else None,
            request,
            job_gpu_bind=job.slurm.gpu_bind if job.slurm is not None else None,
            node_sizes=[_node_size(nodes, s.node_id, s.gpu_ids) for s in job.allocation],
            node_cpus=[s.cpus for s in job.allocation],
        )
        for rank in sorted(set(plan.ranks)):
            node = nodes.get(job.allocation[rank].node_id)
            if node is None or node.link is None:
                raise Conflict(f"{job.allocation[rank].node_id} is not connected")
            if request.image is not None and CONTAINER_FEATURE not in node.features:
                raise SubmitError(
                    f"Unable to create step for job {job.id}: {node.node_id} has no container "
                    f"runtime (podman, docker or apptainer) to run --container-image "
                    f"{request.image}"
                )
        node_ids = [job.allocation[r].node_id for r in plan.ranks]
        group = self.state.steps.new_group(job.id, job.epoch, node_ids, self._stored_next(job))
        group.kill_on_bad_exit = request.kill_on_bad_exit
        group.name = os.path.basename(request.argv[0]) if request.argv else ""
        group.start_time = self.state.clock.time()
        for step, rank, localid, gpu_ids, note in zip(
            group.tasks, plan.ranks, plan.localids, plan.gpu_ids, plan.bind_notes, strict=True
        ):
            step.pty, step.host, step.bind_note = request.pty, slurm_names[rank], note
            step.pty_size = None if request.pty_size is None else list(request.pty_size)
            # srun inside a job's own process (a batch script) prints its output into the
            # job's: not twice there.  An allocation's srun runs on the client's machine.
            step.to_job_output = job.kind == ALLOCATION
            launch = self._launch(job, group, step, rank, localid, gpu_ids, plan, request)
            link = nodes[step.node_id].link
            assert link is not None
            self.uow.send(link, launch)
            if step.pty:
                self.sessions.touch(step.id)
        return group, plan.warnings

    def _launch(
        self,
        job: Job,
        group: TaskStep,
        step: Step,
        rank: int,
        localid: int,
        gpu_ids: list[int],
        plan: TaskPlan,
        request: SrunRequest,
    ) -> Launch:
        nodes: Mapping[str, NodeRecord] = self.state.nodes
        step_ranks = sorted(set(plan.ranks))
        names = list(slurm_node_names(job, nodes))
        own = task_env(
            step_id=group.number,
            procid=step.task,
            localid=localid,
            nodeid=step_ranks.index(rank),
            ntasks=len(plan.ranks),
            step_hosts=[names[r] for r in step_ranks],
            node_tasks=[plan.ranks.count(r) for r in step_ranks],
            node_procids=[i for i, r in enumerate(plan.ranks) if r == rank],
        )
        if request.cpus_per_task is not None:  # srun -c: the step's own
            own["SLURM_CPUS_PER_TASK"] = str(request.cpus_per_task)
        return launch_in_job(
            step,
            job,
            rank,
            argv=request.argv,
            srun_env=request.env,
            cwd=request.cwd,
            gpu_ids=gpu_ids,
            nodes=nodes,
            credential=self.life.credential(job),
            config=self.config,
            task=own,
            image=request.image,
            container=request.container,
        )

    def cancel(self, group: TaskStep) -> bool:
        """Kill a step's tasks (srun's Ctrl-C); False if it had already ended."""
        if group.done:
            return False
        for task in group.tasks:
            if not task.done:
                self.sessions.kill_step(task, "cancelled")
        return True

    def _stored_next(self, job: Job) -> int:
        """The step number after the job's last stored one: a master that took over (or
        restarted) numbers on from there; one that numbers the job already knows."""
        if self.state.steps.numbering(job.id):
            return 0
        last = self.uow.store.last_step_number(job.id)
        return 0 if last is None else last + 1

    def _step_ended(self, group: TaskStep) -> None:
        """Stored as a row of its own (store/steps.py), so that `sacct` lists it after the
        job ends, on any master (Slurm's accounting keeps every step); the job's own record
        is not written again."""
        job = self.state.jobs.get(group.job_id) or self.uow.pending(group.job_id)
        if job is None or job.state != JobState.RUNNING:
            return
        code = group.exit_code
        cancelled = group.stopped or (group.error is not None and "cancel" in group.error)
        state = "cancelled" if cancelled else "completed" if code == 0 else "failed"
        oom = group.out_of_memory and not cancelled  # sacct: OUT_OF_MEMORY, 0:125
        if oom:
            state = "failed"
        hosts = list(dict.fromkeys(t.host or t.node_id for t in group.tasks))
        self.uow.step_ended(
            job.id,
            {
                "number": group.number,
                "name": group.name,
                "start": group.start_time,
                "end": self.state.clock.time(),
                "exit_code": code,
                "state": state,
                "end_code": "out_of_memory" if oom else None,
                "nodes": hosts,
                "ntasks": len(group.tasks),
            },
        )

    def _task_ended(self, task: Step) -> None:
        """--kill-on-bad-exit: the first task that fails stops the others."""
        group = task.group
        if group is None or not group.kill_on_bad_exit or task.exit_code == 0:
            return
        if group.failed_task is not None:
            return
        group.failed_task = task.task
        log.info("step %s: task %d failed, its other tasks are stopped", group.id, task.task)
        for other in group.tasks:
            if not other.done and other is not task:
                self.sessions.kill_step(other, f"task {task.task} failed")


def _hostname(nodes: Mapping[str, NodeRecord], node_id: str) -> str:
    return known_hostname(nodes, node_id) or node_id


def _node_size(nodes: Mapping[str, NodeRecord], node_id: str, held: Sequence[int]) -> int:
    """The node's GPU count as a map or mask numbers them (its highest index plus one)."""
    node = nodes.get(node_id)
    indices = [g.index for g in node.gpus] if node is not None else []
    return max([*indices, *held], default=-1) + 1


def launch_in_job(
    step: Step,
    job: Job,
    rank: int,
    argv: list[str],
    srun_env: Mapping[str, str],
    cwd: str | None,
    gpu_ids: list[int],
    nodes: Mapping[str, NodeRecord],
    credential: str,
    config: ClusterConfig,
    task: Mapping[str, str] | None = None,
    image: str | None = None,
    container: ContainerOptions | None = None,
) -> Launch:
    """A step's process on the job's node `rank`, its argv executed directly (srun's way):
    the environment of the srun that asked (as its `--export` made it) as it is, as
    Slurm's, with the job's variables on that node (`MGPU_*`, `SLURM_*`) and the task's own
    (`task`) over it; torchrun's (a `--distributed` run's) only where it set none."""
    # MGPU_* are the job's own; CUDA_VISIBLE_DEVICES the grant's (the agent's, too).
    own = {
        k: v
        for k, v in srun_env.items()
        if not k.startswith("MGPU_") and k != "CUDA_VISIBLE_DEVICES"
    }
    slot = job.allocation[rank]
    mgpu = job_env(dataclasses.replace(job, env={}, port=None), rank, slot, nodes, credential)
    env = {**own, **mgpu}
    if job.slurm is not None:  # a Slurm job's SLURM_* on that node
        env.update(launch.slurm_env(job, rank, nodes, config))
    env.update(task or {})
    for name, value in launch.rendezvous_env(job, rank, slot, nodes).items():
        env.setdefault(name, value)
    return Launch(
        job_id=step.id,
        epoch=job.epoch,
        argv=argv,
        env=env,
        cwd=cwd or job.cwd,
        grant=launch.grant(job, slot, nodes, gpus=gpu_ids, step=task is not None),
        kill_grace=config.scheduling.kill_grace,
        user=job.user,
        allow_root=job.allow_root,
        pty=terminal_size(step.pty_size) if step.pty else None,
        image=image,
        container=container,
    )
