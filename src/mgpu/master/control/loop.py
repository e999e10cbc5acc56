"""The scheduling loop: snapshot → `schedule()` → apply, whenever something changed.

`inputs` reads the controller's state into the scheduler's inputs (one value,
master/state/snapshot.py), the same for every kind of pass; `decide` runs the pure core on
them; `apply` carries the decisions out, re-checking each against the state as it is then,
as Nomad's plan applier does: a start whose node is gone or no longer schedulable, or whose
GPUs are no longer free, is dropped whole (the job stays queued and is planned again), never
half-applied; a preemption of a job that has meanwhile ended or is already being stopped is
dropped too.

A long queue (more than `LONG_QUEUE` jobs) splits the work as Slurm does between its main
scheduler and its backfill plugin.  The *quick pass*, on events, looks only at the head of
the queue: the first `QUICK_DEPTH` jobs of the last full pass's priority order still queued,
the jobs that full pass would have started (its backfill deeper in the queue), the jobs
queued since (`Head.fresh`, in submit order), and the next tasks of arrays held at their `%N`
cap; the pure core runs on those alone (`schedule()` with their priorities
computed now), so its cost does not grow with the queue.  It makes every start and
preemption.  The *full pass* (priorities, reasons and estimates of every queued job, the
order the quick passes start from) runs every few seconds: its snapshot is gathered a
slice at a time, the core runs on it in a worker thread (it is made of immutable values and
fresh containers), and its verdicts are written a slice at a time, so it never holds the
event loop.  It starts nothing itself: the quick pass that follows it does, on fresh state.
A short queue gets a full pass, on the loop, every time (a millisecond or two); with more
than `ESTIMATE_RUNNING` jobs running or `ESTIMATE_QUEUED` queued, the estimates (the
planner's timelines cost what the running and waiting jobs do) are left to one such pass at
most every `FULL_INTERVAL`.  The running jobs themselves are kept by the jobs' changes
(master/state/runindex.py), not walked at every pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice

from mgpu.config import ClusterConfig
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.control.nodes import NodeAdmin
from mgpu.master.control.passplan import Head, Plan
from mgpu.master.control.windows import ReservationWindows
from mgpu.master.runtime import gcpause
from mgpu.master.runtime.turns import bulk_turn
from mgpu.master.state.asks import AskRules
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.partscope import partition_scope, scoped
from mgpu.master.state.runindex import RunningIndex
from mgpu.master.state.shares import job_share_units
from mgpu.master.state.snapshot import (
    SchedulerInputs,
    assemble,
    collect,
    dependency_targets,
    job_request,
    scheduler_config,
)
from mgpu.model import DesiredState, EndReason, Job, JobState, WaitCode
from mgpu.scheduler import (
    ARRAY_LIMIT,
    DependencyTarget,
    JobRequest,
    Reservation,
    SchedulerConfig,
    UsageLedger,
    schedule,
)
from mgpu.scheduler.running import RunningSet
from mgpu.scheduler.types import code_of

log = logging.getLogger("mgpu.master")

__all__ = ["Head", "Limits", "Pacing", "Plan", "SchedulingLoop", "decide"]

REPLAN_INTERVAL = 5.0
"""Seconds between passes when nothing happened (age priority, expected starts)."""


PASS_BATCH = 0.01
"""Seconds the loop waits after a pass before the next: events arriving meanwhile are
planned together (Slurm: sched_min_interval)."""
BATCH_FACTOR = 10
"""A pass that had jobs queued is followed by at most this many times its length."""
LIVENESS_INTERVAL = 0.5
"""Seconds between two looks for nodes gone silent (`NodeAdmin.check_heartbeats`)."""
LONG_QUEUE = 200
"""Queued jobs beyond which passes split into quick and full ones (module docstring)."""
QUICK_DEPTH = 100
"""Jobs of the last full order a quick pass looks at, and as many fresh ones (Slurm:
default_queue_depth; the core's backfill looks at `backfill_depth` behind the head)."""
FULL_INTERVAL = 2.0
"""Least seconds between full passes of a long queue while things happen (at least 10x
the last one's length): every queued job has its reason and estimate within seconds."""
SLICE = 5_000
"""Jobs read or written per turn of the event loop by a full pass (a few milliseconds)."""
ESTIMATE_RUNNING = 1_000
"""Running jobs beyond which a short queue's passes at events leave the estimates (which
cost what the running jobs do) to a pass at most every FULL_INTERVAL."""
ESTIMATE_QUEUED = 200
"""Queued jobs beyond which the same holds: each waiting job's estimate is planned against
the running ones (with a thousand queued, the estimates were ~70 % of a pass; Slurm makes
them in its backfill cycle, not at every event)."""


@dataclass(slots=True)
class Limits:
    """The sizes at which the loop changes its ways (module docstring): tests lower them."""

    long_queue: int = LONG_QUEUE
    quick_depth: int = QUICK_DEPTH
    estimate_running: int = ESTIMATE_RUNNING
    estimate_queued: int = ESTIMATE_QUEUED


@dataclass(slots=True)
class Pacing:
    """When the loop last did each thing (monotonic seconds), and what it owes."""

    last_pass: float = 0.0
    """A short queue's last pass."""
    last_estimates: float = -math.inf
    estimates_owed: bool = False
    """A short queue's pass left the estimates out (`ESTIMATE_RUNNING`)."""
    last_liveness: float = -LIVENESS_INTERVAL
    last_full_start: float = -math.inf
    changed: bool = False
    """Something happened since the last full pass started."""
    next_backoff: float = math.inf
    """When the first retry backoff the last pass saw ends (wall clock)."""


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
        self.asks = AskRules.from_config(config)
        """The cluster's CPU and memory defaults per GPU (JobRequest.ask)."""
        self.targets = targets
        self.reservations = reservations
        """The active and future reservations at a time (master/control/reservations.py)."""
        self.limits = Limits()
        self.head = Head()
        self.pacing = Pacing()
        self._requests: dict[str, JobRequest] = {}
        self.kube = partition_scope(config)  # None: no Kubernetes partition
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
        self._dependents: dict[str, list[str]] = {}
        """Active job id → the waiting jobs that depend on it (as of the last full pass):
        its end puts them in the next quick pass of a long queue, not the next full one."""
        self.last_pass_time = 0.0
        self.last_pass_duration = 0.0
        self.loop_tick = state.clock.monotonic()
        """When the loop last went round, monotonic seconds (readyz)."""
        self.last_full_seconds = 0.0
        """Wall time of the last full pass (its slices and its worker thread)."""
        default_limit = scheduler_config(config.scheduling).default_time_limit
        self.running = RunningIndex(state.jobs, default_limit)
        """The running jobs as the scheduler sees them, kept by every job's change."""
        life.uow.on_persist = self.running.touched
        self.full_due = False
        """A full pass of a long queue is due (`run` starts it as a task)."""
        self._full: asyncio.Task[None] | None = None
        life.on_end.append(self.forget)
        life.on_requeue.append(lambda job: self.queued((job,)))
        self.windows = ReservationWindows(state, life, reservations)
        """Stops the jobs not a reservation's own still on its GPUs when its window opens."""
        self.on_tick: list[Callable[[], None]] = []
        """Checks run every round after the nodes' (clients of terminals and allocations)."""

    # ---- the loop ---------------------------------------------------------

    async def run(self) -> None:
        """Schedule whenever something changed; re-plan unchanged queues every few seconds
        (priorities age, backoffs expire).  A long pass is followed by a pause of about its
        own length, so a huge queue cannot starve the API of the event loop; a short one by
        PASS_BATCH, so that the events of that moment (submits, ends, starts) are planned
        in one pass rather than one pass each: a pass costs what the cluster's size does."""
        try:
            while True:
                woken = True
                try:
                    await asyncio.wait_for(self.state.wakeup.wait(), timeout=1.0)
                except TimeoutError:
                    woken = False
                self.state.wakeup.clear()
                self.tick(woken)
                if self.full_due and self._full is None:
                    self.full_due = False
                    self._full = asyncio.create_task(self._full_task())
                await asyncio.sleep(self.pause())
        finally:  # the master stops: a full pass under way is not waited for
            if self._full is not None:
                self._full.cancel()

    def pause(self) -> float:
        """Seconds to wait after a pass, so that the events meanwhile (a stream of submits,
        ends, starts) are planned in one pass: about the pass's own length at least; when
        it had jobs queued, up to PASS_BATCH but no more than BATCH_FACTOR times its length
        (passes then take at most about a tenth of the loop while events stream, and a
        cheap pass on a small cluster is followed by a short wait, not PASS_BATCH: the
        next submit starts within a few ms).  After a pass with nothing queued (a job's
        end on a quiet cluster) the next event is planned at once."""
        spent = self.last_pass_duration
        queued = self.head.queued or self.head.fresh
        batch = min(PASS_BATCH, BATCH_FACTOR * spent) if queued else 0.0
        return min(1.0, max(batch, spent))

    def tick(self, woken: bool = True) -> None:
        """One round: lost nodes first, then a pass if something changed or one is due."""
        self.loop_tick = self.state.clock.monotonic()
        pacing = self.pacing
        try:
            now = self.state.clock.monotonic()
            # Liveness is a matter of seconds: twice a second, not at every turn (it looks
            # at every node).
            if now - pacing.last_liveness >= LIVENESS_INTERVAL:
                pacing.last_liveness = now
                self.nodes.check_heartbeats()
            self.windows.check()
            for check in self.on_tick:  # clients' heartbeats (terminals, allocations): few
                check()
            # With nothing new, a pass only ages priorities and moves estimates: at most
            # every REPLAN_INTERVAL, and for a long queue (a costly pass) rarer still, so
            # that these passes take at most about 2 % of the master's time.
            if self.long:
                self._tick_long(woken, now)
                return
            interval = max(REPLAN_INTERVAL, 50 * self.last_pass_duration)
            due = now - pacing.last_pass >= interval or self.backoff_expired()
            owed = pacing.estimates_owed and now - pacing.last_estimates >= FULL_INTERVAL
            if woken or due or owed:
                running = self.running.refresh(self.state.clock.time())
                cheap = (
                    len(running) <= self.limits.estimate_running
                    and self.head.queued + len(self.head.fresh) <= self.limits.estimate_queued
                )
                estimates = due or owed or cheap
                self.schedule_pass(estimates)
                pacing.last_pass = now
                pacing.estimates_owed = not estimates
                if estimates:
                    pacing.last_estimates = now
        except Exception:
            log.exception("scheduling pass failed")

    @property
    def long(self) -> bool:
        """Is the queue long enough for split passes (as of the last full pass)."""
        return self.head.queued + len(self.head.fresh) > self.limits.long_queue

    def _tick_long(self, woken: bool, now: float) -> None:
        """Quick passes on events; a full pass every few seconds while things happen, every
        REPLAN_INTERVAL or more when nothing does (priorities age, backoffs expire)."""
        pacing = self.pacing
        pacing.changed = pacing.changed or woken
        expired = self.backoff_expired()
        if woken or expired:
            self.apply(self.quick_plan())
        since = now - pacing.last_full_start
        busy = max(FULL_INTERVAL, 10 * self.last_full_seconds)
        idle = max(REPLAN_INTERVAL, 50 * self.last_full_seconds)
        if (pacing.changed and since >= busy) or since >= idle or expired:
            self.full_due = True

    async def _full_task(self) -> None:
        try:
            await self.full_pass()
        except Exception:
            log.exception("full scheduling pass failed")
        finally:
            self._full = None
            self.full_due = False  # asked for while it ran: the next round judges anew

    def backoff_expired(self) -> bool:
        """Has a retry backoff the last pass saw ended (not a look at every job: this is
        asked at every turn of the loop)."""
        return self.state.clock.time() >= self.pacing.next_backoff

    # ---- requests (cached per queued job) ---------------------------------

    def _request(self, job: Job) -> JobRequest:
        req = job_request(job, self.allowed_nodes(job.user), self.asks)
        return scoped(req, job, self.state.kube_nodes, self.kube) if self.kube else req

    def rescope(self) -> None:
        """A Kubernetes partition's Nodes changed: every request is built again."""
        self._requests.clear()
        self.state.wake()

    def request_for(self, job: Job) -> JobRequest:
        req = self._requests.get(job.id)
        if req is None:
            req = self._request(job)
            if job.state == JobState.QUEUED and job.id in self.state.jobs:
                self._requests[job.id] = req
        return req

    def cache_requests(self, jobs: Iterable[Job]) -> None:
        """Build the requests of jobs about to be queued (a big array's tasks, a slice at a
        time while it is submitted), so that the first pass after it does not hold the
        event loop building 100,000 of them."""
        for job in jobs:
            self._requests[job.id] = self._request(job)

    def queued_requests(self, now: float, jobs: Iterable[Job]) -> list[JobRequest]:
        """The requests of the queued ones among `jobs` (cached), in their order."""
        return collect(now, jobs, self.request_for, self._requests, None)[0]

    def queued(self, jobs: Iterable[Job]) -> None:
        """Jobs just queued (submitted, requeued, changed): the next quick pass looks at
        them, in this order, before any full pass has placed them in its order."""
        self.head.fresh.update(dict.fromkeys(job.id for job in jobs))

    def forget(self, job: Job) -> None:
        """The job left the queue for good (or changed): its cached verdicts go."""
        head = self.head
        self._requests.pop(job.id, None)
        self.priorities.pop(job.id, None)
        head.fresh_old.pop(job.id, None)
        if job.state is JobState.QUEUED and job.id in self.state.jobs:
            head.fresh[job.id] = None  # changed (held, released, updated): a fresh look
        else:
            head.fresh.pop(job.id, None)
        if job.state.terminal:  # its dependents may start now
            head.fresh.update(dict.fromkeys(self._dependents.pop(job.id, ())))

    def _note_dependents(self, job_id: str) -> None:
        """A waiting job: indexed by the active jobs it depends on (not arrays: a task's
        end rarely frees them, and their targets are many to look up)."""
        req = self._requests.get(job_id)
        if req is None or not req.dependencies:
            return
        for dep in req.dependencies:
            if dep not in self._deps_met and dep.job_id in self.state.jobs:
                self._dependents.setdefault(dep.job_id, []).append(job_id)

    def usage_at(self, now: float, running: RunningSet) -> dict[str, float]:
        """Each user's usage: ended work, decayed, plus the running work the set keeps."""
        usage = self.usage.snapshot(now)
        for user, used in running.usage(now, self.usage.billing).items():
            usage[user] = usage.get(user, 0.0) + used
        return usage

    # ---- a pass -----------------------------------------------------------

    def schedule_pass(self, estimates: bool = True) -> None:
        self.apply(self.plan(estimates))

    def config_now(self, quick: bool = False) -> SchedulerConfig:
        """The scheduler's config now (`quick`: no estimates but the blocked head's)."""
        config = replace(
            scheduler_config(self.config.scheduling),
            # The cluster's size is kept by the index: not summed over every node a pass.
            cluster_gpus=self.state.node_index.gpu_count(),
        )
        return replace(config, plan_jobs=0) if quick else config

    def inputs(
        self,
        now: float,
        queued: list[JobRequest],
        estimates: bool = True,
        users: frozenset[str] = frozenset(),
        thread: bool = False,
    ) -> SchedulerInputs:
        """What a pass over `queued` reads, for every kind of pass.  `estimates` False: none
        but the blocked head's; `users`: a quick pass's fairshare users (the last full
        pass's); `thread`: for a pass in a worker thread, which gets its own copies of what
        the loop changes (else the core runs at once, on the loop, on the kept values)."""
        running = self.running.refresh(now)
        arrays = self.running.arrays
        if thread:
            running, arrays = running.copy(), dict(arrays)
        index = self.state.node_index  # views and free pool kept up to date per node
        return SchedulerInputs(
            now=now,
            queued=queued,
            running=running,
            array_running=arrays,
            targets=dependency_targets(queued, self._deps_met, self.targets),
            usage=self.usage_at(now, running),
            config=self.config_now(quick=not estimates),
            nodes=index.views(),
            reservations=self.reservations(now),
            users=users,
            pool=index.pool(fork=thread),
        )

    def plan(self, estimates: bool = True) -> Plan:
        """A full pass's plan, on the loop (a short queue, or a test); without `estimates`
        the waiting jobs get none but the blocked head's (the last ones stand)."""
        now = self.state.clock.time()
        t0 = time.perf_counter()
        self.head.snapshot_taken()
        queued = self.queued_requests(now, self.state.jobs.values())
        plan = decide(self.inputs(now, queued, estimates))
        return replace(plan, seconds=time.perf_counter() - t0, estimated=estimates)

    async def full_pass(self, offload: bool = True) -> None:
        """A full pass that never holds the event loop: its snapshot read a slice at a time,
        the core in a worker thread (`offload`; else inline, for tests), its verdicts
        written a slice at a time.  It starts nothing: the quick pass it wakes does."""
        t0 = time.perf_counter()
        self.pacing.last_full_start = self.state.clock.monotonic()
        self.pacing.changed = False
        now = self.state.clock.time()
        self.head.snapshot_taken()
        jobs = list(self.state.jobs.values())
        queued: list[JobRequest] = []
        for k in range(0, len(jobs), SLICE):
            queued += self.queued_requests(now, jobs[k : k + SLICE])
            await bulk_turn()
        inputs = self.inputs(now, queued, thread=True)
        if offload:
            with gcpause.paused():  # the core pauses it too: one owner, on this thread
                plan = await asyncio.to_thread(decide, inputs)
        else:
            plan = decide(inputs)
        self.head.would_start = []
        if plan.decisions is not None:  # decided on a snapshot: the quick pass starts
            self.head.would_start = [start.job_id for start in plan.decisions.starts]
            plan.decisions.starts.clear()
            plan.decisions.preempt.clear()
        await self._apply_slices(plan)
        self.last_full_seconds = time.perf_counter() - t0
        self.state.wake()

    async def _apply_slices(self, plan: Plan) -> None:
        """`apply` a full plan, its reasons written a slice at a time (the loop runs
        between).  Read from the plan's own dicts (nobody else changes them), not copied
        into lists: 100,000 tuples would each be tracked by the cyclic collector."""
        decisions = plan.decisions
        reasons: dict[str, str] = {}
        if decisions is not None:
            reasons, decisions.reasons = decisions.reasons, {}
        waiting, plan.eligibility.waiting = plan.eligibility.waiting, {}
        self.apply(plan, timed=False)  # its time is its own (`last_full_seconds`)
        jobs, queued = self.state.jobs, JobState.QUEUED
        next_backoff = math.inf
        items = iter(waiting.items())
        for _ in range(0, len(waiting), SLICE):
            for job_id, why in islice(items, SLICE):
                job = jobs.get(job_id)
                if job is not None:
                    job.reason, job.reason_code = why, code_of(why)
                    if plan.now < job.not_before < next_backoff:
                        next_backoff = job.not_before
                    self._note_dependents(job_id)
            await bulk_turn()
        self.pacing.next_backoff = min(self.pacing.next_backoff, next_backoff)
        items = iter(reasons.items())
        for _ in range(0, len(reasons), SLICE):
            for job_id, why in islice(items, SLICE):
                job = jobs.get(job_id)
                if job is not None and job.state is queued:
                    job.reason, job.reason_code = why, code_of(why)
            await bulk_turn()

    # ---- the quick pass ---------------------------------------------------

    def quick_plan(self) -> Plan:
        """The head of a long queue only (module docstring)."""
        now = self.state.clock.time()
        t0 = time.perf_counter()
        picked = self.head.pick(self.state.jobs, self.limits.quick_depth)
        queued = [self.request_for(job) for job in picked]
        plan = decide(self.inputs(now, queued, estimates=False, users=self.head.users), True)
        return replace(plan, seconds=time.perf_counter() - t0)

    def apply(self, plan: Plan, timed: bool = True) -> None:
        """Carry out `plan`, each decision re-checked against the state as it is now."""
        t0 = time.perf_counter()
        jobs = self.state.jobs
        verdict = plan.eligibility
        for job_id, why in verdict.cancel.items():
            job = jobs.get(job_id)
            if job is not None and job.state == JobState.QUEUED:
                self.life.finish(job, EndReason.DEPENDENCY_NEVER, why)
        next_backoff = math.inf
        if not plan.quick:
            self._dependents = {}  # made anew from this pass's waiting jobs
        for job_id, why in verdict.waiting.items():
            job = jobs.get(job_id)
            if job is not None:
                # advisory and changing: in memory, not written each pass
                job.reason, job.reason_code = why, code_of(why)
                if job.reason_code == WaitCode.DEPENDENCY and not job.waited_on_dependency:
                    job.waited_on_dependency = True  # once: sacct's Reason after it ran
                    self.life.uow.persist(job)
                if plan.now < job.not_before < next_backoff:
                    next_backoff = job.not_before
                self._note_dependents(job_id)
        if plan.quick:  # it saw a few jobs: the others' backoffs stand
            self.pacing.next_backoff = min(self.pacing.next_backoff, next_backoff)
        else:
            self.pacing.next_backoff = next_backoff
            self.head.full_applied(plan)
        # Ended as required: that never changes, so later passes need not look them up.
        self._deps_met.update(verdict.satisfied)
        decisions = plan.decisions
        if decisions is not None:
            self.priorities.update(decisions.priorities)
            if not plan.quick:
                self.factors = decisions.factors
            if not plan.quick and plan.estimated:
                self.expected_start = dict(decisions.expected_start)
                self.waiting_on = dict(decisions.waiting_on)
            for start in decisions.starts:
                job = jobs.get(start.job_id)
                if job is None or job.state != JobState.QUEUED:
                    continue
                placements = [(p.node_id, list(p.gpu_ids)) for p in start.placements]
                share = job_share_units(job)
                ask = self.request_for(job).ask
                held = [(p.cpus, p.mem_mb) for p in start.placements]  # as the core counted
                free, room = self.state.free, self.state.room
                if not all(
                    free(n, g, share) and room(n, *h, ask.exclusive)
                    for (n, g), h in zip(placements, held, strict=True)
                ):
                    log.info("start of %s dropped: %s changed since the plan", job.id, placements)
                    continue
                self.life.start(job, placements, held)
                self._requests.pop(job.id, None)
                self.expected_start.pop(job.id, None)
                self.waiting_on.pop(job.id, None)
            for job_id in decisions.preempt:
                job = jobs.get(job_id)
                running = job is not None and job.state == JobState.RUNNING
                if running and job is not None and job.desired is DesiredState.RUN:
                    self.life.request_stop(job, EndReason.PREEMPTED)
            queued = JobState.QUEUED
            for job_id, why in decisions.reasons.items():  # every waiting job: kept lean
                job = jobs.get(job_id)
                if job is not None and job.state is queued:  # (one started above is not)
                    job.reason, job.reason_code = why, code_of(why)
        elif not plan.quick:
            self.expected_start, self.waiting_on = {}, {}
        self.last_pass_time = plan.now  # a pass with nothing eligible is still a pass (readyz)
        if timed:  # the loop paces itself by the passes it runs on the loop
            self.last_pass_duration = plan.seconds + time.perf_counter() - t0


def decide(inputs: SchedulerInputs, quick: bool = False) -> Plan:
    """A pass's verdicts from plain values: no controller state is read (so a full pass may
    run in a worker thread while the loop goes on, on its own copies).  A full pass's plan
    also says what the quick passes that follow start from; a `quick` one's, only what to
    do now."""
    t0 = time.perf_counter()
    prepared = assemble(inputs)
    decisions = None if prepared.snapshot is None else schedule(prepared.snapshot, inputs.pool)
    if quick:
        return Plan(inputs.now, prepared.eligibility, decisions, time.perf_counter() - t0, True)
    capped: dict[str, list[str]] = {}
    waiting = prepared.eligibility.waiting
    for req in inputs.queued:  # tasks of one array share one verdict: kept for quick passes
        if req.array_id is not None and waiting.get(req.job_id, "").startswith(ARRAY_LIMIT):
            capped.setdefault(req.array_id, []).append(req.job_id)
    users = frozenset(r.user for r in prepared.eligibility.eligible)
    seconds = time.perf_counter() - t0
    return Plan(
        inputs.now,
        prepared.eligibility,
        decisions,
        seconds,
        capped=capped,
        queued=len(inputs.queued),
        users=users,
    )
