"""The master's controller: jobs and nodes in memory, mirrored to the store.

All mutation happens on the asyncio loop, so there is no locking.  The rules
that keep a GPU from being given twice and a job from running twice:

* a GPU is taken (`_allocate`) only from a node's free set and only while the
  job is written as running with a new epoch; it is given back (`_release`)
  only when every slot of that epoch has ended or the node is declared lost;
* agents echo the epoch in every job message; messages of an older epoch are
  ignored, and an agent that reports a process the master does not expect is
  told to kill it before anything else happens on that node.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mgpu import spec as specs
from mgpu.config import ClusterConfig
from mgpu.master.admission import Admission, AdmissionContext
from mgpu.master.auth import (
    Identity,
    TokenStore,
    job_of_token,
    matches_any,
    new_job_token,
    token_hash,
)
from mgpu.master.gpuwatch import GpuWatch
from mgpu.master.metrics import JobMetrics
from mgpu.master.nodeauth import HelloVerdict, NodeSecrets
from mgpu.master.outputs import OutputStore
from mgpu.master.reconcile import Expected, expectations, reconcile
from mgpu.master.registry import AgentLink, NodeRecord, Unsendable
from mgpu.master.snapshot import job_request, node_views, prepare, scheduler_config
from mgpu.master.steps import Step, Steps, is_step_id
from mgpu.master.store import Store
from mgpu.master.submit import JobSpec, SubmitDefaults, SubmitError, build_jobs
from mgpu.model import Attempt, Job, JobState, NodeState, Slot
from mgpu.protocol import (
    PROTOCOL_VERSION,
    Exited,
    Forget,
    Heartbeat,
    Hello,
    Kill,
    Launch,
    Output,
    PortReserved,
    ReservePort,
    Resume,
    RunningReport,
    Started,
    Welcome,
)
from mgpu.scheduler import (
    DependencyTarget,
    JobRequest,
    NodeView,
    SchedulerConfig,
    UsageLedger,
    schedule,
)
from mgpu.tlsutil import ensure_ca

log = logging.getLogger("mgpu.master")

REPLAN_INTERVAL = 5.0
"""Seconds between passes when nothing happened (age priority, expected starts)."""


class NotFound(KeyError):
    pass


class Conflict(ValueError):
    """A request that cannot be done in the current state; the message says why."""


@dataclass
class SubmitResult:
    job_id: str
    task_ids: list[str] | None = None
    dropped_env: list[str] = field(default_factory=list)
    """Reserved names in the submitted environment, not passed to the job."""


class Cluster:
    def __init__(self, state_dir: Path, config: ClusterConfig) -> None:
        self.state_dir = state_dir
        self.config = config
        self.store = Store(state_dir / "mgpu.db")
        self.outputs = OutputStore(state_dir / "output")
        self.jobs: dict[str, Job] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self._requests: dict[str, JobRequest] = {}
        self.steps = Steps()
        self._wake = asyncio.Event()
        self._job_events: dict[str, asyncio.Event] = {}
        self.last_pass_time = 0.0
        self.loop_tick = time.time()
        """When the scheduling loop last went round (readyz)."""
        self.last_pass_duration = 0.0
        self.counters: dict[str, int] = {"started": 0, "failed": 0, "completed": 0}
        self.job_metrics = JobMetrics()
        self.gpuwatch = GpuWatch(config)
        self.admission = Admission(config.site.admission, config.scheduling.max_gpus_per_user)
        self._submit_defaults = SubmitDefaults.from_config(config.scheduling)
        self._ids_in_admission: set[str] = set()
        self._unjudged: set[str] = set()
        """Jobs queued while no node was known: judged once nodes have joined."""
        self._rejudge_armed = False
        self._priorities: dict[str, float] = {}
        self._factors: dict[str, dict[str, float]] = {}
        self._expected_start: dict[str, float] = {}
        self.default_user = getpass.getuser()
        self._dirty: dict[str, Job] = {}
        self._lazy: dict[str, Job] = {}
        self._deps_met: set[tuple[str, str]] = set()
        """Dependencies (kind, job id) known to be satisfied for good."""
        self._lazy_armed = False
        self._outbox: list[tuple[AgentLink, BaseModel]] = []
        self._flush_armed = False
        half_life = config.scheduling.fairshare_half_life_hours * 3600
        self.usage = UsageLedger.loads(half_life, self.store.get_meta("usage"))
        self._usage_dirty = False
        self.fingerprint = ensure_ca(state_dir)
        self.tokens = TokenStore(self.store.db, state_dir, self.fingerprint)
        self.tokens.bootstrap(self.default_user)
        self.node_secrets = NodeSecrets(self.store.db)
        self._restricted = config.security.restricted_nodes()
        self._allowed_cache: dict[str, frozenset[str] | None] = {}
        self._job_tokens: dict[str, str] = {}
        """Running jobs' credentials in clear: memory only (the store keeps their hashes)."""
        self._load()

    def identify(self, token: str | None) -> Identity | None:
        """Who a token acts for: a user token, or a running job's own credential."""
        if not token:
            return None
        job_id = job_of_token(token)
        if job_id is None:
            ident = self.tokens.user(token)
            if ident is not None and ident.allow_root and not ident.owner:
                # An --allow-root grant counts only while the config allows grants.
                return replace(ident, allow_root=self.config.security.allow_root_jobs)
            return ident
        job = self.jobs.get(job_id)
        if job is None or job.state != JobState.RUNNING:
            return None
        if not matches_any(token, job.job_token_hashes):
            return None
        # A job acts as its user, with the root grant its submitter had (a root job may
        # submit root jobs), never as an admin.
        return Identity(
            user=job.user, admin=False, token_id=f"job:{job.id}", allow_root=job.allow_root
        )

    def root_grant(self, ident: Identity) -> bool:
        """May jobs this identity submits run as uid 0?  The owner's admin token may; a token
        with an `--allow-root` grant while `security.allow_root_jobs` is on (see identify);
        a job's credential as its job may."""
        return ident.owner or ident.allow_root

    def root_name(self, user: str) -> str | None:
        """Why `user` is reserved to the owner (a token for it, or a submit as it, would be a
        way to root jobs), or None: the master's own account, or uid 0 on this machine."""
        if user == self.default_user:
            return "the master's own account"
        return "root on the master's machine" if _is_uid0(user) else None

    # ---- access rules -----------------------------------------------------

    def allowed_nodes(self, user: str) -> frozenset[str] | None:
        """Nodes `user` may use under the access rules; None = every node."""
        if not self._restricted:
            return None
        if user not in self._allowed_cache:
            groups = _unix_groups(user)
            known = set(self.nodes) | set(self._restricted)
            self._allowed_cache[user] = frozenset(
                n
                for n in known
                if n not in self._restricted
                or user in self._restricted[n][0]
                or groups & self._restricted[n][1]
            )
        allowed = self._allowed_cache[user]
        if allowed is None:
            return None
        # Nodes that joined since and are not restricted are open too.
        return allowed | frozenset(n for n in self.nodes if n not in self._restricted)

    # ---- group commit -----------------------------------------------------

    def _persist(self, job: Job) -> None:
        """Mark a changed job for the next flush (one transaction per loop turn)."""
        self._dirty[job.id] = job
        self._arm_flush()

    def _persist_later(self, job: Job) -> None:
        """Mark a change that may wait for the next write (or a second at most)."""
        self._lazy[job.id] = job
        if not self._lazy_armed:
            self._lazy_armed = True
            try:
                asyncio.get_running_loop().call_later(1.0, self._flush_lazy)
            except RuntimeError:
                self._flush_lazy()

    def flush_all(self) -> None:
        """Everything to disk now (shutdown)."""
        self._dirty.update(self._lazy)
        self._lazy.clear()
        self.flush()

    def _flush_lazy(self) -> None:
        self._lazy_armed = False
        if self._lazy:
            self._dirty.update(self._lazy)
            self._lazy.clear()
            self._arm_flush()

    def _send(self, link: AgentLink, message: BaseModel) -> None:
        """Send to an agent after the state that led to it is on disk."""
        self._outbox.append((link, message))
        self._arm_flush()

    def _arm_flush(self) -> None:
        if self._flush_armed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._flush_armed = True
        loop.call_soon(self.flush)

    def flush(
        self,
        event: tuple[str, str | None, str | None, str] | None = None,
        detail: str | None = None,
    ) -> None:
        """Write every changed job in one transaction (with `event` for the audit log, if
        given), then send what waited on it."""
        self._flush_armed = False
        if self._dirty or event is not None:
            for job_id in self._dirty:
                self._lazy.pop(job_id, None)  # written now anyway
            jobs = list(self._dirty.values())
            self._dirty.clear()
            self.store.save_jobs(jobs, event=event, detail=detail)
        if self._usage_dirty:
            self._usage_dirty = False
            self.store.set_meta("usage", self.usage.dumps())
        outbox, self._outbox = self._outbox, []
        for link, message in outbox:
            try:
                link.send(message)
            except Unsendable as e:  # this message only: the rest of the batch goes out
                self._unsendable(link.node_id, message, str(e))

    def _unsendable(self, node_id: str, message: BaseModel, why: str) -> None:
        """A message that cannot be encoded fails its job (not the node, no retry spent)."""
        log.error("not sent to %s: %s %s", node_id, type(message).__name__, why)
        job_id = getattr(message, "job_id", None)
        if not isinstance(message, Launch) or job_id is None:
            return
        reason = f"could not be sent to {node_id}: {why}"
        step = self.steps.by_id.get(job_id)
        if step is not None:
            self.steps.end(step, None, reason)
            self.outputs.close(step.id)
            return
        job = self.jobs.get(job_id)
        if job is not None and job.state == JobState.RUNNING and job.epoch == message.epoch:
            self._kill_slots(job, "failed")  # ranks launched on other nodes
            self._finish(job, JobState.FAILED, reason)

    # ---- start-up ---------------------------------------------------------

    def _load(self) -> None:
        for node_id, rec in self.store.load_nodes().items():
            node = self._node_from_config(node_id)
            node.hostname = rec.get("hostname", "")
            node.ip = rec.get("ip", "")
            from mgpu.protocol import GpuDesc

            # Unchecked: a record from before hellos were bounded must not stop the master;
            # the agent's next hello replaces it with checked values.
            node.gpus = [GpuDesc.model_construct(**g) for g in rec.get("gpus", [])]
            node.gpu_source = rec.get("gpu_source", "unknown")
            node.drain_requested = bool(rec.get("drain_requested"))
            node.reason = rec.get("reason")
            node.failures = int(rec.get("failures", 0))
            node.features = list(rec.get("features", []))
            node.last_seen = time.time()  # grace: agents get a full timeout to come back
            node.state = NodeState.OFFLINE
        for entry in self.config.nodes:
            self._node_from_config(entry.node_id)
        running = []
        for job in self.store.load_active_jobs():
            self.jobs[job.id] = job
            if job.state == JobState.RUNNING:
                self._hold_resources(job)
                running.append(job)
        if running:
            self.store.save_jobs(running)  # rewritten: drops a credential stored in clear
        log.info(
            "loaded %d active jobs, %d nodes from %s",
            len(self.jobs),
            len(self.nodes),
            self.state_dir,
        )

    def _node_from_config(self, node_id: str) -> NodeRecord:
        node = self.nodes.get(node_id)
        if node is None:
            node = self.nodes[node_id] = NodeRecord(node_id=node_id)
            entry = self.config.node(node_id)
            if entry is not None:
                node.gpu_type = entry.gpu_type
                node.rack = entry.rack or entry.switch
                node.hostname = entry.hostname or ""
                node.ip = entry.ip or ""
                node.last_seen = time.time()
        return node

    def _hold_resources(self, job: Job) -> None:
        """Mark the GPUs of a running job busy (used when loading state)."""
        for slot in job.allocation:
            node = self._node_from_config(slot.node_id)
            if not slot.done:
                node.jobs.add(job.id)
                for g in slot.gpu_ids:
                    node.busy[g] = job.id

    # ---- submit -----------------------------------------------------------

    async def submit(
        self,
        spec: JobSpec,
        user: str | None,
        address: str | None = None,
        allow_root: bool = False,
    ) -> SubmitResult:
        """Build, admit, store: raises SubmitError with one sentence, storing nothing.
        allow_root: the submitter's grant (root_grant), recorded on every job."""
        jobs = build_jobs(
            spec, user or self.default_user, self._submit_defaults, time.time(), self._new_job_id
        )
        for job in jobs:
            job.allow_root = allow_root
        base_id = jobs[0].array_job_id or jobs[0].id
        ctx = AdmissionContext(
            nodes=self._node_views() if self._any_node_joined() else [],
            request_for=self._request_for,
            job_exists=lambda job_id: self._find_dependency_target(job_id) is not None,
            groups=_unix_groups,
        )
        self._ids_in_admission.add(base_id)  # the site validator may take a while
        try:
            await self.admission.admit(jobs, spec, ctx)
        finally:
            self._ids_in_admission.discard(base_id)
        self.store.save_jobs(jobs, event=("submit", jobs[0].user, address, base_id))
        for job in jobs:
            self.jobs[job.id] = job
        if not ctx.nodes:
            self._unjudged.update(job.id for job in jobs)
            if self._any_node_joined():  # while the site validator ran
                self._judge_unjudged_later()
        self.wake()
        task_ids = [j.id for j in jobs] if jobs[0].array_job_id is not None else None
        return SubmitResult(base_id, task_ids, spec.dropped_env)

    def _new_job_id(self) -> str:
        job_id = specs.new_job_id()
        while job_id in self.jobs or job_id in self._ids_in_admission or self.store.has_job(job_id):
            job_id = specs.new_job_id()
        return job_id

    def _any_node_joined(self) -> bool:
        """Whether any node has ever said hello (nodes listed in the config but never seen
        have no GPUs to judge a job against)."""
        return any(n.gpu_source != "unknown" for n in self.nodes.values())

    def _judge_unjudged_later(self) -> None:
        """Jobs queued before any node was known could not be judged at submit.  Once a
        node has joined, give the others one heartbeat interval to join too (agents that
        start together), then fail those that could never run, with the sentence submit
        would have given."""
        if not self._unjudged or self._rejudge_armed:
            return
        self._rejudge_armed = True
        delay = self.config.networking.heartbeat_interval
        try:
            asyncio.get_running_loop().call_later(delay, self._judge_unjudged)
        except RuntimeError:
            self._judge_unjudged()

    def _judge_unjudged(self) -> None:
        self._rejudge_armed = False
        unjudged, self._unjudged = self._unjudged, set()
        nodes = self._node_views()
        verdicts: dict[str, str | None] = {}  # the tasks of an array share one
        for job_id in sorted(unjudged):
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.QUEUED:
                continue
            key = job.array_job_id or job.id
            if key not in verdicts:
                verdicts[key] = self.admission.never_fits(job, nodes, self._request_for)
            why = verdicts[key]
            if why is not None:
                self._finish(job, JobState.FAILED, why)

    def _find_dependency_target(self, job_id: str) -> list[Job] | None:
        job = self.get_job(job_id)
        if job is not None:
            return [job]
        tasks = self.array_tasks(job_id)
        return tasks or None

    # ---- queries ----------------------------------------------------------

    def get_job(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id) or self._dirty.get(job_id)
        if job is None:
            job = self.store.get_job(job_id)
        return job

    def get_jobs(self, job_ids: list[str]) -> dict[str, Job]:
        """Many jobs by id: from memory, the rest in one store query (unknown ids left out)."""
        found: dict[str, Job] = {}
        missing = []
        for job_id in job_ids:
            job = self.jobs.get(job_id) or self._dirty.get(job_id)
            if job is None:
                missing.append(job_id)
            else:
                found[job_id] = job
        if missing:
            found.update(self.store.get_jobs(missing))
        return found

    def array_tasks(self, array_id: str) -> list[Job]:
        if len(array_id) != 8:
            return []
        found = {j.id: j for j in self.store.jobs_with_prefix(array_id + "_")}
        for j in self.jobs.values():
            if j.array_job_id == array_id:
                found[j.id] = j
        return sorted(found.values(), key=lambda j: j.array_task_id or 0)

    def public_job(self, job: Job) -> dict[str, Any]:
        out = job.to_public()
        if not job.terminal:
            out.update(self.gpuwatch.job_fields(job))
        if job.state == JobState.QUEUED:
            out["priority_value"] = self._priorities.get(job.id)
            out["priority_factors"] = self._factors.get(job.id)
            out["expected_start"] = self._expected_start.get(job.id)
        return out

    def queue(self, include_finished: bool = False) -> dict[str, Any]:
        jobs = [self.public_job(j) for j in self.jobs.values()]
        if include_finished:
            jobs += [j.to_public() for j in reversed(self.store.finished_jobs(limit=1000))]
        users = {j.id: j.user for j in self.jobs.values()}
        return {"jobs": jobs, "nodes": [n.to_public(users) for n in self._sorted_nodes()]}

    def nodes_public(self) -> list[dict[str, Any]]:
        users = {j.id: j.user for j in self.jobs.values()}
        return [n.to_public(users) for n in self._sorted_nodes()]

    def _sorted_nodes(self) -> list[NodeRecord]:
        return [self.nodes[k] for k in sorted(self.nodes)]

    def job_event(self, job_id: str) -> asyncio.Event:
        ev = self._job_events.get(job_id)
        if ev is None:
            ev = self._job_events[job_id] = asyncio.Event()
        return ev

    def _notify(self, job: Job) -> None:
        ev = self._job_events.pop(job.id, None)
        if ev is not None:
            ev.set()

    def queue_position(self, job: Job) -> int:
        pos = 1
        for j in self.jobs.values():
            if j.id == job.id:
                return pos
            if j.state == JobState.QUEUED:
                pos += 1
        return pos

    # ---- cancel and node admin --------------------------------------------

    def cancel(
        self,
        job: Job,
        actor: str | None = None,
        reason: str = "cancelled",
        address: str | None = None,
    ) -> bool:
        """Cancel a queued or running job; False if it had already ended."""
        job = self.jobs.get(job.id, job)
        if job.terminal:
            return False
        self._cancel(job, actor, reason)
        # On disk, with the audit event in the same transaction, before the user is told.
        self.flush(event=("cancel", actor, address, job.id))
        return True

    def cancel_slice(
        self,
        rows: list[tuple[str, str]],
        actor: str | None,
        address: str | None,
        event: tuple[str, str | None] | None,
    ) -> tuple[list[str], list[str]]:
        """Cancel a slice of many jobs (an array's tasks), given as (id, stored state): one
        transaction for the slice, with the request's one audit event (target, detail)
        when given.  Returns the ids cancelled and those that had already ended."""
        cancelled, ended = [], []
        for job_id, stored_state in rows:
            job = self.jobs.get(job_id) or self._dirty.get(job_id)
            if job is None and stored_state in ("queued", "running"):
                job = self.store.get_job(job_id)  # not expected: active jobs live in memory
            if job is None or job.terminal:
                ended.append(job_id)
                continue
            self._cancel(job, actor, "cancelled")
            cancelled.append(job_id)
        if event is None:
            self.flush()
        else:
            self.flush(event=("cancel", actor, address, event[0]), detail=event[1])
        return cancelled, ended

    def _cancel(self, job: Job, actor: str | None, reason: str) -> None:
        if job.state == JobState.QUEUED:
            self._finish(
                job, JobState.CANCELLED, reason if actor is None else f"cancelled by {actor}"
            )
        else:
            job.cancel_requested = True
            job.cancel_reason = None if reason == "cancelled" else reason
            job.reason = "cancelling"
            self._persist(job)
            self._kill_slots(job, "cancelled")

    def drain(
        self,
        node_id: str,
        reason: str | None,
        actor: str | None = None,
        address: str | None = None,
    ) -> NodeRecord:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound(node_id)
        node.drain_requested = True
        node.reason = reason or "drained by admin"
        if node.state != NodeState.OFFLINE:
            node.state = NodeState.DRAINING
            node.settle_drain()
        self.store.save_node(node_id, node.to_record())
        self.store.record_event(
            "drain", actor=actor, address=address, target=node_id, detail=node.reason
        )
        return node

    def resume(
        self, node_id: str, actor: str | None = None, address: str | None = None
    ) -> NodeRecord:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound(node_id)
        node.drain_requested = False
        node.reason = None
        node.failures = 0
        if node.state != NodeState.OFFLINE:
            node.state = NodeState.ONLINE
        self.store.save_node(node_id, node.to_record())
        self.store.record_event("resume", actor=actor, address=address, target=node_id)
        self.wake()
        return node

    def remove_node(
        self, node_id: str, actor: str | None = None, address: str | None = None
    ) -> list[str]:
        """Forget a node, its record and its secret, so that an agent can join under its
        id afresh (one that lost its state dir, or a new machine).  Refused while its agent
        is connected and runs jobs; the jobs of a node that is not connected are requeued
        as for a lost node.  Returns the ids of the requeued jobs."""
        node = self.nodes.get(node_id)
        if node is None and not self.node_secrets.known(node_id):
            raise NotFound(node_id)
        requeued: list[str] = []
        if node is not None:
            running = sorted(
                job.id
                for job in (self.jobs.get(j) for j in node.jobs)
                if job is not None and job.state == JobState.RUNNING
            )
            if node.connected and running:
                raise Conflict(
                    f"node {node_id} is connected and runs {len(running)} job(s) "
                    f"({', '.join(running[:5])}): drain it and let them end, or stop its "
                    "agent first"
                )
            for job_id in running:
                job = self.jobs[job_id]
                if job.cancel_requested:
                    self._finish(job, JobState.CANCELLED, "cancelled")
                else:
                    self._requeue(job, f"node {node_id} removed")
                    requeued.append(job_id)
            if node.link is not None:
                node.link.close()  # an idle agent still running joins again as a new node
            del self.nodes[node_id]
        # The secret first: should the master die in between, the node is forgotten anyway.
        self.node_secrets.forget(node_id)
        self.store.delete_node(node_id)
        detail = f"requeued {', '.join(requeued)}" if requeued else None
        self.store.record_event(
            "node_remove", actor=actor, address=address, target=node_id, detail=detail
        )
        if self.config.node(node_id) is not None:
            self._node_from_config(node_id)  # listed in the config: shown as at a fresh start
        self.flush()
        self.wake()
        return requeued

    # ---- the scheduling loop ----------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Schedule whenever something changed; re-plan unchanged queues every few seconds
        (priorities age, backoffs expire).  A long pass is followed by a pause of about its
        own length, so a huge queue cannot starve the API of the event loop."""
        last_full = 0.0
        while True:
            woken = True
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            except TimeoutError:
                woken = False
            self._wake.clear()
            self.loop_tick = time.time()
            try:
                self.check_heartbeats()
                now = time.monotonic()
                due = now - last_full >= REPLAN_INTERVAL or self._backoff_expired()
                if woken or due:
                    self.schedule_pass()
                    last_full = now
            except Exception:
                log.exception("scheduling pass failed")
            if self.last_pass_duration > 0.02:
                await asyncio.sleep(min(1.0, self.last_pass_duration))
            else:
                await asyncio.sleep(0)  # let queued submissions in before the next pass

    def _backoff_expired(self) -> bool:
        now = time.time()
        return any(
            j.state == JobState.QUEUED
            and j.retries
            and self.last_pass_time < j.eligible_time <= now
            for j in self.jobs.values()
        )

    def _node_views(self) -> list[NodeView]:
        return node_views(self._sorted_nodes())

    def _request_for(self, job: Job) -> JobRequest:
        req = self._requests.get(job.id)
        if req is None:
            req = job_request(job, self.allowed_nodes(job.user))
            if job.state == JobState.QUEUED and job.id in self.jobs:
                self._requests[job.id] = req
        return req

    def _scheduler_config(self) -> SchedulerConfig:
        return scheduler_config(self.config.scheduling)

    def _dependency_targets(self, dep_id: str) -> list[DependencyTarget]:
        """The jobs a dependency on `dep_id` waits for (a job, or an array's tasks)."""
        return [
            DependencyTarget(t.id, t.state.value if t.terminal else None)
            for t in self._find_dependency_target(dep_id) or []
        ]

    def schedule_pass(self) -> None:
        now = time.time()
        t0 = time.perf_counter()
        prepared = prepare(
            now,
            self.jobs.values(),
            self._sorted_nodes(),
            self.usage,
            self._scheduler_config(),
            request_for=self._request_for,
            targets=self._dependency_targets,
            known_met=self._deps_met,
        )
        verdict = prepared.eligibility
        for job_id, why in verdict.cancel.items():
            self._finish(self.jobs[job_id], JobState.CANCELLED, why)
        for job_id, why in verdict.waiting.items():
            self._set_reason(self.jobs[job_id], why)
        # Ended as required: that never changes, so later passes need not look them up.
        self._deps_met.update(verdict.satisfied)
        snap = prepared.snapshot
        if snap is None:
            self.last_pass_time = now  # a pass with nothing eligible is still a pass (readyz)
            self.last_pass_duration = time.perf_counter() - t0
            return
        decisions = schedule(snap)
        self._priorities.update(decisions.priorities)
        self._factors.update(decisions.factors)
        self._expected_start = dict(decisions.expected_start)
        started: set[str] = set()
        for start in decisions.starts:
            job = self.jobs.get(start.job_id)
            if job is None or job.state != JobState.QUEUED:
                continue
            if self._start(job, [(p.node_id, list(p.gpu_ids)) for p in start.placements]):
                started.add(job.id)
        for job_id in decisions.preempt:
            job = self.jobs.get(job_id)
            stopping = job is None or job.cancel_requested or job.preempt_requested
            if job is not None and job.state == JobState.RUNNING and not stopping:
                self._preempt(job)
        for job_id, why in decisions.reasons.items():
            job = self.jobs.get(job_id)
            if job is not None and job.id not in started and job.state == JobState.QUEUED:
                self._set_reason(job, why)
        self.last_pass_time = now
        self.last_pass_duration = time.perf_counter() - t0

    def _set_reason(self, job: Job, why: str) -> None:
        # Reasons are advisory and change often: kept in memory, not written on every pass.
        job.reason = why

    # ---- starting a job ---------------------------------------------------

    def _start(self, job: Job, placements: list[tuple[str, list[int]]]) -> bool:
        for node_id, gpu_ids in placements:
            node = self.nodes.get(node_id)
            if node is None or not node.schedulable:
                return False
            if any(g in node.busy for g in gpu_ids):
                log.error("scheduler offered busy GPUs %s on %s to %s", gpu_ids, node_id, job.id)
                return False
        job.epoch += 1
        token = new_job_token(job.id, self.fingerprint)
        self._job_tokens[job.id] = token
        job.job_token_hashes = [token_hash(token)]
        job.transition(JobState.RUNNING, "launching")
        job.allocation = [Slot(node_id=n, gpu_ids=list(g)) for n, g in placements]
        job.attempts.append(
            Attempt(
                epoch=job.epoch,
                nodes=[n for n, _ in placements],
                gpu_ids={n: list(g) for n, g in placements},
            )
        )
        job.start_time = None
        job.exit_code = None
        job.timed_out = job.preempt_requested = False
        job.failed_node = None
        self._requests.pop(job.id, None)
        for node_id, gpu_ids in placements:
            self._allocate(job, node_id, gpu_ids)
        self._persist(job)  # written before any agent hears of it (see _flush)
        self.counters["started"] += 1
        if len(placements) > 1 or job.distributed or job.mpi:
            first = self.nodes[placements[0][0]]
            assert first.link is not None
            self._send(first.link, ReservePort(job_id=job.id, epoch=job.epoch))
        else:
            self._launch_all(job, port=None)
        return True

    def _allocate(self, job: Job, node_id: str, gpu_ids: Iterable[int]) -> None:
        node = self.nodes[node_id]
        node.jobs.add(job.id)
        for g in gpu_ids:
            node.busy[g] = job.id

    def _release(self, job: Job, slot: Slot) -> None:
        node = self.nodes.get(slot.node_id)
        if node is None:
            return
        node.jobs.discard(job.id)
        for g in slot.gpu_ids:
            if node.busy.get(g) == job.id:
                del node.busy[g]
        node.settle_drain()
        self.wake()

    def _job_env(self, job: Job, rank: int, slot: Slot) -> dict[str, str]:
        """The environment of the job's process on one node (rank = index in the allocation)."""
        alloc = job.allocation
        gpus = ",".join(map(str, slot.gpu_ids))
        env = dict(job.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": gpus,
                "MGPU_JOB_ID": job.id,
                "MGPU_NODE_ID": slot.node_id,
                "MGPU_GPU_IDS": gpus,
                "MGPU_JOB_NAME": job.name or "",
                "MGPU_USER": job.user,
                "MGPU_NNODES": str(len(alloc)),
                "MGPU_NODE_RANK": str(rank),
                "MGPU_NODELIST": ",".join(s.node_id for s in alloc),
            }
        )
        env["MGPU_TOKEN"] = self._credential(job)
        if job.array_job_id is not None:
            env["MGPU_ARRAY_JOB_ID"] = job.array_job_id
            env["MGPU_ARRAY_TASK_ID"] = str(job.array_task_id)
        if job.port is not None:
            dist = {
                "MASTER_ADDR": self.nodes[alloc[0].node_id].ip,
                "MASTER_PORT": str(job.port),
                "NNODES": str(len(alloc)),
                "NODE_RANK": str(rank),
                "NPROC_PER_NODE": str(len(slot.gpu_ids) or 1),
                "WORLD_SIZE": str(sum(len(s.gpu_ids) or 1 for s in alloc)),
            }
            env.update(dist)
            # torchrun reads PET_* as defaults for its flags: a bare `torchrun x.py` joins.
            env.update({f"PET_{k}": dist[k] for k in ("NNODES", "NODE_RANK", "NPROC_PER_NODE")})
            env.update({f"PET_{k}": dist[k] for k in ("MASTER_ADDR", "MASTER_PORT")})
        return env

    def _credential(self, job: Job) -> str:
        """The running job's $MGPU_TOKEN.  Only hashes are stored, so after a master restart
        the plaintext is gone: a new credential is made for what starts now (a step, or a
        launch that waited for its port), its hash added beside the first (written before
        any agent hears of it)."""
        token = self._job_tokens.get(job.id)
        if token is None:
            token = self._job_tokens[job.id] = new_job_token(job.id, self.fingerprint)
            job.job_token_hashes.append(token_hash(token))
            self._persist(job)
        return token

    def _hostfile(self, job: Job) -> str:
        """One line per node, slots = its GPUs (Open MPI and MPICH both read this form)."""
        lines = []
        for s in job.allocation:
            node = self.nodes[s.node_id]
            lines.append(f"{node.hostname or node.ip or s.node_id} slots={len(s.gpu_ids) or 1}")
        return "\n".join(lines) + "\n"

    def _launch_all(self, job: Job, port: int | None) -> None:
        job.port = port
        for rank, slot in enumerate(job.allocation):
            if job.mpi and rank > 0:
                # mpirun on rank 0 starts the other ranks through `mgpu rsh` (job steps);
                # their slots stay allocated until the job ends.
                slot.done = True
                continue
            node = self.nodes[slot.node_id]
            if node.link is None:
                continue
            self._send(
                node.link,
                Launch(
                    job_id=job.id,
                    epoch=job.epoch,
                    argv=job.argv,
                    env=self._job_env(job, rank, slot),
                    cwd=job.cwd,
                    gpu_ids=slot.gpu_ids,
                    time_limit=job.time_limit,
                    kill_grace=self.config.scheduling.kill_grace,
                    user=job.user,
                    allow_root=self._may_run_as_root(job),
                    mpi=job.mpi,
                    hostfile=self._hostfile(job) if job.mpi else None,
                    image=job.image,
                    prolog=self.config.site.prolog,
                    epilog=self.config.site.epilog,
                    prolog_timeout=self.config.site.prolog_timeout,
                    epilog_timeout=self.config.site.epilog_timeout,
                ),
            )

    # ---- job steps (mgpu rsh) ---------------------------------------------

    def start_step(self, job_id: str, host: str, argv: list[str]) -> Step:
        """Run `argv` (through /bin/sh, as ssh would) on the allocated node `host` names."""
        job = self.jobs.get(job_id)
        if job is None or job.state != JobState.RUNNING:
            raise SubmitError(f"job {job_id} is not running")
        ranks = [
            rank
            for rank, s in enumerate(job.allocation)
            if host in (s.node_id, self.nodes[s.node_id].hostname, self.nodes[s.node_id].ip)
        ]
        if not ranks:
            names = ", ".join(s.node_id for s in job.allocation)
            raise SubmitError(f"{host} is not one of job {job_id}'s nodes ({names})")
        slot = job.allocation[ranks[0]]
        link = self.nodes[slot.node_id].link
        if link is None:
            raise SubmitError(f"{slot.node_id} is not connected")
        step = self.steps.new(job.id, job.epoch, slot.node_id)
        env = self._job_env(job, ranks[0], slot)
        self._send(
            link,
            Launch(
                job_id=step.id,
                epoch=job.epoch,
                argv=["/bin/sh", "-c", " ".join(argv)],
                env=env,
                cwd=job.cwd,
                gpu_ids=slot.gpu_ids,
                kill_grace=self.config.scheduling.kill_grace,
                user=job.user,
                allow_root=self._may_run_as_root(job),
            ),
        )
        return step

    def _may_run_as_root(self, job: Job) -> bool:
        return job.allow_root  # decided at submit from the token's grant, never from a name

    def _step_message(self, node: NodeRecord, msg: Any) -> None:
        step = self.steps.by_id.get(msg.job_id)
        if step is None or step.epoch != msg.epoch or step.node_id != node.node_id:
            if isinstance(msg, Started) and node.link is not None:
                self._send(node.link, Kill(job_id=msg.job_id, epoch=msg.epoch, reason="stale"))
            return
        if isinstance(msg, Output):
            data = self.outputs.accept(
                step.id, msg.epoch, node.node_id, msg.stream, msg.data, msg.offset, msg.end
            )
            if data is None:
                return  # already stored (re-sent after a reconnect)
            self.outputs.append(step.id, msg.stream, data, node.node_id, msg.epoch, msg.end)
            self.outputs.append(step.job_id, msg.stream, data, node.node_id)
        elif isinstance(msg, Exited):
            self.steps.end(step, msg.exit_code, msg.launch_error)
            self.outputs.close(step.id)

    def _end_steps(self, job: Job) -> None:
        for step in self.steps.forget_job(job.id):
            node = self.nodes.get(step.node_id)
            if node is not None and node.link is not None:
                self._send(node.link, Kill(job_id=step.id, epoch=step.epoch, reason="job ended"))
            self.outputs.close(step.id)

    def _kill_slots(self, job: Job, reason: str, except_node: str | None = None) -> None:
        for slot in job.allocation:
            if slot.done or slot.node_id == except_node:
                continue
            node = self.nodes.get(slot.node_id)
            if node is not None and node.link is not None:
                self._send(
                    node.link,
                    Kill(
                        job_id=job.id,
                        epoch=job.epoch,
                        reason=reason,
                        grace=self.config.scheduling.kill_grace,
                    ),
                )

    def _preempt(self, job: Job) -> None:
        job.reason = "preempting"
        job.preempt_requested = True
        self._kill_slots(job, "preempted")

    # ---- ending a job -----------------------------------------------------

    def _charge(self, job: Job, now: float) -> None:
        """Add the ending attempt's GPU-seconds to its user's fairshare usage."""
        if job.start_time is not None and job.gpus > 0:
            self.usage.add(job.user, job.gpus * max(0.0, now - job.start_time), now)
            self._usage_dirty = True
            self._arm_flush()

    def _finish(self, job: Job, state: JobState, reason: str | None) -> None:
        now = time.time()
        if job.state == JobState.RUNNING:
            self._charge(job, now)
        job.transition(state, reason)
        self._forget_credential(job)  # the run's credential dies with it
        self._end_steps(job)
        job.end_time = now
        for slot in job.allocation:
            self._release(job, slot)
        if job.attempts and job.attempts[-1].end_time is None:
            job.attempts[-1].end_time = now
            job.attempts[-1].end_reason = reason or state.value
        self._persist(job)
        self.jobs.pop(job.id, None)
        self._requests.pop(job.id, None)
        self._priorities.pop(job.id, None)
        self._factors.pop(job.id, None)
        self.outputs.close(job.id)
        self.counters["completed" if state == JobState.COMPLETED else "failed"] += 1
        self.job_metrics.finished(job, state)
        self.gpuwatch.forget(job.id)
        self._notify(job)
        self.wake()

    def _requeue(self, job: Job, why: str, count_retry: bool = True) -> None:
        """Back to the queue after a node failure (or preemption); fail when out of retries."""
        for slot in job.allocation:
            self._release(job, slot)
        self._kill_slots(job, "requeued")
        self._end_steps(job)
        if count_retry:
            if job.retries >= job.max_retries:
                self._finish(job, JobState.FAILED, why)
                return
            job.retries += 1
            s = self.config.scheduling
            backoff = min(s.retry_backoff_base * 2 ** (job.retries - 1), s.retry_backoff_max)
            job.eligible_time = time.time() + backoff
            reason = f"requeued: {why} (retry {job.retries}/{job.max_retries})"
        else:
            reason = f"requeued: {why}"
        now = time.time()
        self._charge(job, now)
        if job.attempts and job.attempts[-1].end_time is None:
            job.attempts[-1].end_time = now
            job.attempts[-1].end_reason = why
        job.transition(JobState.QUEUED, reason)
        self._forget_credential(job)
        for slot in job.allocation:
            slot.done = True
        self._persist(job)
        self._notify(job)
        self.wake()

    def _forget_credential(self, job: Job) -> None:
        job.job_token_hashes = []
        self._job_tokens.pop(job.id, None)

    def _slot(self, job: Job, node_id: str) -> Slot | None:
        for s in job.allocation:
            if s.node_id == node_id:
                return s
        return None

    def _node_failure(self, node: NodeRecord, why: str) -> None:
        node.failures += 1
        threshold = self.config.scheduling.node_failure_threshold
        if node.failures >= threshold and not node.drain_requested:
            node.drain_requested = True
            node.reason = f"{node.failures} consecutive failures, last: {why}"
            if node.state != NodeState.OFFLINE:
                node.state = NodeState.DRAINING
                node.settle_drain()
            log.warning("draining %s: %s", node.node_id, node.reason)
        self.store.save_node(node.node_id, node.to_record())

    # ---- agent messages ---------------------------------------------------

    def refuse_hello(self, hello: Hello) -> str | None:
        """Why this agent may not join, or None."""
        if hello.protocol != PROTOCOL_VERSION:
            return (
                f"node {hello.node_id} speaks protocol {hello.protocol}, this master "
                f"{PROTOCOL_VERSION}: run the same mgpu version on both"
            )
        if self.config.node(hello.node_id) is None and not self.config.cluster.allow_unlisted_nodes:
            return (
                f"node {hello.node_id} is not listed in the cluster config "
                "and allow_unlisted_nodes is false"
            )
        return None

    def verify_node(self, hello: Hello) -> HelloVerdict:
        """May this agent speak for its node id (mgpu.master.nodeauth)?"""
        node = self.nodes.get(hello.node_id)
        connected = node is not None and node.connected
        return self.node_secrets.verify(hello.node_id, hello.node_secret, connected)

    def agent_hello(self, hello: Hello, link: AgentLink, node_secret: str | None = None) -> Welcome:
        """Accept an agent that `verify_node` let in; `node_secret`: issued at this join."""
        node = self._node_from_config(hello.node_id)
        if node.link is not None and node.link is not link:
            log.warning("node %s proved its secret: its older connection is dropped", node.node_id)
            node.link.close()
        node.link = link
        node.hostname = hello.hostname
        node.ip = hello.ip
        node.gpus = list(hello.gpus)
        node.gpu_source = hello.gpu_source
        node.features = list(hello.features)
        node.run_as_user = hello.run_as_user
        node.containment, node.gpu_isolation = hello.containment, hello.gpu_isolation
        node.last_seen = time.time()
        entry = self.config.node(hello.node_id)
        if entry is not None and entry.gpu_type:
            node.gpu_type = entry.gpu_type
        if node.drain_requested:
            node.state = NodeState.DRAINING
            node.settle_drain()
        else:
            node.state = NodeState.ONLINE
        kill = self._reconcile(node, hello.running)
        resume = self._resume_points(node, hello.running)
        self.store.save_node(node.node_id, node.to_record())
        self._judge_unjudged_later()
        log.info(
            "node %s connected: %s (%s), %d GPU(s) via %s",
            node.node_id,
            node.hostname,
            node.ip,
            len(node.gpus),
            node.gpu_source,
        )
        self.wake()
        return Welcome(
            heartbeat_interval=self.config.networking.heartbeat_interval,
            kill=kill,
            resume=resume,
            node_secret=node_secret,
        )

    def _resume_points(self, node: NodeRecord, reports: list[RunningReport]) -> list[Resume]:
        """How much output the master has of each run it still expects on this node."""
        out = []
        for job_id, epoch in reconcile(reports, self._expected(node, reports)).resume:
            o, e = self.outputs.resume_point(job_id, epoch, node.node_id)
            out.append(Resume(job_id=job_id, epoch=epoch, stdout=o, stderr=e))
        return out

    def _reconcile(self, node: NodeRecord, reports: list[RunningReport]) -> list[RunningReport]:
        """Compare what the agent runs with what the master expects there; requeue the lost."""
        result = reconcile(reports, self._expected(node, reports))
        for i, job_id in enumerate(result.lost):
            # One restart is one node failure, however many jobs it lost.
            why = f"{node.node_id} restarted and no longer runs it"
            self._slot_lost(self.jobs[job_id], node, why, count=i == 0)
        return list(result.kill)

    def _expected(self, node: NodeRecord, reports: list[RunningReport]) -> dict[str, Expected]:
        return expectations(node.node_id, node.jobs, reports, self.jobs, self.steps.by_id)

    def _slot_lost(
        self, job: Job, node: NodeRecord, why: str, count: bool = True, count_retry: bool = True
    ) -> None:
        if job.cancel_requested:
            self._finish(job, JobState.CANCELLED, "cancelled")
            return
        if count:
            self._node_failure(node, why)
        self._requeue(job, why, count_retry=count_retry)

    def agent_disconnected(self, node_id: str, link: AgentLink) -> None:
        node = self.nodes.get(node_id)
        if node is not None and node.link is link:
            node.link = None
            log.warning("node %s disconnected", node_id)

    def agent_message(self, node_id: str, msg: Any) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return  # removed (mgpu node remove) while this message was on its way
        node.last_seen = time.time()
        if isinstance(msg, Hello):
            log.warning("node %s said hello again on its connection: ignored", node_id)
            return
        if isinstance(msg, Heartbeat):
            node.telemetry = {t.index: t for t in msg.telemetry}
            self.gpuwatch.heartbeat(self, node)
            return
        if isinstance(msg, Exited) and node.link is not None:
            # Sent after this message's effect is on disk (see flush); until then the agent
            # keeps the run and re-sends its end after a reconnect.
            self._send(node.link, Forget(job_id=msg.job_id, epoch=msg.epoch))
        if is_step_id(msg.job_id):
            self._step_message(node, msg)
            return
        job = self.jobs.get(msg.job_id)
        if job is None or job.epoch != msg.epoch or job.state != JobState.RUNNING:
            if isinstance(msg, Output):
                return  # late output of an ended run: already closed
            if isinstance(msg, Started | PortReserved) and node.link is not None:
                self._send(node.link, Kill(job_id=msg.job_id, epoch=msg.epoch, reason="stale"))
            return
        slot = self._slot(job, node_id)
        if slot is None:
            return
        if isinstance(msg, Output):
            data = self.outputs.accept(
                job.id, msg.epoch, node_id, msg.stream, msg.data, msg.offset, msg.end
            )
            if data is not None:  # None: already stored (re-sent after a reconnect)
                self.outputs.append(job.id, msg.stream, data, node_id, msg.epoch, msg.end)
        elif isinstance(msg, Started):
            slot.pid, slot.hostname, slot.ip = msg.pid, msg.hostname, msg.ip
            if job.start_time is None:
                job.start_time = msg.time
                if job.attempts:
                    job.attempts[-1].start_time = msg.time
                self.job_metrics.started(job)
            if job.reason == "launching":
                job.reason = None
            # Not written now: agents report what they run again after a master restart,
            # so the start is stored with the job's next change (one write fewer per job).
            self._persist_later(job)
            self._notify(job)
        elif isinstance(msg, PortReserved):
            self._launch_all(job, port=msg.port)
        elif isinstance(msg, Exited) and not slot.done:  # done: a re-sent end
            self._slot_exited(job, node, slot, msg)

    def _slot_exited(self, job: Job, node: NodeRecord, slot: Slot, msg: Exited) -> None:
        if msg.launch_error is not None and msg.fatal:
            self._finish(job, JobState.FAILED, f"{node.node_id}: {msg.launch_error}")
            return
        if msg.launch_error is not None:
            why = f"{node.node_id} could not launch the job: {msg.launch_error}"
            self._slot_lost(job, node, why, count_retry=not msg.requeue_free)  # free: prolog
            return
        slot.done = True
        slot.exit_code = msg.exit_code
        if msg.timed_out:
            job.timed_out = True
        node.failures = 0
        if msg.epilog_error is not None:  # as Slurm: the node drains, the job's result stands
            self.drain(node.node_id, msg.epilog_error)
        failed_here = msg.exit_code != 0
        live = [s for s in job.allocation if not s.done]
        if failed_here and live and not job.cancel_requested:
            # As srun --kill-on-bad-exit: one rank failing ends the others.
            job.failed_node = node.node_id
            self._kill_slots(job, f"{node.node_id} failed")
        self._release(job, slot)
        if live:
            self._persist(job)
            return
        self._complete(job)

    def _complete(self, job: Job) -> None:
        codes = [s.exit_code for s in job.allocation if s.exit_code is not None]
        bad = [c for c in codes if c != 0]
        job.exit_code = bad[0] if bad else (codes[0] if codes else None)
        first_bad = self._slot(job, job.failed_node) if job.failed_node else None
        if first_bad is not None:
            job.exit_code = first_bad.exit_code  # the rank that failed first, not its victims
        if job.preempt_requested and not job.cancel_requested:
            job.preempt_requested = False
            self._requeue(job, "preempted by higher-priority work", count_retry=False)
            return
        if job.cancel_requested:
            state, reason = JobState.CANCELLED, job.cancel_reason or "cancelled"
        elif job.timed_out:
            state, reason = JobState.TIMEOUT, "time limit reached"
        elif not bad:
            state, reason = JobState.COMPLETED, None
        else:
            first = job.failed_node
            where = f" on {first}" if first and len(job.allocation) > 1 else ""
            state, reason = JobState.FAILED, f"exit code {job.exit_code}{where}"
        self._finish(job, state, reason)

    # ---- node liveness ----------------------------------------------------

    def check_heartbeats(self) -> None:
        now = time.time()
        timeout = self.config.networking.timeout
        for node in self.nodes.values():
            # An offline node may still hold jobs: loaded as running after a master restart.
            if (node.state == NodeState.OFFLINE and not node.jobs) or (
                now - node.last_seen <= timeout
            ):
                continue
            if node.link is not None:
                node.link.close()
                node.link = None
            node.state = NodeState.OFFLINE
            log.warning("node %s lost: silent for %.0f s", node.node_id, now - node.last_seen)
            for job_id in list(node.jobs):
                job = self.jobs.get(job_id)
                if job is None or job.state != JobState.RUNNING:
                    node.jobs.discard(job_id)
                    continue
                if job.cancel_requested:
                    self._finish(job, JobState.CANCELLED, "cancelled")
                else:
                    self._requeue(job, f"node {node.node_id} lost")
            node.busy.clear()
            node.jobs.clear()


@functools.lru_cache(maxsize=1024)
def _is_uid0(user: str) -> bool:
    """Whether `user` is uid 0 on this machine (cached: looked up on every submit)."""
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid == 0
    except KeyError:
        return False


def _unix_groups(user: str) -> set[str]:
    """The Unix groups `user` is in, as this (master) machine knows them."""
    import grp
    import pwd

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return set()
    names = set()
    for gid in os.getgrouplist(user, pw.pw_gid):
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return names
