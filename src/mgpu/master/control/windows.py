"""A reservation's window opens: the jobs still on its GPUs that are not its own are stopped.

The scheduler keeps jobs that could run into a window off its GPUs (scheduler/core.py), so
this is for the jobs that got there anyway: those running when the reservation was made
with `--force` (Slurm's IGNORE_JOBS), and those whose time limit was raised since.  As Slurm
does for a reservation's nodes, they are stopped when the window opens: requeued as a
preemption is (no retry spent, the reason names the reservation), or cancelled when they
cannot be requeued (an interactive job, held by its client).

`check` runs every loop round; it looks only at the GPUs of open windows (the nodes' GPU
ledgers name each GPU's jobs), so it costs what the reservations' size does, not the queue's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.state.memory import ControllerState
from mgpu.model import DesiredState, EndReason, Job, JobState
from mgpu.scheduler import Reservation

log = logging.getLogger("mgpu.master")

__all__ = ["ReservationWindows"]


class ReservationWindows:
    def __init__(
        self,
        state: ControllerState,
        life: Lifecycle,
        reservations: Callable[[float], Sequence[Reservation]],
    ) -> None:
        self.state = state
        self.life = life
        self.reservations = reservations

    def check(self) -> None:
        """Stop every non-member job on the GPUs of a window that is open now."""
        now = self.state.clock.time()
        for r in self.reservations(now):
            if r.start > now:
                continue
            for job in self.intruders(r):
                why = f"by reservation {r.name}, whose window opened on its GPUs"
                log.info("job %s stopped %s", job.id, why)
                if job.interactive:  # its client holds it: it cannot go back to the queue
                    self.life.request_stop(job, EndReason.CANCELLED, f"cancelled {why}")
                else:
                    self.life.request_stop(job, EndReason.PREEMPTED, f"preempted {why}")

    def intruders(self, r: Reservation) -> Iterator[Job]:
        """Running jobs on `r`'s GPUs that are not `r`'s and are not being stopped yet."""
        seen: set[str] = set()
        for p in r.placements:
            node = self.state.nodes.get(p.node_id)
            if node is None:
                continue
            for g in p.gpu_ids:
                holder = node.busy.get(g)
                ids = [*node.shares.get(g, {})] + ([holder] if holder is not None else [])
                for job_id in ids:
                    job = self.state.jobs.get(job_id)
                    if job_id in seen or job is None:
                        continue
                    seen.add(job_id)
                    if (
                        job.state is JobState.RUNNING
                        and job.desired is DesiredState.RUN
                        and job.reservation != r.name
                    ):
                        yield job
