"""How long a follower (`mgpu logs -f`, `srun`'s step output, `mgpu alloc`'s steps) goes
on opening a stream that broke or went quiet: a few times in a row, and for as long as
the client waits for a failover ($MGPU_FAILOVER_WAIT, 30 s by default) since it broke,
whether the cluster has several masters or one that is restarting.  A step's `srun`
giving up in the middle of a master's restart would fail the batch script around it while
the step itself runs on (Slurm's srun talks to its slurmstepd, never to slurmctld)."""

from __future__ import annotations

import time

__all__ = ["Reopens"]

MIN_TRIES = 3
"""Opens tried after a break however long they took (each may itself look for the leader
through a failover)."""


class Reopens:
    """The breaks of one follower's stream: `again(error)` sleeps before the next open, or
    says to give up; `flowed()` once records come again."""

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self.tries = 0
        self.broke_at: float | None = None

    def flowed(self) -> None:
        self.tries, self.broke_at = 0, None

    def again(self) -> bool:
        """True after a short sleep (open again); False: give up."""
        now = time.monotonic()
        if self.broke_at is None:
            self.broke_at = now
        self.tries += 1
        if self.tries > MIN_TRIES and now - self.broke_at >= self.patience:
            return False
        time.sleep(min(2.0, 0.2 * 2**self.tries))  # one master restarting: a moment
        return True
