"""The scheduling loop: snapshot → `schedule()` → apply, whenever something changed.

`plan` reads the controller's state into the scheduler's snapshot (master/snapshot.py) and
calls the pure core; `apply` carries the decisions out, re-checking each against the state
as it is then, as Nomad's plan applier does: a start whose node is gone or no longer
schedulable, or whose GPUs are no longer free, is dropped whole (the job stays queued and
is planned again), never half-applied; a preemption of a job that has meanwhile ended or is
already being stopped is dropped too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from mgpu.config import ClusterConfig
from mgpu.master.lifecycle import Lifecycle
from mgpu.master.nodes import NodeAdmin
from mgpu.master.shares import job_share_units
from mgpu.master.snapshot import job_request, prepare, scheduler_config
from mgpu.master.state import ControllerState
from mgpu.model import DesiredState, EndReason, Job, JobState
from mgpu.scheduler import (
    Decisions,
    DependencyTarget,
    Eligibility,
    JobRequest,
    Reservation,
    UsageLedger,
    schedule,
)

log = logging.getLogger("mgpu.master")

__all__ = ["Plan", "SchedulingLoop"]

REPLAN_INTERVAL = 5.0
"""Seconds between passes when nothing happened (age priority, expected starts)."""


PASS_BATCH = 0.01
"""Seconds the loop waits after a pass before the next: events arriving meanwhile are
planned together (Slurm: sched_min_interval)."""
LIVENESS_INTERVAL = 0.5
"""Seconds between two looks for nodes gone silent (`NodeAdmin.check_heartbeats`)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One pass's verdicts, computed from a snapshot and not applied yet."""

    now: float
    eligibility: Eligibility
    decisions: Decisions | None
    """None when no queued job was eligible (no scheduler call was needed)."""
    seconds: float
    """CPU time the planning took."""


class SchedulingLoop:
    def __init__(
        self,
        state: ControllerState,
        life: Lifecycle,
        nodes: NodeAdmin,
        usage: UsageLedger,
        config: ClusterConfig,
        allowed_nodes: Callable[[str], frozenset[str] | None],
        targets: Callable[[str], Sequence[DependencyTarget]],
        reservations: Callable[[float], Sequence[Reservation]] = lambda now: (),
    ) -> None:
        self.state = state
        self.life = life
        self.nodes = nodes
        self.usage = usage
        self.config = config
        self.allowed_nodes = allowed_nodes
        self.targets = targets
        self.reservations = reservations
        """The active and future reservations at a time (master/reservations.py)."""
        self._requests: dict[str, JobRequest] = {}
        self.priorities: dict[str, float] = {}
        self.factors: Mapping[str, dict[str, float]] = {}
        """The last pass's (jobs it did not see, like those waiting for a dependency, have
        none): read lazily, never copied."""
        self.expected_start: dict[str, float] = {}
        self.waiting_on: dict[str, tuple[str, ...]] = {}
        """The last pass's estimates and what each job waits for: in memory only (they
        change every pass; `mgpu queue` and `show` read them)."""
        self._deps_met: set[tuple[str, str]] = set()
        """Dependencies (kind, job id) known to be satisfied for good."""
        self.last_pass_time = 0.0
        self.last_pass_duration = 0.0
        self.loop_tick = state.clock.time()
        """When the loop last went round (readyz)."""
        self._last_full = 0.0
        self._last_liveness = -LIVENESS_INTERVAL
        self._next_backoff = math.inf
        """When the first retry backoff the last pass saw ends."""
        life.on_end.append(self.forget)
        self.on_tick: list[Callable[[], None]] = []
        """Checks run every round after the nodes' (clients of terminals and allocations)."""

    # ---- the loop ---------------------------------------------------------

    async def run(self) -> None:
        """Schedule whenever something changed; re-plan unchanged queues every few seconds
        (priorities age, backoffs expire).  A long pass is followed by a pause of about its
        own length, so a huge queue cannot starve the API of the event loop; a short one by
        PASS_BATCH, so that the events of that moment (submits, ends, starts) are planned
        in one pass rather than one pass each: a pass costs what the cluster's size does."""
        while True:
            woken = True
            try:
                await asyncio.wait_for(self.state.wakeup.wait(), timeout=1.0)
            except TimeoutError:
                woken = False
            self.state.wakeup.clear()
            self.tick(woken)
            await asyncio.sleep(min(1.0, max(PASS_BATCH, self.last_pass_duration)))

    def tick(self, woken: bool = True) -> None:
        """One round: lost nodes first, then a pass if something changed or one is due."""
        self.loop_tick = self.state.clock.time()
        try:
            now = self.state.clock.monotonic()
            # Liveness is a matter of seconds: twice a second, not at every turn (it looks
            # at every node).
            if now - self._last_liveness >= LIVENESS_INTERVAL:
                self._last_liveness = now
                self.nodes.check_heartbeats()
            for check in self.on_tick:  # clients' heartbeats (terminals, allocations): few
                check()
            # With nothing new, a pass only ages priorities and moves estimates: at most
            # every REPLAN_INTERVAL, and for a long queue (a costly pass) rarer still, so
            # that these passes take at most about 2 % of the master's time.
            interval = max(REPLAN_INTERVAL, 50 * self.last_pass_duration)
            due = now - self._last_full >= interval or self.backoff_expired()
            if woken or due:
                self.schedule_pass()
                self._last_full = now
        except Exception:
            log.exception("scheduling pass failed")

    def backoff_expired(self) -> bool:
        """Has a retry backoff the last pass saw ended (not a look at every job: this is
        asked at every turn of the loop)."""
        return self.state.clock.time() >= self._next_backoff

    # ---- requests (cached per queued job) ---------------------------------

    def request_for(self, job: Job) -> JobRequest:
        req = self._requests.get(job.id)
        if req is None:
            req = job_request(job, self.allowed_nodes(job.user))
            if job.state == JobState.QUEUED and job.id in self.state.jobs:
                self._requests[job.id] = req
        return req

    def cache_requests(self, jobs: Iterable[Job]) -> None:
        """Build the requests of jobs about to be queued (a big array's tasks, a slice at a
        time while it is submitted), so that the first pass after it does not hold the
        event loop building 100,000 of them."""
        for job in jobs:
            self._requests[job.id] = job_request(job, self.allowed_nodes(job.user))

    def forget(self, job: Job) -> None:
        """The job left the queue for good (or changed): its cached verdicts go."""
        self._requests.pop(job.id, None)
        self.priorities.pop(job.id, None)

    # ---- a pass -----------------------------------------------------------

    def schedule_pass(self) -> None:
        self.apply(self.plan())

    def plan(self) -> Plan:
        now = self.state.clock.time()
        t0 = time.perf_counter()
        prepared = prepare(
            now,
            self.state.jobs.values(),
            (),  # the nodes' views are kept up to date (`views`)
            self.usage,
            # The cluster's size is kept by the index: not summed over every node a pass.
            replace(
                scheduler_config(self.config.scheduling),
                cluster_gpus=self.state.node_index.gpu_count(),
            ),
            request_for=self.request_for,
            targets=self.targets,
            known_met=self._deps_met,
            reservations=self.reservations(now),
            views=self.state.node_index.views(),
            requests=self._requests,
        )
        decisions = None if prepared.snapshot is None else schedule(prepared.snapshot)
        return Plan(now, prepared.eligibility, decisions, time.perf_counter() - t0)

    def apply(self, plan: Plan) -> None:
        """Carry out `plan`, each decision re-checked against the state as it is now."""
        t0 = time.perf_counter()
        jobs = self.state.jobs
        verdict = plan.eligibility
        for job_id, why in verdict.cancel.items():
            job = jobs.get(job_id)
            if job is not None and job.state == JobState.QUEUED:
                self.life.finish(job, EndReason.DEPENDENCY_NEVER, why)
        next_backoff = math.inf
        for job_id, why in verdict.waiting.items():
            job = jobs.get(job_id)
            if job is not None:
                job.reason = why  # advisory and changing: in memory, not written each pass
                if plan.now < job.eligible_time < next_backoff:
                    next_backoff = job.eligible_time
        self._next_backoff = next_backoff
        # Ended as required: that never changes, so later passes need not look them up.
        self._deps_met.update(verdict.satisfied)
        decisions = plan.decisions
        if decisions is not None:
            self.priorities.update(decisions.priorities)
            self.factors = decisions.factors
            self.expected_start = dict(decisions.expected_start)
            self.waiting_on = dict(decisions.waiting_on)
            for start in decisions.starts:
                job = jobs.get(start.job_id)
                if job is None or job.state != JobState.QUEUED:
                    continue
                placements = [(p.node_id, list(p.gpu_ids)) for p in start.placements]
                share = job_share_units(job)
                if not all(self.state.free(n, g, share) for n, g in placements):
                    log.info("start of %s dropped: %s changed since the plan", job.id, placements)
                    continue
                self.life.start(job, placements)
                self._requests.pop(job.id, None)
            for job_id in decisions.preempt:
                job = jobs.get(job_id)
                running = job is not None and job.state == JobState.RUNNING
                if running and job is not None and job.desired is DesiredState.RUN:
                    self.life.request_stop(job, EndReason.PREEMPTED)
            queued = JobState.QUEUED
            for job_id, why in decisions.reasons.items():  # every waiting job: kept lean
                job = jobs.get(job_id)
                if job is not None and job.state is queued and job.reason != why:
                    job.reason = why  # (a job started above is no longer queued)
        else:
            self.expected_start, self.waiting_on = {}, {}
        self.last_pass_time = plan.now  # a pass with nothing eligible is still a pass (readyz)
        self.last_pass_duration = plan.seconds + time.perf_counter() - t0
