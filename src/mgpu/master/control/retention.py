"""Retention: what finished is pruned after a while, a small slice at a time, off the hot path.

`retention:` in the cluster config (days; None keeps for ever): the output files of jobs
that ended `output_days` ago, the rows of jobs that ended `jobs_days` ago (their file goes
with them) and audit events `audit_days` old; submits' idempotency keys after a day. `run`
prunes every PRUNE_INTERVAL; each slice (`prune_slice`) deletes at most SLICE rows or files
and the task waits for a bulk turn between slices (`runtime.turns.bulk_turn`), so no long
loop holds the event loop however much is due. Output pruning walks the ended jobs by end
time from a cursor kept in the store's meta table (OUTPUTS_CURSOR), so a restart does not
walk them all again.

This task also wires the per-user output cap (`limits.max_output_per_user`,
store/outputs.py): at start, the output files already on disk are sized in one directory
scan in a worker thread, their users looked up a slice at a time, and added to the counts.
Bytes appended while that scan runs may be counted twice: an over-count, never an under-.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from mgpu.config import ClusterConfig
from mgpu.master.control import submitkeys
from mgpu.master.runtime.clock import Clock
from mgpu.master.runtime.turns import bulk_turn
from mgpu.master.store.base import Store
from mgpu.master.store.outputs import OutputStore
from mgpu.model import Job

log = logging.getLogger("mgpu.master")

__all__ = ["Retention"]

DAY = 86400.0
SLICE = 200
"""Rows or files deleted per slice."""
PRUNE_INTERVAL = 600.0
"""Seconds between pruning rounds."""
OUTPUTS_CURSOR = "retention_outputs_after"
"""Meta key: the end time and id of the last ended job whose output file was deleted."""


class Retention:
    def __init__(
        self,
        store: Store,
        outputs: OutputStore,
        config: ClusterConfig,
        clock: Clock,
        jobs: Mapping[str, Job],
    ) -> None:
        self.store = store
        self.outputs = outputs
        self.policy = config.retention
        self.clock = clock
        outputs.user_cap = config.limits.max_output_per_user
        outputs.owner = lambda job_id: job.user if (job := jobs.get(job_id)) else None
        end, _, job_id = (store.get_meta(OUTPUTS_CURSOR) or "0 ").partition(" ")
        self._outputs_after = (float(end), job_id)
        """The last ended job whose output file was deleted (end time, id)."""

    async def run(self) -> None:
        try:
            await self.count_usage()
        except Exception:
            log.exception("counting stored output per user failed")
        while True:
            try:
                while self.prune_slice(self.clock.time()):
                    await bulk_turn()
            except Exception:
                log.exception("retention pruning failed")
            await asyncio.sleep(PRUNE_INTERVAL)

    async def count_usage(self) -> None:
        """Add the output already on disk to the per-user counts (see the docstring)."""
        sizes = await asyncio.to_thread(self.outputs.file_sizes)
        ids = list(sizes)
        by_user: dict[str, int] = {}
        for i in range(0, len(ids), SLICE):
            for job_id, user in self.store.users_of(ids[i : i + SLICE]).items():
                by_user[user] = by_user.get(user, 0) + sizes[job_id]
            await bulk_turn()
        self.outputs.add_usage(by_user)

    def prune_slice(self, now: float) -> bool:
        """Delete one slice of what is due of each kind; True if more may be due."""
        more = False
        p = self.policy
        if p.output_days is not None:
            ended = self.store.ended_between(self._outputs_after, now - p.output_days * DAY, SLICE)
            for job_id, user, end in ended:
                self.outputs.delete(job_id, user)
                self._outputs_after = (end, job_id)
            if ended:
                end, job_id = self._outputs_after
                self.store.set_meta(OUTPUTS_CURSOR, f"{end!r} {job_id}")
            more |= len(ended) == SLICE
        if p.jobs_days is not None:
            gone = self.store.delete_ended_jobs(now - p.jobs_days * DAY, SLICE)
            self.store.delete_steps([job_id for job_id, _ in gone])  # their srun steps too
            for job_id, user in gone:
                self.outputs.delete(job_id, user)
            more |= len(gone) == SLICE
        if p.audit_days is not None:
            more |= self.store.delete_events_before(now - p.audit_days * DAY, SLICE) == SLICE
        more |= self.store.delete_submit_keys_before(now - submitkeys.KEPT_S, SLICE) == SLICE
        more |= self.store.delete_request_keys_before(now - submitkeys.KEPT_S, SLICE) == SLICE
        return more
