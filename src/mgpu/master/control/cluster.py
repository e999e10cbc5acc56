"""The master's controller, as the API sees it: a facade over its parts.

The parts, each in its own module (see docs/ARCHITECTURE.md, "The controller"):

* `state.py` — jobs, nodes, steps and the GPU ledger, in memory;
* `unitofwork.py` — group commit: changed jobs written once per loop turn, then the
  messages to agents that wait on them;
* `submit.py` and `admission.py` — a typed request into admitted jobs;
* `lifecycle.py` — one method per job transition, with its `EndReason`;
* `launch.py` — the Launch message, built in one place;
* `agents.py` — hellos and reconcile, agent messages, job steps;
* `sessions.py`, `allocations.py` — runs held by a client (terminals, allocations) and
  the steps an allocation runs;
* `nodes.py` — drain, resume, remove, failures and liveness (heartbeats);
* `loop.py` — snapshot → `schedule()` → apply, the plan re-checked as it is applied;
* `bulk.py` — an array's tasks built, cancelled, held, released, requeued, updated, a
  slice at a time (one slicing policy);
* `reads.py` — jobs, arrays and nodes as the API reads them (mixed into `Cluster`);
* `access.py` — tokens, root grants, node access rules.

The HTTP edge (master/http/) calls only the named methods here, never the parts, the store
or the job dicts.

The store, token store, output store, node secrets and clock are passed in (the master
makes them, and its CA, at start: master/http/app.py); the controller tests pass an in-memory
store and a fake clock (tests/controller/harness.py).  All mutation happens on the asyncio
loop, so there is no locking.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mgpu import spec as specs
from mgpu.config import ClusterConfig
from mgpu.master.control.admission import Admission, AdmissionContext
from mgpu.master.control.agents import Agents
from mgpu.master.control.allocations import Allocations, StepRequest
from mgpu.master.control.bulk import Bulk, Cancelled, build_tasks, in_slices
from mgpu.master.control.jobbuild import SubmitDefaults, build_template, submit_warnings
from mgpu.master.control.jobctl import Actor, Change, JobControl, SignalAsked
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.control.loop import SchedulingLoop
from mgpu.master.control.nodes import Conflict, NodeAdmin, NotFound
from mgpu.master.control.notify import Notifier
from mgpu.master.control.notifytargets import check_target
from mgpu.master.control.reads import Reads
from mgpu.master.control.reservations import ReservationBook
from mgpu.master.control.reservations import public as public_reservation
from mgpu.master.control.retention import Retention
from mgpu.master.control.sessions import Sessions, held_by_client
from mgpu.master.control.srun import SrunRequest
from mgpu.master.control.submit import JobSpec, SubmitError, SubmitResult
from mgpu.master.control.submitkeys import Made, SubmitKeys
from mgpu.master.control.tokenadmin import TokensAndAudit
from mgpu.master.monitor.gpuwatch import GpuWatch
from mgpu.master.monitor.metrics import JobMetrics
from mgpu.master.runtime import gcpause
from mgpu.master.runtime.clock import Clock, LoopTimers, SystemClock, Timers
from mgpu.master.runtime.looplag import LoopLag
from mgpu.master.security.access import Access, unix_groups
from mgpu.master.security.auth import Identity, TokenStore
from mgpu.master.security.nodeauth import HelloVerdict, NodeSecrets
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.partscope import kube_refused
from mgpu.master.state.registry import AgentLink, NodeRecord
from mgpu.master.state.snapshot import job_request, running_job, scheduler_config
from mgpu.master.state.steps import Step, TaskStep
from mgpu.master.state.unitofwork import UnitOfWork
from mgpu.master.store import arrays
from mgpu.master.store.base import Store
from mgpu.master.store.outputs import OutputReader, OutputStore
from mgpu.master.store.submitbatch import SubmitBatch
from mgpu.model import EndReason, Job, JobState
from mgpu.protocol import AgentMessage, Hello, Welcome
from mgpu.scheduler import DependencyTarget, NodeView, UsageLedger

log = logging.getLogger("mgpu.master")

__all__ = ["Cluster", "Conflict", "NotFound", "SubmitResult"]


class Cluster(Reads, TokensAndAudit):
    def __init__(
        self,
        config: ClusterConfig,
        store: Store,
        tokens: TokenStore,
        outputs: OutputStore,
        node_secrets: NodeSecrets,
        clock: Clock | None = None,
        timers: Timers | None = None,
        owner: str | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.tokens = tokens
        self.outputs = outputs
        outputs.cap = config.limits.max_output_per_job  # the store's maker need not know it
        self.clock: Clock = clock or SystemClock()
        self.timers: Timers = timers or LoopTimers()
        self.default_user = owner or getpass.getuser()
        self.state = ControllerState(config, self.clock)
        self.jobs = self.state.jobs
        self.nodes = self.state.nodes
        self.steps = self.state.steps
        self.counters = self.state.counters
        half_life = config.scheduling.fairshare_half_life_hours * 3600
        self.usage = UsageLedger.loads(half_life, store.get_meta("usage"))
        self.usage.billing = scheduler_config(config.scheduling).billing  # what a second costs
        self.uow = UnitOfWork(store, self.timers, self.usage)
        self.uow.outputs_stored = outputs.when_stored  # an end is written after its output
        self.job_metrics = JobMetrics()
        self.loop_lag = LoopLag()
        self.gpuwatch = GpuWatch(config)
        self.life = Lifecycle(
            self.state, self.uow, outputs, self.usage, config, tokens.suffix, self.job_metrics
        )
        self.uow.on_unsendable = self.life.unsendable
        self.life.on_end.append(lambda job: self.gpuwatch.forget(job.id))
        self.access = Access(config, tokens, self.jobs, self.nodes, self.default_user)
        self.node_admin = NodeAdmin(self.state, self.life, store, node_secrets, config)
        self.reservations = ReservationBook(store)
        self.retention = Retention(store, outputs, config, self.clock, self.jobs)
        self.loop = SchedulingLoop(
            self.state,
            self.life,
            self.node_admin,
            self.usage,
            config,
            self.access.allowed_nodes,
            self._dependency_targets,
            self.reservations.active,
        )
        self.agents = Agents(
            self.state,
            self.life,
            self.node_admin,
            outputs,
            self.gpuwatch,
            node_secrets,
            store,
            config,
        )
        self.agents.on_joined = self._judge_unjudged_later
        self.sessions = Sessions(self.state, self.life, config)
        self.allocations = Allocations(self.state, self.life, self.sessions, config)
        self.loop.on_tick += [self.sessions.check, self.allocations.check]
        self.admission = Admission(config.site.admission, config.scheduling.max_gpus_per_user)
        self.admission.asks = self.loop.asks
        self.jobctl = JobControl(
            self.state, self.life, self.loop, self.admission, self.admission_context
        )
        self.notifier = Notifier(config.notify, self._active_tasks, store.job_rows_with_prefix)
        self.life.on_end.append(self.notifier.job_ended)
        self._submit_defaults = SubmitDefaults.from_config(config.scheduling, config)
        self._ids_in_admission: set[str] = set()
        self.submits = SubmitBatch(store)
        self.submit_keys = SubmitKeys(store)
        self._unjudged: set[str] = set()
        """Jobs queued while no node was known: judged once nodes have joined."""
        self._rejudge_armed = False
        self.bulk = Bulk(self)
        self.services: list[Callable[[], Awaitable[None]]] = []
        """More tasks to run beside the loop (a Kubernetes partition's: mgpu.master.kube)."""
        # The Kubernetes driver's pod agents (mgpu.master.kube.podagents.PodAgents), set by
        # the driver; typed loosely because the controller sits below the kube layer.
        self.pod_agents: Any = None
        """The Kubernetes partitions' pod agents (their jobs' steps), if any."""
        self._load()
        self.allocations.live.restore(store.live_steps(), self.jobs, store.last_step_number)
        self.sessions.track(self.jobs.values())

    def _load(self) -> None:
        up = []
        for node_id, rec in self.store.load_nodes().items():
            node = self.state.node(node_id)
            node.from_record(rec)
            node.heard_now(self.clock)  # grace: agents get a full timeout to come back
            if rec.get("up"):
                up.append(node)
        for entry in self.config.nodes:
            self.state.node(entry.node_id)
        running = []
        for job in self.store.load_active_jobs():
            self.jobs[job.id] = job
            if job.state == JobState.RUNNING:
                self.state.hold(job)
                running.append(job)
        if running:
            self.store.save_jobs(running)  # rewritten: drops a credential stored in clear
        for node in up:  # after its jobs: a draining node that holds one is not drained
            node.as_it_was()
        log.info("loaded %d active jobs, %d nodes", len(self.jobs), len(self.nodes))

    # ---- who asks ---------------------------------------------------------

    def identify(self, token: str | None) -> Identity | None:
        return self.access.identify(token)

    def root_grant(self, ident: Identity) -> bool:
        return self.access.root_grant(ident)

    def root_name(self, user: str) -> str | None:
        return self.access.root_name(user)

    # ---- submit -----------------------------------------------------------

    async def submit(
        self,
        spec: JobSpec,
        user: str | None,
        address: str | None = None,
        allow_root: bool = False,
        key: str | None = None,
    ) -> SubmitResult:
        """`_submit`; with an idempotency `key` (control/submitkeys.py), once per key: a
        submit sent again gets the job the first one made."""
        if key is None:
            made = await self._submit(spec, user, address, allow_root)
        else:
            make = functools.partial(self._submit, spec, user, address, allow_root, key)
            made = await self.submit_keys.once(key, user or self.default_user, make)
        warnings = submit_warnings(spec, self._submit_defaults)
        return SubmitResult(*made, spec.dropped_env, warnings)

    async def _submit(
        self,
        spec: JobSpec,
        user: str | None,
        address: str | None,
        allow_root: bool,
        key: str | None = None,
    ) -> Made:
        """Build, admit, store (the job's id, an array's task ids): raises SubmitError with
        one sentence, storing nothing.
        allow_root: the submitter's grant (root_grant), recorded on every job.

        An array is stored as one row (`mgpu.master.store.arrays`), so a submit of 100,000 tasks
        is one small transaction; its tasks are built a slice at a time with the loop free
        in between, and become visible all at once, after the write."""
        template = build_template(
            spec,
            user or self.default_user,
            self._submit_defaults,
            self.clock.time(),
            self._new_job_id,
        )
        template.allow_root = allow_root
        array = spec.array
        base_id = template.id
        if spec.notify is not None:
            try:
                check_target(spec.notify, self.config.notify)
            except specs.SpecError as e:
                raise SubmitError(str(e)) from None
        refused = kube_refused(template, self.config)
        if refused is not None:
            raise SubmitError(refused)
        ctx = self.admission_context(cached=True)
        if template.reservation is not None:
            request = self.loop.request_for(template)
            self.reservations.admit(template, ctx.nodes, request, self.clock.time())
        self._ids_in_admission.add(base_id)  # the site validator may take a while
        try:
            if array is None:
                await self.admission.admit([template], spec, ctx)
                jobs = [template]
            else:
                # The checks see the first task, as they always have; the site's mutators
                # change the template too, so that every task carries them.
                first = next(arrays.tasks(template, array.indices[:1], array.max_running))
                await self.admission.admit([first, template], spec, ctx)
                with gcpause.paused():
                    jobs = await build_tasks(
                        template, array.indices, array.max_running, self.loop.cache_requests
                    )
                    gcpause.after_bulk(len(jobs))  # long-lived: full collections skip them
        finally:
            self._ids_in_admission.discard(base_id)
        event = ("submit", template.user, address, base_id)

        def known() -> None:  # right after the write: a job on disk is a job in memory
            self.jobs.update((job.id, job) for job in jobs)
            if array is None:
                self.loop.queued(jobs)
            if held_by_client(template):
                self.sessions.track(jobs)
            if not ctx.nodes:
                self._unjudged.update(job.id for job in jobs)
                if self.state.any_node_joined():  # while the site validator ran
                    self._judge_unjudged_later()
            self.state.wake()

        if array is None:
            await self.submits.write(jobs, event, known, key)  # this turn's: one commit
        else:

            async def queue_them() -> None:
                known()
                # Told to the quick passes a few thousand a turn: they look at each one told.
                await in_slices(jobs, self.loop.queued, most=QUEUED_PER_TURN)
                self.state.wake()

            row = (template, list(array.indices), array.max_running, event, key)
            await self.submits.write_array(
                row, queue_them, lambda: list(map(self.loop.forget, jobs))
            )
        return base_id, (tuple(j.id for j in jobs) if array is not None else None)

    def admission_context(self, cached: bool = False) -> AdmissionContext:
        """What admission judges a job against now.  `cached`: the loop's request cache
        may be used (a new job); a changed job (mgpu update) is judged as it is now."""
        joined = self.state.any_node_joined()
        return AdmissionContext(
            # What the nodes are (not what is busy): the same list until the cluster's
            # shape changes, so admission's verdicts per request shape stay cached.
            nodes=self.state.node_index.shape() if joined else [],
            request_for=(
                self.loop.request_for
                if cached
                else lambda job: job_request(
                    job, self.access.allowed_nodes(job.user), self.loop.asks
                )
            ),
            job_exists=lambda job_id: self._find_dependency_target(job_id) is not None,
            groups=unix_groups,
        )

    def _active_tasks(self, array_id: str) -> int:
        return sum(1 for j in self.jobs.values() if j.array_job_id == array_id)

    def active_tasks(self, array_id: str) -> list[Job]:
        """The queued and running tasks of an array (job control acts on these)."""
        return [j for j in self.jobs.values() if j.array_job_id == array_id]

    def _new_job_id(self, block: int = 1) -> str:
        return self.store.new_job_id(block)  # the cluster's counter (store/base.py)

    def _node_views(self) -> list[NodeView]:
        return self.state.node_index.views()

    def _judge_unjudged_later(self) -> None:
        """Jobs queued before any node was known could not be judged at submit.  Once a
        node has joined, give the others one heartbeat interval to join too (agents that
        start together), then fail those that could never run, with the sentence submit
        would have given."""
        if not self._unjudged or self._rejudge_armed:
            return
        self._rejudge_armed = True
        self.timers.call_later(self.config.networking.heartbeat_interval, self._judge_unjudged)

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
                verdicts[key] = self.admission.never_fits(job, nodes, self.loop.request_for)
            why = verdicts[key]
            if why is not None:
                self.life.finish(job, EndReason.NEVER_FITS, why)

    def _find_dependency_target(self, job_id: str) -> list[Job] | None:
        job = self.get_job(job_id)
        if job is not None:
            return [job]
        tasks = self.array_tasks(job_id)
        return tasks or None

    def _dependency_targets(self, dep_id: str) -> Sequence[DependencyTarget]:
        """The jobs a dependency on `dep_id` waits for (a job, or an array's tasks)."""
        return [
            DependencyTarget(t.id, t.state.value if t.terminal else None)
            for t in self._find_dependency_target(dep_id) or []
        ]

    # ---- reservations -----------------------------------------------------

    def create_reservation(
        self, body: dict[str, Any], actor: str | None, address: str | None
    ) -> dict[str, Any]:
        """`mgpu reserve create`: raises ReservationRequestError (one sentence), storing
        nothing, when it cannot be made."""
        now = self.clock.time()
        running = [running_job(j, now) for j in self.jobs.values() if j.state == JobState.RUNNING]
        config = scheduler_config(self.config.scheduling)
        r = self.reservations.create(
            body,
            now,
            self._node_views(),
            running,
            config.default_time_limit,
            self.access.known_user,
            actor,
            address,
        )
        self.state.wake()
        return public_reservation(r, now)

    def list_reservations(self) -> list[dict[str, Any]]:
        now = self.clock.time()
        return [public_reservation(r, now) for r in self.reservations.active(now)]

    def delete_reservation(self, name: str, actor: str | None, address: str | None) -> bool:
        deleted = self.reservations.delete(name, actor, address)
        self.state.wake()
        return deleted

    # ---- cancel and job control ---------------------------------------------

    async def cancel_job(self, job_id: str, actor: Actor) -> Cancelled:
        """Cancel a job, or every task of an array (control/bulk.py)."""
        return await self.bulk.cancel(job_id, actor)

    async def control_job(
        self, job_id: str, verb: str, actor: Actor, new: JobSpec | None = None
    ) -> list[Change]:
        """hold, release, requeue or update (with `new`) a job or an array's tasks."""

        async def one(job: Job, actor: Actor) -> Change:
            if verb == "update":
                assert new is not None
                return await self.jobctl.update(job, new, actor)
            change: Change = getattr(self.jobctl, verb)(job, actor)
            return change

        def check(job: Job, actor: Actor) -> None:
            self.jobctl.check_allowed(verb, job, actor, new)

        return await self.bulk.control(job_id, verb, actor, one, check)

    async def signal_job(self, job_id: str, asked: SignalAsked, actor: Actor) -> list[Change]:
        """Send a signal to a running job or to an array's running tasks now."""

        async def one(job: Job, actor: Actor) -> Change:
            return self.jobctl.signal(job, actor, asked)

        def check(job: Job, actor: Actor) -> None:
            self.jobctl.check_allowed("signal", job, actor)

        return await self.bulk.control(job_id, "signal", actor, one, check)

    def cancel(self, job: Job, actor: str | None = None, address: str | None = None) -> bool:
        """Cancel a queued or running job; False if it had already ended."""
        job = self.jobs.get(job.id, job)
        if job.terminal:
            return False
        self._cancel(job, actor)
        # On disk, with the audit event in the same transaction, before the user is told.
        self.uow.flush(event=("cancel", actor, address, job.id))
        return True

    def cancel_tasks(
        self, rows: list[tuple[str, str]], actor: str | None
    ) -> tuple[list[str], list[str]]:
        """Cancel many jobs (an array's tasks), given as (id, stored state), without writing
        them yet (`commit`).  Returns the ids cancelled and those that had already ended."""
        cancelled, ended = [], []
        for job_id, stored_state in rows:
            job = self.jobs.get(job_id) or self.uow.pending(job_id)
            if job is None and stored_state in ("queued", "running"):
                job = self.store.get_job(job_id)  # not expected: active jobs live in memory
            if job is None or job.terminal:
                ended.append(job_id)
                continue
            self._cancel(job, actor)
            cancelled.append(job_id)
        return cancelled, ended

    def commit(
        self, event: tuple[str, str | None, str | None, str] | None, detail: str | None = None
    ) -> None:
        """Write what changed now, in one transaction with the audit event when given."""
        self.uow.flush(event=event, detail=detail)

    def _cancel(self, job: Job, actor: str | None) -> None:
        job.cancelled_by = actor  # sacct's `CANCELLED by UID`
        if job.state == JobState.QUEUED:
            text = "cancelled" if actor is None else f"cancelled by {actor}"
            self.life.finish(job, EndReason.CANCELLED, text)
        else:
            self.life.request_stop(job, EndReason.CANCELLED)

    # ---- nodes ------------------------------------------------------------

    def drain(
        self, node_id: str, reason: str | None, actor: str | None = None, address: str | None = None
    ) -> NodeRecord:
        return self.node_admin.drain(node_id, reason, actor, address)

    def resume(
        self, node_id: str, actor: str | None = None, address: str | None = None
    ) -> NodeRecord:
        return self.node_admin.resume(node_id, actor, address)

    def remove_node(
        self, node_id: str, actor: str | None = None, address: str | None = None
    ) -> list[str]:
        return self.node_admin.remove(node_id, actor, address)

    # ---- agents -----------------------------------------------------------

    def refuse_hello(self, hello: Hello) -> str | None:
        return self.agents.refuse_hello(hello)

    def verify_node(self, hello: Hello) -> HelloVerdict:
        return self.agents.verify_node(hello)

    def agent_hello(self, hello: Hello, link: AgentLink, node_secret: str | None = None) -> Welcome:
        return self.agents.hello(hello, link, node_secret)

    def agent_message(self, node_id: str, msg: AgentMessage) -> None:
        self.agents.message(node_id, msg)

    def agent_disconnected(self, node_id: str, link: AgentLink) -> None:
        self.agents.disconnected(node_id, link)

    def join_allowed(self, token: str | None) -> bool:
        """Whether an agent's hello carries the cluster's join token."""
        return self.tokens.join(token)

    # ---- steps, terminals, allocations -----------------------------------

    def start_step(self, job_id: str, host: str, argv: list[str]) -> Step:
        return self.agents.start_step(job_id, host, argv)

    def step(self, step_id: str) -> Step | None:
        return self.steps.by_id.get(step_id)

    def start_alloc_step(self, job_id: str, request: StepRequest, actor: Actor) -> Step:
        """`mgpu srun` in an allocation (SubmitError: one sentence why not), audited."""
        step = self.allocations.start_step(job_id, request)
        shown = " ".join(request.argv)[:200]
        self.audit("step", actor.user, actor.address, step.id, shown)
        return step

    def start_srun(
        self, job_id: str, request: SrunRequest, actor: Actor
    ) -> tuple[TaskStep, list[str]]:
        """`srun` inside a running job: a step of tasks and srun's warnings, audited
        (SubmitError: a step the job cannot hold; Conflict: the job is not running)."""
        group, warnings = self.allocations.sruns.start(job_id, request)
        self.audit("step", actor.user, actor.address, group.id, " ".join(request.argv)[:200])
        return group, warnings

    def srun_step(self, step_id: str) -> TaskStep | None:
        return self.steps.groups.get(step_id)

    def cancel_srun(self, group: TaskStep, actor: Actor) -> bool:
        cancelled = self.allocations.sruns.cancel(group)
        if cancelled:
            self.audit("step_cancel", actor.user, actor.address, group.id)
        return cancelled

    def cancel_step(self, step: Step, actor: Actor) -> bool:
        cancelled = self.allocations.cancel_step(step)
        if cancelled:
            self.audit("step_cancel", actor.user, actor.address, step.id)
        return cancelled

    def end_allocation(self, job: Job, exit_code: int, actor: Actor) -> bool:
        """The allocation's client says its command ended; False if it had ended already."""
        ended = self.allocations.end(job, exit_code)
        if ended:
            event = ("alloc_end", actor.user, actor.address, job.id)
            self.uow.flush(event=event, detail=f"exit code {exit_code}")
        return ended

    def client_alive(self, run_id: str) -> None:
        """The client holding a run (terminal, allocation) is still there."""
        self.sessions.touch(run_id)

    def terminal_input(self, run_id: str, data: bytes) -> None:
        self.sessions.terminal_input(run_id, data)

    def terminal_input_room(self, run_id: str) -> asyncio.Event | None:
        """None when the run's client may send more input now, else an event to wait for."""
        return self.sessions.input_room(run_id)

    def resize_terminal(self, run_id: str, rows: int, cols: int) -> None:
        self.sessions.resize(run_id, rows, cols)

    # ---- output -----------------------------------------------------------

    def watch_output(self, run_id: str) -> asyncio.Event:
        """An event set whenever output of the job or step is appended (`unwatch_output`)."""
        return self.outputs.subscribe(run_id)

    def unwatch_output(self, run_id: str, wake: asyncio.Event) -> None:
        self.outputs.unsubscribe(run_id, wake)

    def output_reader(self, run_id: str, since: int = 0, follow: bool = True) -> OutputReader:
        return self.outputs.reader(run_id, since, follow=follow)

    def readiness(self) -> dict[str, Any]:
        """`/readyz`: whether the store takes writes and the loop runs, and nodes online."""
        online = sum(1 for n in self.nodes.values() if n.schedulable)
        loop_alive = self.clock.monotonic() - self.loop_tick < 10
        try:  # a database that does not answer: no write waits in line for it
            if writable := self.store.answering():
                self.store.set_meta("readyz", str(time.time()))
        except Exception:
            writable = False
        ready = writable and loop_alive
        return {
            "ready": ready,
            "store_writable": writable,
            "scheduler_alive": loop_alive,
            "nodes_online": online,
        }

    # ---- the loop ---------------------------------------------------------

    async def run(self) -> None:
        await asyncio.gather(
            self.loop.run(),
            self.notifier.run(),
            self.loop_lag.run(),
            self.retention.run(),
            *(service() for service in self.services),
        )

    def wake(self) -> None:
        self.state.wake()

    @property
    def loop_tick(self) -> float:
        return self.loop.loop_tick

    @property
    def last_pass_duration(self) -> float:
        return self.loop.last_pass_duration

    @property
    def last_full_pass_duration(self) -> float:
        return self.loop.last_full_seconds

    def flush(self) -> None:
        self.uow.flush()

    def flush_all(self) -> None:
        """Everything to disk now (shutdown)."""
        self.uow.flush_all()

    def close(self) -> None:
        """Shutdown, after `flush_all`: the output files and the store closed."""
        self.outputs.close_all()
        self.store.close()


QUEUED_PER_TURN = 5_000
"""A big array's tasks told to the scheduling loop per turn of the event loop at most."""
