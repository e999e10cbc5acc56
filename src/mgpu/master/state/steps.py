"""Job steps: extra processes started inside a running job's allocation.

`mpirun` inside an `--mpi` job starts its remote daemons through `mgpu rsh
HOST CMD`, which asks the master for a step on the allocated node that HOST
names; `mgpu srun` inside an allocation (`mgpu alloc`) starts one on the
allocation's nodes (master/control/allocations.py).  A step runs with the job's GPUs on
its nodes and ends with the job.  Agents know a step as a run whose id is
`JOBID.sN` (the same id on each of its nodes).

`srun` inside a job (a Slurm batch job, an allocation) starts a `TaskStep`: Slurm's
step, of several tasks.  Each task is a `Step` of its own on one node (id `JOBID.sN.T`,
T its SLURM_PROCID), so agents, reconciliation and output know it as any step; the
`TaskStep` gathers them: its exit code is the highest of its tasks', as srun's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from mgpu.model import Job

STEP_SEPARATOR = ".s"


@dataclass
class Step:
    id: str
    job_id: str
    epoch: int
    node_id: str
    exit_code: int | None = None
    error: str | None = None
    done: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    nodes: list[str] = field(default_factory=list)
    """Every node it runs on (a step of an allocation may span several); empty: `node_id`."""
    exits: dict[str, int | None] = field(default_factory=dict)
    """Exit codes of the nodes whose process has ended."""
    pty: bool = False
    """Runs on a pseudo-terminal (`mgpu srun --pty` inside an allocation)."""
    pty_size: list[int] | None = None
    group: TaskStep | None = None
    """The srun step this process is one task of (None: a step of one process per node)."""
    task: int = 0
    """Its SLURM_PROCID in `group`."""
    host: str = ""
    """Its node as Slurm's node lists name it (srun's messages about the task)."""
    to_job_output: bool = True
    """Its output is added to the job's too (not where srun prints it into the job's own
    output, as in a batch script: it would be there twice)."""
    bind_note: str | None = None
    """`--gpu-bind=verbose,...`: the line about its GPUs srun prints on its stderr."""
    out_of_memory: bool = False
    """Its node killed it for its memory limit (Slurm's task `Out Of Memory`)."""

    @property
    def on_nodes(self) -> list[str]:
        return self.nodes or [self.node_id]

    def runs_on(self, node_id: str) -> bool:
        return node_id in self.on_nodes

    def ended_on(self, node_id: str) -> bool:
        return self.done or node_id in self.exits


@dataclass
class TaskStep:
    """Slurm's step: `srun` inside a job, its tasks spread over the job's nodes."""

    id: str
    job_id: str
    number: int
    """Slurm's step id (SLURM_STEP_ID): 0 for the job's first."""
    tasks: list[Step] = field(default_factory=list)
    """In SLURM_PROCID order."""
    kill_on_bad_exit: bool = False
    failed_task: int | None = None
    """With kill_on_bad_exit: the task whose failure stopped the others."""
    stopped: bool = False
    """With kill_on_bad_exit: a task's failure killed others (Slurm's step CANCELLED)."""
    done: bool = False
    exit_code: int | None = None
    error: str | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    name: str = ""
    """What it runs (its program's name: sacct's JobName)."""
    start_time: float = 0.0

    @property
    def ended(self) -> bool:
        return all(t.done for t in self.tasks)

    @property
    def out_of_memory(self) -> bool:
        """A task was killed for its memory: the step ends OUT_OF_MEMORY, as Slurm's."""
        return any(t.out_of_memory for t in self.tasks)


def is_step_id(run_id: str) -> bool:
    return STEP_SEPARATOR in run_id


def is_batch(job: Job) -> bool:
    """A Slurm batch job: its script runs once, on its first node; the others wait for
    its steps (`srun`)."""
    return job.slurm is not None and job.slurm.batch


class Steps:
    def __init__(self) -> None:
        self.by_id: dict[str, Step] = {}
        self.groups: dict[str, TaskStep] = {}
        self._counter: dict[str, int] = {}
        self._slurm_counter: dict[str, int] = {}
        self.on_task_end: list[Callable[[Step], None]] = []
        """Told when a task of a `TaskStep` ends (before the group's end, if it is the last)."""
        self.on_group_end: list[Callable[[TaskStep], None]] = []
        """Told when a `TaskStep` has ended (its exit code known), not when its job did."""
        self.on_change: list[Callable[[Step | TaskStep], None]] = []
        """Told when a step is made or one of its processes ends (a task: its `TaskStep`):
        the store keeps the running jobs' steps (master/control/livesteps.py)."""
        self.on_forget: list[Callable[[str], None]] = []
        """Told when a job's steps are forgotten (it ended)."""

    def new(self, job_id: str, epoch: int, node_id: str) -> Step:
        n = self._counter.get(job_id, 0) + 1
        self._counter[job_id] = n
        step = Step(id=f"{job_id}{STEP_SEPARATOR}{n}", job_id=job_id, epoch=epoch, node_id=node_id)
        self.by_id[step.id] = step
        self._changed(step)
        return step

    def new_group(
        self, job_id: str, epoch: int, nodes: list[str], stored_next: int = 0
    ) -> TaskStep:
        """A srun step of len(nodes) tasks, task T on nodes[T].  `stored_next`: the number
        after the job's last stored step (a master that took over numbers on from there)."""
        n = self._counter.get(job_id, 0) + 1
        self._counter[job_id] = n
        number = max(self._slurm_counter.get(job_id, 0), stored_next)
        self._slurm_counter[job_id] = number + 1
        group = TaskStep(id=f"{job_id}{STEP_SEPARATOR}{n}", job_id=job_id, number=number)
        for task, node_id in enumerate(nodes):
            step = Step(id=f"{group.id}.{task}", job_id=job_id, epoch=epoch, node_id=node_id)
            step.group, step.task = group, task
            group.tasks.append(step)
            self.by_id[step.id] = step
        self.groups[group.id] = group
        self._changed(group)
        return group

    def restored(self, run: Step | TaskStep) -> None:
        """A step a master that took over read back from the store: known, numbered on."""
        tasks = run.tasks if isinstance(run, TaskStep) else [run]
        for step in tasks:
            self.by_id[step.id] = step
        n = int(run.id[len(run.job_id) + len(STEP_SEPARATOR) :].split(".")[0])
        self._counter[run.job_id] = max(self._counter.get(run.job_id, 0), n)
        if isinstance(run, TaskStep):
            self.groups[run.id] = run
            numbered = self._slurm_counter.get(run.job_id, 0)
            self._slurm_counter[run.job_id] = max(numbered, run.number + 1)

    def number_from(self, job_id: str, number: int) -> None:
        """The job's next Slurm step number is `number` at least (its stored ones)."""
        if job_id in self._slurm_counter:
            self._slurm_counter[job_id] = max(self._slurm_counter[job_id], number)

    def _changed(self, run: Step | TaskStep) -> None:
        for told in self.on_change:
            told(run)

    def numbering(self, job_id: str) -> bool:
        """Whether this master numbers the job's steps already (it started one)."""
        return job_id in self._slurm_counter

    def of_job(self, job_id: str) -> list[Step]:
        return [s for s in self.by_id.values() if s.job_id == job_id]

    def end(self, step: Step, exit_code: int | None, error: str | None = None) -> None:
        step.exit_code = exit_code
        step.error = error
        step.done = True
        step.finished.set()
        group = step.group
        self._changed(step if group is None else group)
        if group is None or group.done:
            return
        for told in self.on_task_end:
            told(step)
        if group.ended:
            self._end_group(group)
            for told_group in self.on_group_end:
                told_group(group)

    def _end_group(self, group: TaskStep, error: str | None = None) -> None:
        codes = [t.exit_code for t in group.tasks]
        known = [c for c in codes if c is not None]
        # srun's: the highest; a task that never ran (no code) counts as a failure.
        group.exit_code = max(known) if len(known) == len(codes) else max([1, *known])
        if group.failed_task is not None:  # the task that failed first, not its victims
            first = group.tasks[group.failed_task].exit_code
            group.exit_code = 1 if first is None else first
            # ...unless it killed others: Slurm's srun -K cancels the step, which ends
            # with the signal its tasks were killed by (CANCELLED 0:15, srun exits 143).
            killed = [
                c
                for i, t in enumerate(group.tasks)
                if i != group.failed_task and (c := t.exit_code) is not None and c > 128
            ]
            if killed:
                group.exit_code, group.stopped = max(killed), True
        group.error = error or next((t.error for t in group.tasks if t.error), None)
        group.done = True
        group.finished.set()

    def node_exited(
        self, step: Step, node_id: str, exit_code: int | None, error: str | None = None
    ) -> bool:
        """One node's process of the step ended; True when it was the last (the step's
        exit code is then the first non-zero one, as a job's)."""
        step.exits[node_id] = exit_code
        if error is not None and step.error is None:
            step.error = f"{node_id}: {error}" if len(step.on_nodes) > 1 else error
        if not all(n in step.exits for n in step.on_nodes):
            self._changed(step)
            return False
        codes = [step.exits[n] for n in step.on_nodes]
        bad = [c for c in codes if c != 0]
        self.end(step, bad[0] if bad else codes[0], step.error)
        return True

    def forget_job(self, job_id: str) -> list[Step]:
        """The job ended: its live steps are ended too (their processes are killed)."""
        live = []
        for group in [g for g in self.groups.values() if g.job_id == job_id]:
            if not group.done:  # first: its tasks' ends below are the job's, not theirs
                self._end_group(group, "the job ended")
            del self.groups[group.id]
        for step in self.of_job(job_id):
            if not step.done:
                live.append(step)
                self.end(step, None, "the job ended")
            del self.by_id[step.id]
        had_steps = self._counter.pop(job_id, None) is not None
        had_steps |= self._slurm_counter.pop(job_id, None) is not None
        if had_steps:  # most jobs never had one: nothing of theirs to forget in the store
            for told in self.on_forget:
                told(job_id)
        return live
