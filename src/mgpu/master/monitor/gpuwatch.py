"""What the master learns from GPU telemetry in the agents' heartbeats.

* GPUs used outside mgpu: a GPU whose foreign memory use (reported by the agent) exceeds
  `scheduling.foreign_memory_threshold_mb` is in `NodeRecord.foreign_blocked`, and the
  cluster leaves it out of the free GPUs it offers the scheduler.  A job waiting for GPUs
  says so, and who uses them (`job_fields`: `waiting for 1 GPU: gpu01 GPU 0 is used
  outside mgpu (3.0 GiB, pid 679, user bob)`).
* Shares not held to their limits: a `--gpu-share` job on a node whose agent says it has
  no MPS (`GpuTelemetry.shares_enforced` false) is told so once, in its output, unless
  its agent said for the job itself (`Slot.share_enforced`, from its `Started`: an agent
  that says so tells the job why, first thing in its stderr).
* Per job: the peak memory used on any one of its GPUs and the mean utilisation over
  every sample of its GPUs, kept on the job (`gpu_memory_peak_mb`, `gpu_util_mean`).
* Idle jobs: a running job none of whose GPUs reached `IDLE_UTIL_PCT` for
  `scheduling.idle_after_minutes` is flagged `idle`; `scheduling.idle_action` then
  notifies (a line in the job's output) or cancels interactive jobs.
* A measured cluster utilisation series for the dashboard's chart.

It decides, the controller acts: `heartbeat` returns what is to be done (`WatchAction`s:
block these GPUs, record that a job is idle, write a notice to its output, cancel it) and
the controller applies them (master/control/agents.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mgpu.config import ClusterConfig
from mgpu.gpuuse import outside_use
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job, JobState

log = logging.getLogger("mgpu.master")

IDLE_UTIL_PCT = 5.0
"""A GPU below this utilisation counts as unused."""
SERIES_STEP = 10.0
"""Seconds between two points of the measured utilisation series."""
SERIES_POINTS = int(24 * 3600 / SERIES_STEP)
SHOWN_OUTSIDE = 3
"""GPUs used outside mgpu a waiting job's reason names (then `and N more`)."""
UNENFORCED = (
    "mgpu: {node} does not hold GPU shares to their limits (no NVIDIA MPS there): this "
    "job's memory and compute limits are advisory, and a neighbour may take more than "
    "its share\n"
)


@dataclass(frozen=True, slots=True)
class BlockGpus:
    """Offer only the node's other GPUs to the scheduler (these are used outside mgpu)."""

    node_id: str
    gpus: frozenset[int]
    freed: bool
    """Some GPUs blocked before are free again: the scheduler should look."""


@dataclass(frozen=True, slots=True)
class JobIdle:
    """Record (audit log) that the job's GPUs have been idle for `detail`."""

    job_id: str
    detail: str


@dataclass(frozen=True, slots=True)
class Notice:
    """Write `text` to the job's stderr output."""

    job_id: str
    node_id: str
    text: str


@dataclass(frozen=True, slots=True)
class CancelIdle:
    """Cancel the job for leaving its GPUs idle; `reason` is its final reason."""

    job_id: str
    reason: str


WatchAction = BlockGpus | JobIdle | Notice | CancelIdle


class GpuWatch:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._last_active: dict[str, float] = {}
        self._idle_since: dict[str, float] = {}
        self._acted: set[str] = set()
        self._outside: dict[str, tuple[NodeRecord, dict[int, str]]] = {}
        """Node id -> the node, and its GPUs blocked for use outside mgpu -> who uses them
        (a sentence; a node that is away is left out)."""
        self._told_unenforced: set[str] = set()
        """Share jobs told their node does not enforce shares."""
        self.series: deque[tuple[float, float]] = deque(maxlen=SERIES_POINTS)
        """(time, mean utilisation % of every GPU with telemetry)."""

    # ---- heartbeats ---------------------------------------------------------

    def heartbeat(
        self,
        node: NodeRecord,
        jobs: Mapping[str, Job],
        nodes: Iterable[NodeRecord],
        now: float,
    ) -> list[WatchAction]:
        """What the telemetry `node` just sent means; `jobs` are the active jobs, `nodes`
        every node (for the utilisation series)."""
        actions: list[WatchAction] = []
        block = self._foreign(node)
        if block is not None:
            actions.append(block)
        actions += self._unenforced_shares(node, jobs)
        by_job: dict[str, list[tuple[float | None, int | None]]] = {}
        for index, job_id in node.busy.items():
            tel = node.telemetry.get(index)
            if tel is not None:
                by_job.setdefault(job_id, []).append((tel.utilization_pct, tel.memory_used_mb))
        for job_id, samples in by_job.items():
            job = jobs.get(job_id)
            if job is not None and job.state == JobState.RUNNING and job.start_time is not None:
                self._observe(job, samples, now)
        # This node's jobs only: checking every running job at every node's heartbeat
        # would cost O(nodes x jobs) a heartbeat interval.  A job is judged when one of
        # its nodes reports, which is within a heartbeat of the limit.
        actions += self._check_idle(jobs, now, node.jobs)
        self._sample_series(nodes, now)
        return actions

    def _foreign(self, node: NodeRecord) -> BlockGpus | None:
        threshold = self.config.scheduling.foreign_memory_threshold_mb
        blocked = frozenset(
            i for i, t in node.telemetry.items() if (t.foreign_memory_mb or 0) > threshold
        )
        if blocked:  # who uses them changes while they stay blocked
            self._outside[node.node_id] = (
                node,
                {
                    i: outside_use(node.node_id, i, node.telemetry[i].model_dump())
                    for i in sorted(blocked)
                },
            )
        else:
            self._outside.pop(node.node_id, None)
        if blocked == node.foreign_blocked:
            return None
        for i in sorted(blocked - node.foreign_blocked):
            log.warning("%s: not allocating it", self._outside[node.node_id][1][i])
        for i in sorted(node.foreign_blocked - blocked):
            log.info("%s GPU %d is no longer used outside mgpu", node.node_id, i)
        return BlockGpus(node.node_id, blocked, freed=bool(node.foreign_blocked - blocked))

    def _unenforced_shares(self, node: NodeRecord, jobs: Mapping[str, Job]) -> list[WatchAction]:
        """Tell each share job on `node` once that its share is not enforced there: one
        that started there and whose agent did not say for the job whether it is (one
        whose agent did was told by that agent)."""
        if not node.shares or not any(t.shares_enforced is False for t in node.telemetry.values()):
            return []
        actions: list[WatchAction] = []
        for tenants in node.shares.values():
            for job_id in sorted(tenants):
                if not _unsaid(jobs.get(job_id), node.node_id):
                    continue
                if job_id not in self._told_unenforced:
                    self._told_unenforced.add(job_id)
                    text = UNENFORCED.format(node=node.node_id)
                    actions.append(Notice(job_id, node.node_id, text))
        return actions

    def waiting_reason(self, job: Job) -> str | None:
        """A queued job's reason with the GPUs used outside mgpu that it could have had,
        and who uses them; None when that adds nothing."""
        reason = job.reason or ""
        if not self._outside or not reason.startswith("waiting for") or "GPU" not in reason:
            return None
        said = [
            text
            for node_id, (node, texts) in sorted(self._outside.items())
            if node.connected
            and (job.nodelist is None or node_id in job.nodelist)
            and node_id not in job.exclude
            for _, text in sorted(texts.items())
        ]
        if not said:
            return None
        shown = "; ".join(said[:SHOWN_OUTSIDE])
        more = len(said) - SHOWN_OUTSIDE
        if more > 0:
            shown += f"; and {more} more GPU{'' if more == 1 else 's'} used outside mgpu"
        return f"{reason}: {shown}"

    def _observe(
        self, job: Job, samples: list[tuple[float | None, int | None]], now: float
    ) -> None:
        mems = [m for _, m in samples if m is not None]
        if mems:
            job.gpu_memory_peak_mb = max(job.gpu_memory_peak_mb or 0, *mems)
        utils = [u for u, _ in samples if u is not None]
        if not utils:
            return
        n, mean = job.gpu_util_samples, job.gpu_util_mean or 0.0
        for u in utils:
            n += 1
            mean += (u - mean) / n
        job.gpu_util_samples, job.gpu_util_mean = n, mean
        if max(utils) >= IDLE_UTIL_PCT:
            self._last_active[job.id] = now
            self._idle_since.pop(job.id, None)
            self._acted.discard(job.id)
        else:
            # Idle time counts from the first sample this master saw, not from the start.
            self._last_active.setdefault(job.id, now)

    # ---- idle jobs ----------------------------------------------------------

    def _check_idle(
        self, jobs: Mapping[str, Job], now: float, among: Iterable[str]
    ) -> list[WatchAction]:
        s = self.config.scheduling
        limit = s.idle_after_minutes * 60
        actions: list[WatchAction] = []
        for job_id in sorted(among):
            last = self._last_active.get(job_id)
            if last is None:
                continue
            job = jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                self.forget(job_id)
                continue
            if now - last < limit or job_id in self._idle_since:
                continue
            self._idle_since[job_id] = last
            minutes = f"{s.idle_after_minutes:g}"
            log.info("job %s is idle: its GPUs were unused for %s minutes", job_id, minutes)
            actions.append(JobIdle(job_id, f"{minutes} minutes"))
            if not job.interactive or s.idle_action == "none" or job_id in self._acted:
                continue
            self._acted.add(job_id)
            if s.idle_action == "cancel":
                actions.append(CancelIdle(job_id, f"idle for {minutes} minutes"))
            else:
                text = f"mgpu: this job's GPUs have been idle for {minutes} minutes\n"
                node = job.allocation[0].node_id if job.allocation else ""
                actions.append(Notice(job_id, node, text))
        return actions

    def job_fields(self, job: Job) -> dict[str, Any]:
        """Fields added to an active job's JSON (a waiting job's reason says which GPUs
        are used outside mgpu, and by whom)."""
        since = self._idle_since.get(job.id) if job.state == JobState.RUNNING else None
        out: dict[str, Any] = {"idle": since is not None, "idle_since": since}
        if job.state == JobState.QUEUED and job.gpus:
            reason = self.waiting_reason(job)
            if reason is not None:
                out["reason"] = reason
        return out

    def forget(self, job_id: str) -> None:
        self._last_active.pop(job_id, None)
        self._idle_since.pop(job_id, None)
        self._acted.discard(job_id)
        self._told_unenforced.discard(job_id)

    # ---- measured utilisation -----------------------------------------------

    def _sample_series(self, nodes: Iterable[NodeRecord], now: float) -> None:
        if self.series and now - self.series[-1][0] < SERIES_STEP:
            return
        utils = measured_utilisation(nodes)
        if utils:
            self.series.append((now, sum(utils) / len(utils)))


def _unsaid(job: Job | None, node_id: str) -> bool:
    """The job started on `node_id`, and its agent did not say whether its share is held
    there (an older agent's `Started`)."""
    if job is None:
        return False
    return any(
        s.node_id == node_id and s.started and s.share_enforced is None for s in job.allocation
    )


def measured_utilisation(nodes: Iterable[NodeRecord]) -> list[float]:
    """Every connected GPU's last reported utilisation, in percent."""
    return [
        t.utilization_pct
        for n in nodes
        if n.connected
        for t in n.telemetry.values()
        if t.utilization_pct is not None
    ]
