"""Job steps: extra processes started inside a running job's allocation.

`mpirun` inside an `--mpi` job starts its remote daemons through `mgpu rsh
HOST CMD`, which asks the master for a step on the allocated node that HOST
names; `mgpu srun` inside an allocation (`mgpu alloc`) starts one on the
allocation's nodes (master/control/allocations.py).  A step runs with the job's GPUs on
its nodes and ends with the job.  Agents know a step as a run whose id is
`JOBID.sN` (the same id on each of its nodes).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

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

    @property
    def on_nodes(self) -> list[str]:
        return self.nodes or [self.node_id]

    def runs_on(self, node_id: str) -> bool:
        return node_id in self.on_nodes

    def ended_on(self, node_id: str) -> bool:
        return self.done or node_id in self.exits


def is_step_id(run_id: str) -> bool:
    return STEP_SEPARATOR in run_id


class Steps:
    def __init__(self) -> None:
        self.by_id: dict[str, Step] = {}
        self._counter: dict[str, int] = {}

    def new(self, job_id: str, epoch: int, node_id: str) -> Step:
        n = self._counter.get(job_id, 0) + 1
        self._counter[job_id] = n
        step = Step(id=f"{job_id}{STEP_SEPARATOR}{n}", job_id=job_id, epoch=epoch, node_id=node_id)
        self.by_id[step.id] = step
        return step

    def of_job(self, job_id: str) -> list[Step]:
        return [s for s in self.by_id.values() if s.job_id == job_id]

    def end(self, step: Step, exit_code: int | None, error: str | None = None) -> None:
        step.exit_code = exit_code
        step.error = error
        step.done = True
        step.finished.set()

    def node_exited(
        self, step: Step, node_id: str, exit_code: int | None, error: str | None = None
    ) -> bool:
        """One node's process of the step ended; True when it was the last (the step's
        exit code is then the first non-zero one, as a job's)."""
        step.exits[node_id] = exit_code
        if error is not None and step.error is None:
            step.error = f"{node_id}: {error}" if len(step.on_nodes) > 1 else error
        if not all(n in step.exits for n in step.on_nodes):
            return False
        codes = [step.exits[n] for n in step.on_nodes]
        bad = [c for c in codes if c != 0]
        self.end(step, bad[0] if bad else codes[0], step.error)
        return True

    def forget_job(self, job_id: str) -> list[Step]:
        """The job ended: its live steps are ended too (their processes are killed)."""
        live = []
        for step in self.of_job(job_id):
            if not step.done:
                live.append(step)
                self.end(step, None, "the job ended")
            del self.by_id[step.id]
        self._counter.pop(job_id, None)
        return live
