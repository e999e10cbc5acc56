"""Discrete-event replay of a trace through the real scheduler core.

The clock is virtual: it jumps from one event time to the next.  Events are submissions
(from the trace, already in time order) and job ends (a heap).  At each distinct time

1. every job ending then releases its GPUs, every job submitted then joins the queue;
2. `schedule(Snapshot(...))` is called once — the very function the master calls, on the
   queued jobs `eligibility()` lets through, as the master does — unless nothing is
   pending, or no GPU is free and no running job is preemptible (no start and no
   preemption is then possible).  A job whose dependency (the CSV `dependency` column)
   can never be satisfied is cancelled then, as the master cancels it: it never starts;
3. its starts are applied: a job started at `now` ends at `now + min(run, time_limit)`,
   i.e. it is killed at its limit as the master would (counted as a timeout); its
   preemptions requeue the victims (they restart from scratch later) and, since the
   preempting job starts only on a later pass, the pass is repeated at the same time.

A job ends "completed", or "timeout" when killed at its limit (which fails `afterok`).

Shares (`gpus` below 1 in a CSV trace) are requests for part of one GPU, packed by the
core as in the master; utilisation counts what is allocated (F x time for a share).
Reservations (`SimConfig.reservations`) are passed in every snapshot until they end, and
their starts and ends are event times of their own; jobs name theirs in the CSV
`reservation` column.  With `SimConfig.estimates` the planner runs on every pass (with a
budget in jobs only, so that a replay does not depend on the machine's speed), and each
job that did not start in the pass of its submission keeps the `expected_start` that pass
gave it, for `report.estimate_metrics` to compare with its real start.

Mapping a trace job onto a request (`to_request`): a job of at most `gpus_per_node`
GPUs asks for plain `gpus=N` (one node); a wider one is `distributed=True` with `gpus=N`,
so placement may split it over nodes, fewest nodes first — like an MPI job of the log.
GPUs are capped at the cluster size.  The time limit is the trace's requested time when
it gives one, else `time_limit_factor × run time` (so 1.0 means perfect estimates, the
textbook setting for EASY backfill); a factor of 0 leaves the limit to the scheduler's
default (`SchedulerConfig.default_time_limit`, 24 h).

CPUs and memory: simulated nodes offer `ClusterShape.cpus_per_node` and `mem_per_node_mb`
(0: they do not say, and every job shares them as before); a job asks for the CSV's `cpus`
and `mem_mb`, or the defaults per GPU (`asks.py`), and the core places it where they are
free, as in the master.

Fairshare usage is the master's ledger (`scheduler/usage.py`), charging by
`SchedulerConfig.billing`: each ended attempt's
GPU-seconds, added when it ends and halved every half-life after (default 7 days, as
`scheduling.fairshare_half_life_hours`), plus the GPU-seconds of running attempts so far,
which are registered as they start and stop so that a snapshot costs one `exp` in all.
Running jobs carry what their priority is computed from (user, submit time, GPUs, user
priority), so the core weighs preemption victims exactly as it does in the master.

Costs per event time: O(nodes changed) for the node views, O(queue + running) to build
the snapshot, plus the scheduler pass itself.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from mgpu.resources import NO_ASK
from mgpu.scheduler import (
    SHARE_UNITS,
    Dependency,
    DependencyTarget,
    JobRequest,
    NodeView,
    Placement,
    Reservation,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    UsageLedger,
    eligibility,
    requested_gpus,
    schedule,
)
from mgpu.scheduler.room import format_mb
from mgpu.scheduler.types import QueuePolicy

from .asks import NodeSize, trace_ask
from .traces import Trace, TraceJob

__all__ = [
    "DEFAULT_GPUS_PER_NODE",
    "ClusterShape",
    "JobResult",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "default_cluster",
    "describe_mapping",
    "simulate",
    "to_request",
]

DEFAULT_GPUS_PER_NODE = 8
DAY = 24 * 3600.0


class SimulationError(RuntimeError):
    """The scheduler returned a decision that cannot be applied (a bug in the core)."""


@dataclass(frozen=True, slots=True)
class ClusterShape:
    nodes: int
    gpus_per_node: int
    cpus_per_node: int = 0
    """CPUs each node offers (0: it does not say: jobs share them, none may ask for any)."""
    mem_per_node_mb: int = 0
    """Memory (MiB) each node offers (0: as for CPUs)."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def node(self) -> NodeSize:
        return NodeSize(self.gpus_per_node, self.cpus_per_node, self.mem_per_node_mb)


@dataclass(frozen=True, slots=True)
class SimConfig:
    cluster: ClusterShape
    policy: QueuePolicy = "backfill"
    time_limit_factor: float = 1.0
    """Unknown time limits become this × run time; 0 = the scheduler's default limit."""
    half_life: float = 7 * DAY
    """Fairshare usage decay, seconds."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Base scheduler settings; `queue_policy` and `cluster_gpus` are overridden."""
    reservations: tuple[Reservation, ...] = ()
    """Admin reservations to replay (node ids as the simulator names them: node001, ...)."""
    estimates: bool = False
    """Run the planner on every pass and keep each job's estimate at submit (slower)."""


@dataclass(slots=True)
class JobResult:
    job_id: str
    user: str
    gpus: int
    submit: float
    start: float = math.nan
    """Start of the last attempt (the one that finished)."""
    end: float = math.nan
    run: float = 0.0
    """Time the last attempt ran (the trace's run time, or less if killed at its limit)."""
    timed_out: bool = False
    requeues: int = 0
    cancelled: bool = False
    """Cancelled without running: a dependency that can never be satisfied."""
    share: int = 0
    """Share units of one GPU (a fractional job); 0 = whole GPUs."""
    queued: bool = False
    """It did not start in the pass of its submission (it waited in the queue)."""
    estimate: float = math.nan
    """`expected_start` that pass gave it (NaN: none, or `SimConfig.estimates` off)."""

    @property
    def finished(self) -> bool:
        return not math.isnan(self.end)


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    jobs: list[JobResult]
    pass_seconds: list[float]
    """Wall time of each `schedule()` call."""
    times: list[float]
    """Event times, ascending; `busy[i]` GPUs are busy from `times[i]` to `times[i+1]`
    (a share counting F)."""
    busy: list[float]
    busy_gpu_seconds: float
    capped: int
    """Jobs whose GPUs were cut down to the cluster size."""
    preemptions: int
    wall_seconds: float


def default_cluster(trace: Trace, gpus_per_node: int | None = None) -> ClusterShape:
    """The trace's own machine (SWF `MaxProcs`, else its widest job) in nodes of 8 GPUs."""
    per = gpus_per_node or DEFAULT_GPUS_PER_NODE
    widest = max((j.gpus for j in trace.jobs), default=1)
    total = trace.max_procs or widest
    return ClusterShape(max(1, math.ceil(total / per)), per)


def to_request(
    job: TraceJob,
    gpus: int,
    gpus_per_node: int,
    factor: float,
    job_id: str | None = None,
    dependencies: tuple[Dependency, ...] = (),
    node: NodeSize | None = None,
) -> JobRequest:
    """The request the simulated user submits for `job` (see the module docstring);
    `dependencies` name other requests' ids (the trace's own ids when `job_id` is None);
    `node`: what a node offers, for its CPUs and memory (`asks.trace_ask`)."""
    limit = job.time_limit
    if limit is None and factor > 0:
        limit = job.run * factor
    ask = NO_ASK
    if node is not None:
        ask, _ = trace_ask(job.cpus, job.mem_mb, gpus, bool(job.gpu_share), node)
    return JobRequest(
        ask=ask,
        job_id=job.job_id if job_id is None else job_id,
        user=job.user,
        submit_time=job.submit,
        gpus=1 if job.gpu_share else gpus,
        distributed=gpus > gpus_per_node and not job.gpu_share,
        time_limit=limit,
        priority=job.priority,
        preemptible=job.preemptible,
        dependencies=dependencies,
        gpu_share=job.gpu_share,
        reservation=job.reservation,
    )


class _Cluster:
    """Free and shared GPUs per node, with the NodeViews rebuilt only for nodes that changed."""

    def __init__(self, shape: ClusterShape) -> None:
        width = len(str(shape.nodes))
        self.ids = [f"node{i + 1:0{max(3, width)}d}" for i in range(shape.nodes)]
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        every = tuple(range(shape.gpus_per_node))
        self.every = every
        self.free = [set(every) for _ in self.ids]
        self.shared: list[dict[int, int]] = [{} for _ in self.ids]
        self.cpus, self.mem = shape.cpus_per_node, shape.mem_per_node_mb
        self.free_cpus = [self.cpus] * len(self.ids)
        self.free_mem = [self.mem] * len(self.ids)
        self.views = [self._view(i) for i in range(len(self.ids))]
        self.dirty: set[int] = set()
        self.total_free = shape.gpus
        self.busy_units = 0
        """Share units allocated (a whole GPU is `SHARE_UNITS`)."""

    def take(self, job_id: str, placements: Sequence[Placement]) -> int:
        """Allocate; the share units taken."""
        taken = 0
        for p in placements:
            i = self.index.get(p.node_id)
            ids = set(p.gpu_ids)
            if (
                i is None
                or len(ids) != len(p.gpu_ids)
                or not (ids <= self.free[i] if not p.share else self._fits(i, ids, p.share))
            ):
                raise SimulationError(
                    f"the scheduler started job {job_id} on GPUs {sorted(p.gpu_ids)} of "
                    f"{p.node_id}, which are not all free"
                )
            if p.cpus > self.free_cpus[i] or p.mem_mb > self.free_mem[i]:
                raise SimulationError(
                    f"the scheduler started job {job_id} with {p.cpus} CPUs and "
                    f"{p.mem_mb} MiB on {p.node_id}, which has {self.free_cpus[i]} CPUs and "
                    f"{self.free_mem[i]} MiB free"
                )
            self.free_cpus[i] -= p.cpus
            self.free_mem[i] -= p.mem_mb
            if p.share:
                shared = self.shared[i]
                for g in ids:
                    if g in self.free[i]:
                        self.free[i].discard(g)
                        self.total_free -= 1
                    shared[g] = shared.get(g, 0) + p.share
                taken += p.share * len(ids)
            else:
                self.free[i] -= ids
                self.total_free -= len(ids)
                taken += SHARE_UNITS * len(ids)
            self.dirty.add(i)
        self.busy_units += taken
        return taken

    def _fits(self, i: int, ids: set[int], share: int) -> bool:
        shared = self.shared[i]
        return all(
            g in self.free[i] or (g in shared and shared[g] + share <= SHARE_UNITS) for g in ids
        )

    def release(self, placements: Sequence[Placement]) -> None:
        for p in placements:
            i = self.index[p.node_id]
            self.free_cpus[i] += p.cpus
            self.free_mem[i] += p.mem_mb
            if p.share:
                shared = self.shared[i]
                for g in p.gpu_ids:
                    left = shared[g] - p.share
                    if left > 0:
                        shared[g] = left
                    else:
                        del shared[g]
                        self.free[i].add(g)
                        self.total_free += 1
                self.busy_units -= p.share * len(p.gpu_ids)
            else:
                self.free[i].update(p.gpu_ids)
                self.total_free += len(p.gpu_ids)
                self.busy_units -= SHARE_UNITS * len(p.gpu_ids)
            self.dirty.add(i)

    def _view(self, i: int) -> NodeView:
        return NodeView(
            self.ids[i],
            self.every,
            frozenset(self.free[i]),
            shared=dict(self.shared[i]),
            cpus=self.cpus,
            free_cpus=self.free_cpus[i],
            mem_mb=self.mem,
            free_mem_mb=self.free_mem[i],
        )

    def node_views(self) -> list[NodeView]:
        for i in self.dirty:
            self.views[i] = self._view(i)
        self.dirty.clear()
        return self.views


class _Replay:
    """The mutable state of one replay."""

    def __init__(self, jobs: Sequence[TraceJob], config: SimConfig) -> None:
        shape = config.cluster
        if shape.nodes < 1 or shape.gpus_per_node < 1:
            raise ValueError("the cluster needs at least one node with at least one GPU")
        self.config = config
        # The planner is costly and changes no decision: on only when estimates are asked
        # for, and then with a budget in jobs alone, so the replay is the same on any machine.
        plan = {"plan_seconds": None} if config.estimates else {"plan_jobs": 0}
        self.sched = replace(
            config.scheduler, queue_policy=config.policy, cluster_gpus=shape.gpus, **plan
        )
        self.unplanned = replace(self.sched, plan_jobs=0)
        self.reservations = sorted(config.reservations, key=lambda r: r.start)
        # Reservation starts and ends: event times of their own.
        self.boundaries = sorted({t for r in self.reservations for t in (r.start, r.end)})
        self.cluster = _Cluster(shape)
        self.usage = UsageLedger(config.half_life, config.scheduler.billing)
        self.jobs = sorted(jobs, key=lambda j: j.submit)
        self.requests: list[JobRequest] = []
        self.results: list[JobResult] = []
        self.capped = 0
        factor = config.time_limit_factor
        slots: dict[str, str] = {}
        for slot, job in enumerate(self.jobs):
            slots.setdefault(job.job_id, str(slot))
        self.has_dependencies = any(job.dependency for job in self.jobs)
        self.final: dict[str, str] = {}  # job id → how it ended, for dependencies
        for slot, job in enumerate(self.jobs):
            _check_room(job, shape)
            gpus = min(job.gpus, shape.gpus)
            self.capped += gpus < job.gpus
            deps = tuple(Dependency(kind, slots[t]) for kind, t in job.dependency if t in slots)
            # The scheduler sees the job's position as its id: trace ids need not be unique.
            req = to_request(job, gpus, shape.gpus_per_node, factor, str(slot), deps, shape.node)
            if job.cpus is not None or job.mem_mb is not None:
                self.capped += (
                    trace_ask(job.cpus, job.mem_mb, gpus, bool(job.gpu_share), shape.node)[1]
                    and gpus == job.gpus
                )
            self.requests.append(req)
            result = JobResult(job.job_id, job.user, req.gpus, job.submit, share=job.gpu_share)
            self.results.append(result)
        self.pending: dict[str, JobRequest] = {}
        self.sizes: dict[int, int] = {}  # pending jobs by GPUs asked for
        self.running: dict[str, RunningJob] = {}
        self.ends: list[tuple[float, int, int]] = []  # (time, attempt, slot)
        self.attempt = [0] * len(self.requests)
        self.preemptible_running = 0
        self.pass_seconds: list[float] = []
        self.times: list[float] = []
        self.busy: list[float] = []
        self.busy_gpu_seconds = 0.0
        self.preemptions = 0
        self.fresh: list[str] = []  # jobs submitted at this event time (for estimates)

    def run(self) -> None:
        n = len(self.requests)
        nxt = 0
        edge = 0  # next reservation boundary
        inf = math.inf
        bounds = self.boundaries
        while nxt < n or self.ends or (self.pending and edge < len(bounds)):
            now = min(
                self.requests[nxt].submit_time if nxt < n else inf,
                self._next_end(),
                bounds[edge] if edge < len(bounds) else inf,
            )
            while edge < len(bounds) and bounds[edge] <= now:
                edge += 1
            while self.ends and self.ends[0][0] <= now:
                _, attempt, slot = heapq.heappop(self.ends)
                if attempt == self.attempt[slot]:  # else: a preempted attempt's stale end
                    self._finish(slot, now)
            while nxt < n and self.requests[nxt].submit_time <= now:
                req = self.requests[nxt]
                self._queue(req)
                if self.config.estimates:
                    self.fresh.append(req.job_id)
                nxt += 1
            self._passes(now)
            self.fresh.clear()
            self._record(now)
            if not self.ends and nxt >= n and self.pending and edge >= len(bounds):
                break  # nothing left that could free GPUs: these jobs can never start

    def _next_end(self) -> float:
        # Drop ends of preempted attempts so they do not create empty event times.
        while self.ends and self.ends[0][1] != self.attempt[self.ends[0][2]]:
            heapq.heappop(self.ends)
        return self.ends[0][0] if self.ends else math.inf

    def _queue(self, req: JobRequest) -> None:
        self.pending[req.job_id] = req
        need = requested_gpus(req)  # 0 for a share: it may fit beside other shares
        self.sizes[need] = self.sizes.get(need, 0) + 1

    def _unqueue(self, req: JobRequest) -> None:
        need = requested_gpus(req)
        left = self.sizes[need] - 1
        if left:
            self.sizes[need] = left
        else:
            del self.sizes[need]

    def _passes(self, now: float) -> None:
        # A pass is skipped only when no policy could start anything: nothing pending, or
        # every pending job needs more GPUs than are free, and no preemption is possible.
        # That alone skips about 30 % of the passes of the NASA replays.  With estimates,
        # jobs just submitted get their pass anyway (their estimate at submit).
        for _ in range(8):
            if not self.sizes:
                return
            if (
                min(self.sizes) > self.cluster.total_free
                and not self.preemptible_running
                and not self.fresh
            ):
                return
            # A preemption frees GPUs for a job that starts on a later pass: pass again.
            if not self._pass(now):
                return

    def _pass(self, now: float) -> bool:
        """One scheduling pass; True if it preempted (so another pass is due)."""
        queued = list(self.pending.values())
        if self.has_dependencies:
            final = self.final
            targets = {
                d.job_id: (DependencyTarget(d.job_id, final.get(d.job_id)),)
                for r in queued
                for d in r.dependencies
            }
            verdict = eligibility(queued, now, targets)
            for job_id in verdict.cancel:
                self._cancel(job_id)
        else:  # no backoffs or arrays in a trace either: every queued job is let through
            verdict = eligibility(queued, now)
        pending = verdict.eligible
        snap = Snapshot(
            now=now,
            nodes=self.cluster.node_views(),
            pending=pending,
            running=list(self.running.values()),
            usage=self.usage.snapshot(now),
            # Estimates are kept only at submit: no planning in the other passes.
            config=self.sched if self.fresh else self.unplanned,
            reservations=[r for r in self.reservations if r.end > now],
        )
        t0 = time.perf_counter()
        decisions = schedule(snap)
        self.pass_seconds.append(time.perf_counter() - t0)
        for victim in decisions.preempt:
            self._preempt(victim, now)
        for start in decisions.starts:
            self._start(start.job_id, start.placements, now)
        if self.fresh:
            for job_id in self.fresh:
                if job_id in self.pending:
                    res = self.results[int(job_id)]
                    res.queued = True
                    res.estimate = decisions.expected_start.get(job_id, math.nan)
            self.fresh.clear()
        return bool(decisions.preempt)

    def _start(self, job_id: str, placements: tuple[Placement, ...], now: float) -> None:
        req = self.pending.pop(job_id, None)
        if req is None:
            raise SimulationError(f"the scheduler started job {job_id}, which is not pending")
        self._unqueue(req)
        units = self.cluster.take(job_id, placements)
        slot = int(job_id)
        limit = self.sched.default_time_limit if req.time_limit is None else req.time_limit
        run = self.jobs[slot].run
        res = self.results[slot]
        res.start = now
        res.run = min(run, limit)
        res.timed_out = run > limit
        self.running[job_id] = RunningJob(
            job_id,
            req.user,
            placements,
            now,
            req.time_limit,
            req.priority,
            req.preemptible,
            req.submit_time,
        )
        self.preemptible_running += req.preemptible
        cpus = sum(p.cpus for p in placements)
        mem = sum(p.mem_mb for p in placements)
        self.usage.start(req.user, units / SHARE_UNITS, now, cpus, mem)
        heapq.heappush(self.ends, (now + res.run, self.attempt[slot], slot))

    def _stop(self, job_id: str, now: float) -> RunningJob:
        job = self.running.pop(job_id)
        self.cluster.release(job.placements)
        self.preemptible_running -= job.preemptible
        self.usage.stop(job.user, job.gpu_amount, job.start_time, now, job.cpus, job.mem_mb)
        self.busy_gpu_seconds += job.gpu_amount * (now - job.start_time)
        return job

    def _finish(self, slot: int, now: float) -> None:
        job_id = self.requests[slot].job_id
        self._stop(job_id, now)
        res = self.results[slot]
        res.end = now
        self.final[job_id] = "timeout" if res.timed_out else "completed"

    def _cancel(self, job_id: str) -> None:
        self._unqueue(self.pending.pop(job_id))
        self.final[job_id] = "cancelled"
        self.results[int(job_id)].cancelled = True

    def _preempt(self, job_id: str, now: float) -> None:
        if job_id not in self.running:
            raise SimulationError(f"the scheduler preempted job {job_id}, which is not running")
        self._stop(job_id, now)
        slot = int(job_id)
        self.attempt[slot] += 1  # its pending end event is now stale
        self.results[slot].requeues += 1
        self.results[slot].start = math.nan
        self._queue(self.requests[slot])
        self.preemptions += 1

    def _record(self, now: float) -> None:
        busy = self.cluster.busy_units / SHARE_UNITS
        if self.times and self.times[-1] == now:
            self.busy[-1] = busy
        else:
            self.times.append(now)
            self.busy.append(busy)


def _check_room(job: TraceJob, shape: ClusterShape) -> None:
    """A job asking for CPUs or memory needs nodes that offer them (one sentence)."""
    if job.cpus is not None and not shape.cpus_per_node:
        raise ValueError(
            f"trace job {job.job_id} asks for {job.cpus} CPUs but the simulated nodes offer "
            "none: give --cpus-per-node"
        )
    if job.mem_mb is not None and not shape.mem_per_node_mb:
        raise ValueError(
            f"trace job {job.job_id} asks for {job.mem_mb} MiB of memory but the simulated "
            "nodes offer none: give --mem-per-node"
        )


def simulate(jobs: Sequence[TraceJob], config: SimConfig) -> SimResult:
    """Replay `jobs` on `config.cluster` with `config.policy`; see the module docstring."""
    t0 = time.perf_counter()
    replay = _Replay(jobs, config)
    replay.run()
    return SimResult(
        config=config,
        jobs=replay.results,
        pass_seconds=replay.pass_seconds,
        times=replay.times,
        busy=replay.busy,
        busy_gpu_seconds=replay.busy_gpu_seconds,
        capped=replay.capped,
        preemptions=replay.preemptions,
        wall_seconds=time.perf_counter() - t0,
    )


def describe_mapping(
    trace: Trace, shape: ClusterShape, time_limit_factor: float, load_factor: float = 1.0
) -> str:
    """One line saying how the trace was turned into GPU jobs, for every report."""
    unit = "1 GPU per SWF processor" if trace.format == "swf" else "GPUs as in the CSV"
    nodes = "1 node" if shape.nodes == 1 else f"{shape.nodes} nodes"
    size = f"{nodes} x {shape.gpus_per_node} GPUs = {shape.gpus} GPUs"
    if shape.cpus_per_node or shape.mem_per_node_mb:
        room = [f"{shape.cpus_per_node} CPUs"] if shape.cpus_per_node else []
        if shape.mem_per_node_mb:
            room.append(f"{format_mb(shape.mem_per_node_mb)} of memory")
        size += f" ({' and '.join(room)} per node)"
    if trace.max_procs:
        size += f" (the log's machine: {trace.max_procs} processors)"
    if time_limit_factor > 0:
        limits = f"unknown time limits = {time_limit_factor:g} x run time"
    else:
        limits = "unknown time limits = the scheduler's default"
    parts = [
        f"{unit} on {size}",
        f"jobs over {shape.gpus_per_node} GPUs run --distributed (split over nodes)",
        limits,
    ]
    if load_factor != 1:
        parts.append(f"arrivals {load_factor:g}x faster than logged")
    return "; ".join(parts)
