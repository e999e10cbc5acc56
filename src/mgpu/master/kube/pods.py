"""Jobs' runs as Pods: made at a launch, followed to their end, deleted at a kill.

What an agent does with a run, done through the API server: the master's messages to a
Kubernetes Node (`deliver`: launch, kill, time limit, forget, port) become Pods made and
deleted; what the Pods do becomes the agent's messages to the master (started, output,
exited), so the controller's rules apply unchanged: the run's states, exit code, time
limit, a node's failure and requeue.  What has no agent's word is decided here:

* a Pod that stays unschedulable past `unschedulable_timeout` (another workload won the
  race): every Pod of the run is deleted and the job goes back to the queue with
  Kubernetes' own sentence and a backoff (`NO_ROOM`: no retry spent, no node blamed);
* an image that cannot be pulled past `image_pull_timeout`: the job fails with the reason;
* an evicted or preempted Pod, or one deleted by someone else once it ran: its node's
  failure (`NODE_LOST`: requeued by mgpu's rules);
* a Pod stuck Terminating past its grace plus `force_delete_after`: force-deleted (its
  resources stay counted taken until it is gone: mgpu.master.kube.capacity).
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from mgpu import exits
from mgpu.kube import (
    KubeClient,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeUnauthorized,
    KubeUnreachable,
    PodView,
    unschedulable_message,
)
from mgpu.kubesection import KubernetesSection
from mgpu.master.kube.gang import first_pod_ip, holder_launch
from mgpu.master.kube.podagents import PodAgents
from mgpu.master.kube.podsecrets import PodSecrets
from mgpu.master.kube.podspec import CONTAINER, PodShape, build_pod, keep_private, pod_name
from mgpu.master.kube.runs import (
    IMAGE_FAILURES,
    NO_ROOM_REASONS,
    PodRun,
    container_end,
    container_state,
    generation_of,
    waiting_message,
)
from mgpu.master.state.steps import is_step_id
from mgpu.model import EndReason, Job, JobState, SlotPhase
from mgpu.protocol import (
    Exited,
    Forget,
    Kill,
    Launch,
    Output,
    PortReserved,
    ReservePort,
    SetTimeLimit,
    SignalRun,
    Started,
)

if TYPE_CHECKING:
    from mgpu.master.control.cluster import Cluster

log = logging.getLogger("mgpu.master.kube")

__all__ = ["PodRuns", "past_limit"]

RENDEZVOUS_PORT = 29500
"""MASTER_PORT of a job on several Pods: each Pod has its own address, so no port is
reserved (torchrun's default)."""
MAX_BACKOFF = 300.0


class PodRuns:
    def __init__(
        self,
        cluster: Cluster,
        partition: str,
        section: KubernetesSection,
        client: KubeClient,
        agents: PodAgents | None = None,
    ) -> None:
        self.cl = cluster
        self.agents = agents if agents is not None else PodAgents()
        """The pod agents that run the jobs' steps (mgpu.master.kube.podagents)."""
        self.agents.partitions.append(self)
        self.partition = partition
        self.section = section
        self.client = client
        self.namespace = section.namespace
        self.runs: dict[str, PodRun] = {}
        """Pod name → its run."""
        self.no_room: dict[str, int] = {}
        """Job id → times it was sent back for want of room (its backoff)."""
        self.awaiting: dict[tuple[str, int, str], bool] = {}
        """(job, epoch, node) of a gang's rank whose Pod waits for rank 0's address →
        whether it was killed meanwhile (its Pod is then never made)."""
        self.secrets = PodSecrets(client, self.namespace)
        """The jobs' Pods' Secrets (mgpu.master.kube.podsecrets)."""
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- plumbing ---------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a Kubernetes task failed", exc_info=task.exception())

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def tell(self, node_id: str, message: BaseModel) -> None:
        """Give the master a message as if the node's agent sent it."""
        self.cl.agent_message(node_id, message)  # type: ignore[arg-type]

    def _job(self, job_id: str, epoch: int) -> Job | None:
        job = self.cl.jobs.get(job_id)
        ok = job is not None and job.state == JobState.RUNNING and job.epoch == epoch
        return job if ok else None

    def of_job(self, job_id: str, epoch: int) -> list[PodRun]:
        runs = [r for r in self.runs.values() if r.job_id == job_id and r.epoch == epoch]
        return sorted(runs, key=lambda r: r.rank)

    # ---- the master's messages --------------------------------------------

    def deliver(self, node_id: str, message: BaseModel) -> None:
        """A message of the master to a Node's agent (called as the unit of work sends
        it: what it causes happens after, on the loop)."""
        loop = asyncio.get_running_loop()
        if is_step_id(getattr(message, "job_id", "")):
            if self.section.steps is not None:  # the job's Pod's agent runs it
                loop.call_soon(self.agents.deliver, self, node_id, message)
            elif isinstance(message, Launch):
                refused = _exited(message.job_id, message.epoch, launch_error=self._no_steps())
                loop.call_soon(self.tell, node_id, refused)
        elif isinstance(message, Launch):
            self.spawn(self.launch(node_id, message))
        elif isinstance(message, SignalRun):
            if self.section.steps is not None:  # the job's Pods' agents send it
                loop.call_soon(self.agents.signal_job, self, node_id, message)
            else:  # refused before it is sent (mgpu.master.control.jobctl)
                log.warning("%s: no signal without kubernetes.steps", node_id)
        elif isinstance(message, Kill):
            self.kill(node_id, message.job_id, message.epoch, message.grace, message)
        elif isinstance(message, SetTimeLimit):
            for run in self.runs.values():
                if run.job_id == message.job_id and run.epoch == message.epoch:
                    run.time_limit = message.time_limit
        elif isinstance(message, ReservePort):
            port = PortReserved(job_id=message.job_id, epoch=message.epoch, port=RENDEZVOUS_PORT)
            loop.call_soon(self.tell, node_id, port)
        elif isinstance(message, Forget):
            for run in list(self.runs.values()):
                if (run.job_id, run.epoch, run.slot_node) == (
                    message.job_id,
                    message.epoch,
                    node_id,
                ):
                    self.spawn(self.delete(run, grace=None))
        else:
            log.info("%s: %s is not done on Kubernetes", node_id, type(message).__name__)

    async def launch(self, node_id: str, launch: Launch) -> None:
        job = self._job(launch.job_id, launch.epoch)
        if job is None:
            return
        rank = next(i for i, s in enumerate(job.allocation) if s.node_id == node_id)
        try:
            uid, gid = self._identity(launch)
        except LookupError as e:
            self.tell(node_id, _exited(launch.job_id, launch.epoch, launch_error=str(e)))
            return
        if rank == 0:  # the held slots' Pods (mgpu.master.kube.gang), made with rank 0's
            nodes = self.cl.nodes
            for held, slot in enumerate(job.allocation):
                if held and slot.phase == SlotPhase.HELD:
                    credential = launch.env.get("MGPU_TOKEN") if self.section.steps else None
                    holder = holder_launch(launch, job, held, nodes, credential)
                    self.spawn(self._create(job, slot.node_id, holder, held, (uid, gid), True))
        await self._create(job, node_id, launch, rank, (uid, gid), False)

    async def _create(
        self,
        job: Job,
        node_id: str,
        launch: Launch,
        rank: int,
        ids: tuple[int, int],
        holds: bool,
    ) -> None:
        """Make the Pod of rank `rank`: the other ranks of a gang once rank 0's Pod has
        its address (their rendezvous)."""
        gang = len(job.allocation)
        master_addr = None
        if gang > 1 and rank > 0 and not holds:
            master_addr = await self._rank0_address(job, launch.epoch, node_id)
            if master_addr is None:
                return
        first = self.cl.nodes.get(job.allocation[0].node_id)
        shape = PodShape(
            cluster=self.cl.config.cluster.name,
            rank=rank,
            slot_node=node_id,
            pinned=job.nodelist is not None,
            gang=gang,
            gpus=len(launch.grant.gpus),
            uid=ids[0],
            gid=ids[1],
            master_addr=master_addr,
            node_addr=first.ip if first is not None else "",
            holds=holds,
            generation=self.generation(),
        )
        pod = build_pod(launch, self.section, shape)
        secret = keep_private(pod)
        name = pod["metadata"]["name"]
        run = PodRun(name, launch.job_id, launch.epoch, rank, node_id, time.monotonic())
        run.time_limit, run.kill_grace = launch.time_limit, launch.kill_grace
        if launch.signal is not None:
            self.arm_warning(run, launch.signal, launch.signal_lead, launch.signal_batch)
        run.image = str(pod["spec"]["containers"][0].get("image") or "")
        run.holds = holds
        self.runs[name] = run
        try:
            if secret is not None:
                await self.secrets.create(secret)
            made = await self.client.create_pod(pod, self.namespace)
            run.uid = str((made.get("metadata") or {}).get("uid", ""))
        except KubeConflict:
            # Made already: by this master (a launch sent again: the watch has it), or by
            # a deposed one whose launch was never stored (its Pod must not run as ours).
            if await self._deposed_pod_in_the_way(run, launch):
                return
        except KubeError as e:
            self.runs.pop(name, None)
            if secret is not None:
                self.spawn(self.secrets.delete(name))
            if isinstance(e, KubeUnreachable):
                self.send_back(launch.job_id, launch.epoch, str(e))
                return
            error = " ".join([str(e), *e.causes])
            teller = job.allocation[0].node_id  # a held slot has no exit of its own
            self.tell(teller, _exited(launch.job_id, launch.epoch, launch_error=error))
            return
        if secret is not None and run.uid:
            self.spawn(self.secrets.own(name, run.uid))
        if run.killing:  # killed while it was being made
            await self.delete(run, grace=run.kill_grace)

    async def _rank0_address(self, job: Job, epoch: int, node_id: str) -> str | None:
        """The address a gang's rank meets rank 0 at; None when its Pod is not to be
        made: the run is over, or this rank was killed while it waited (rank 0 failed
        first: its exit is told here, as no Pod will tell it), or rank 0's Pod ended
        without an address."""
        key = (job.id, epoch, node_id)
        self.awaiting[key] = False
        try:
            address = await first_pod_ip(
                lambda: next((r for r in self.of_job(job.id, epoch) if r.rank == 0), None),
                lambda: self._job(job.id, epoch) is not None and not self.awaiting[key],
            )
        finally:
            killed = self.awaiting.pop(key)
        if address is not None or self._job(job.id, epoch) is None:
            return address
        why = None if killed else "the job's rank-0 pod ended before it had an address"
        self.tell(node_id, _exited(job.id, epoch, launch_error=why))
        return None

    def arm_warning(self, run: PodRun, number: int, lead: float, batch: bool) -> None:
        """`--signal`'s warning for `run`, sent `lead` seconds before its time limit by its
        Pod's agent (none without kubernetes.steps: nothing in the Pod could send it)."""
        if self.section.steps is None:
            return
        run.warn_lead = lead
        run.warning = SignalRun(job_id=run.job_id, epoch=run.epoch, signal=number, top_only=batch)

    def _no_steps(self) -> str:
        return (
            f"job steps (srun, mgpu rsh) do not run on Kubernetes partition {self.partition}: "
            "its config has no kubernetes.steps"
        )

    def generation(self) -> int | None:
        """This master's lease generation (None: one master, no lease)."""
        return self.cl.store.fence.generation

    async def _deposed_pod_in_the_way(self, run: PodRun, launch: Launch) -> bool:
        """The Pod named as this run's was made by another master generation: a deposed
        leader's, for a launch it never stored.  It is deleted and the job sent back (its
        next run is another Pod); True then."""
        mine = self.generation()
        try:
            there = generation_of(PodView.of(await self.client.get_pod(run.name, self.namespace)))
        except KubeError as e:
            log.warning("%s", e)
            return False
        if mine is None or there == mine:
            return False
        why = f"pod {run.name} of another master (generation {there}) was in the way"
        self.send_back(launch.job_id, launch.epoch, why)
        return True

    def _identity(self, launch: Launch) -> tuple[int, int]:
        """The uid and gid the Pod runs as: the job's user's, as this machine knows it."""
        user = launch.user or self.cl.default_user
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise LookupError(f"user {user} is not known on the master") from None
        if entry.pw_uid == 0 and not (self.section.allow_root and launch.allow_root):
            raise LookupError(
                f"jobs do not run as root on Kubernetes partition {self.partition} "
                "(kubernetes.allow_root is false)"
            )
        return entry.pw_uid, entry.pw_gid

    def kill(
        self, node_id: str, job_id: str, epoch: int | None, grace: float, kill: Kill | None = None
    ) -> None:
        """Delete the run's Pods on `node_id` with `grace`; a `kill` that names a signal
        (`--signal`'s warning) has it sent first by the Pods' agents, and the job
        `signal_lead` seconds to end on its own (only with kubernetes.steps)."""
        for key in self.awaiting:  # a Pod not made yet is never made
            if key[0] == job_id and key[2] == node_id and epoch in (None, key[1]):
                self.awaiting[key] = True
        warn = kill is not None and kill.signal is not None and self.section.steps is not None
        lead = kill.signal_lead if warn and kill is not None else 0.0
        for run in list(self.runs.values()):
            if run.job_id != job_id or run.slot_node != node_id or run.ended:
                continue
            if epoch is not None and run.epoch != epoch:
                continue
            if not run.killing:
                run.killing = True
                run.force_at = time.monotonic() + lead + grace + self.section.force_delete_after
                if warn and kill is not None and kill.signal is not None:
                    signal = SignalRun(
                        job_id=run.job_id,
                        epoch=run.epoch,
                        signal=kill.signal,
                        top_only=kill.signal_batch,
                    )
                    self.agents.signal_pod(run, signal)
                    self.spawn(self._delete_after(run, lead, grace))
                else:
                    # A Pod still being made is not found: `launch` deletes it once it is.
                    self.spawn(self.delete(run, grace=grace))

    async def _delete_after(self, run: PodRun, lead: float, grace: float) -> None:
        """Delete the Pod `lead` seconds after its signal, or once it ended on its own."""
        deadline = time.monotonic() + lead
        while not (run.ended or run.gone) and time.monotonic() < deadline:
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if not run.gone:
            await self.delete(run, grace=grace)

    async def delete(self, run: PodRun, grace: float | None, force: bool = False) -> None:
        try:
            await self.client.delete_pod(
                run.name, self.namespace, grace_seconds=_grace(grace), force=force
            )
        except (KubeForbidden, KubeUnauthorized) as e:
            log.warning("%s", e)
            if run.killing and not run.ended:
                self._refused_kill(run, str(e))
        except KubeError as e:
            log.warning("%s", e)

    def _refused_kill(self, run: PodRun, why: str) -> None:
        """The API server refuses to delete a run's Pod (RBAC narrowed): no deletion will
        ever be seen, so the run ends now (its job is not left waiting for one) and the Pod
        is left where it is: no longer the job's, it counts as another workload's, its GPUs
        taken until someone deletes it."""
        run.ended = True
        run.force_at = None
        log.error("pod %s is left running: %s", run.name, why)
        if not run.holds:
            self.tell(run.slot_node, _exited(run.job_id, run.epoch, timed_out=run.timed_out))

    # ---- what the Pods do -------------------------------------------------

    def observe(self, run: PodRun, pod: dict[str, Any], deleted: bool) -> None:
        """A change of one of mgpu's Pods (or its deletion)."""
        view = PodView.of(pod)
        run.uid, run.node, run.phase = view.uid, view.node, view.phase
        run.ip = str((pod.get("status") or {}).get("podIP") or "") or run.ip
        if view.deleting and run.phase not in ("Succeeded", "Failed"):
            run.phase = "Terminating"
        self._show(run.job_id, run.epoch)
        if deleted:
            run.gone = True
            self.runs.pop(run.name, None)
        if run.ended:
            return
        state, details = container_state(pod)
        now = time.monotonic()
        if run.holds and state:
            run.started_at = run.started_at or now
        elif state in ("running", "terminated") and run.log_task is None:
            self._started(run, view, pod)
        if state == "terminated" and run.holds:
            if not run.killing:  # nobody ended it: what it held is no longer held
                self.lost(run, f"pod {run.name} holding the job's slot ended")
            run.ended = True
            return
        if state == "terminated":
            if not run.finishing:
                run.finishing = True
                self.spawn(self._finish(run, view, details))
            return
        if deleted:
            self._gone(run, view)
            return
        if view.phase == "Failed":
            self._failed(run, view)
            return
        unschedulable = unschedulable_message(pod)
        if unschedulable is not None and not view.node:
            run.unschedulable_since = run.unschedulable_since or now
            run.unschedulable_why = unschedulable
        else:
            run.unschedulable_since = None
        if state == "waiting" and str(details.get("reason")) in IMAGE_FAILURES:
            run.pull_since = run.pull_since or now
            run.pull_why = waiting_message(details)
        else:
            run.pull_since = None

    def _started(self, run: PodRun, view: PodView, pod: dict[str, Any]) -> None:
        run.started_at = run.started_at or time.monotonic()
        ip = str((pod.get("status") or {}).get("podIP") or "") or self._node_ip(view.node)
        try:
            started = Started(
                job_id=run.job_id,
                epoch=run.epoch,
                pid=1,
                hostname=view.node or run.slot_node,
                ip=ip,
                time=time.time(),
            )
        except ValueError:
            started = Started(
                job_id=run.job_id, epoch=run.epoch, pid=1, hostname=run.slot_node,
                ip="0.0.0.0", time=time.time(),
            )  # fmt: skip
        self.tell(run.slot_node, started)
        run.log_task = asyncio.get_running_loop().create_task(self._follow(run))

    def _node_ip(self, node_id: str) -> str:
        node = self.cl.nodes.get(node_id)
        return node.ip if node is not None and node.ip else "0.0.0.0"

    async def _follow(self, run: PodRun) -> None:
        """The Pod's log as the run's output, with byte offsets: after a master restart it
        is read again from its start and the master keeps only what it lacks."""
        offset = 0
        try:
            async for line in self.client.follow_log(run.name, self.namespace, container=CONTAINER):
                if offset == 0:
                    run.first_line = line.text
                data = line.text + "\n"
                end = offset + len(data.encode())
                out = Output(job_id=run.job_id, epoch=run.epoch, stream="o", data=data)
                out.offset, out.end = offset, end
                self.tell(run.slot_node, out)
                offset = end
        except KubeError as e:
            log.warning("the output of job %s: %s", run.job_id, e)

    async def _finish(self, run: PodRun, view: PodView, details: dict[str, Any]) -> None:
        """Its container ended: its whole log to the master, then its exit."""
        if run.log_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(run.log_task), 60)
            except TimeoutError:
                log.warning("the log of pod %s did not end: its exit is told", run.name)
        if run.ended:
            return
        if view.phase == "Failed" and view.reason and not view.deleting:
            self._failed(run, view)
            return
        run.ended = True
        reason = str(details.get("reason") or "")
        code = container_end(details)
        first = [run.first_line] if run.first_line is not None else []  # the runner's say
        self.tell(
            run.slot_node,
            _exited(
                run.job_id,
                run.epoch,
                exit_code=code,
                launch_error=exits.open_failure(code, first),  # an -o/-e file: fatal
                timed_out=run.timed_out,
                out_of_memory=reason == "OOMKilled",
            ),
        )

    def _failed(self, run: PodRun, view: PodView) -> None:
        """The Pod failed without its container's end: refused by its kubelet for want
        of room (a pinned Pod), else evicted or preempted: its node's failure."""
        why = f"pod {run.name} on {view.node or run.slot_node}: {view.reason or 'failed'}"
        if any(view.reason.startswith(r) for r in NO_ROOM_REASONS):
            self.send_back(run.job_id, run.epoch, why)
        else:
            self.lost(run, why)

    def _gone(self, run: PodRun, view: PodView) -> None:
        """Deleted before its container's end was seen."""
        if run.killing:
            run.ended = True
            if not run.holds:
                self.tell(run.slot_node, _exited(run.job_id, run.epoch, timed_out=run.timed_out))
        elif run.started_at is None:
            job = self._job(run.job_id, run.epoch)
            run.ended = True
            if job is not None:
                self.cl.life.slot_lost(job, EndReason.NOT_LAUNCHED, f"pod {run.name} deleted")
        else:
            self.lost(run, f"pod {run.name} was deleted on {view.node or run.slot_node}")

    def lost(self, run: PodRun, why: str) -> None:
        """The run is gone without its exit: its node's failure, as an agent that no
        longer has it (requeued by mgpu's rules)."""
        for other in self.of_job(run.job_id, run.epoch):
            other.ended = True
        run.ended = True
        job = self._job(run.job_id, run.epoch)
        node = self.cl.nodes.get(run.slot_node)
        if job is None:
            return
        if node is not None and job.stop_reason is None:
            self.cl.node_admin.charge_failure(node, why)
        self.cl.life.slot_lost(job, EndReason.NODE_LOST, why)

    def send_back(self, job_id: str, epoch: int, why: str) -> None:
        """Kubernetes has no room for the run: every Pod of it deleted, the job queued
        again with a backoff (no retry spent, no node blamed)."""
        for run in self.of_job(job_id, epoch):
            run.ended = True
            self.spawn(self.delete(run, grace=None, force=True))
        job = self._job(job_id, epoch)
        if job is None:
            return
        count = self.no_room[job_id] = self.no_room.get(job_id, 0) + 1
        self.cl.life.requeue(job, EndReason.NO_ROOM, f"Kubernetes has no room: {why}")
        backoff = min(self.section.requeue_backoff * 2 ** (count - 1), MAX_BACKOFF)
        job.eligible_time = max(job.eligible_time, time.time() + backoff)
        self.cl.uow.persist(job)
        log.info("job %s back to the queue for %.0f s: %s", job_id, backoff, why)

    def _show(self, job_id: str, epoch: int) -> None:
        """The job's `pods` as its Pods now are; a Pod of this run already deleted (its
        rank ended and was forgotten first) stays listed as it last was."""
        job = self._job(job_id, epoch)
        if job is None:
            return
        runs = self.of_job(job_id, epoch)
        pods = [{"name": r.name, "node": r.node, "phase": r.phase} for r in runs]
        names = {r.name for r in runs}
        cluster = self.cl.config.cluster.name
        ranks = {pod_name(cluster, job_id, epoch, r): r for r in range(len(job.allocation))}
        pods += [p for p in job.pods if p.get("name") in ranks and p.get("name") not in names]
        pods.sort(key=lambda p: ranks.get(str(p.get("name")), 0))
        if pods and pods != job.pods:
            job.pods = pods
            self.cl.uow.persist(job)

    # ---- bounded waits ----------------------------------------------------

    def check(self, now: float) -> None:
        """The waits that ran out: for room, for an image, the time limit, a Pod stuck
        being deleted."""
        section = self.section
        self.agents.check(now)
        for run in list(self.runs.values()):
            if not run.killing and self._job(run.job_id, run.epoch) is None:
                # The master gave the run up without a kill (its node was lost, say): its
                # Pod must not stay behind, holding what it holds.
                self.kill(run.slot_node, run.job_id, run.epoch, run.kill_grace)
            if run.ended:
                if run.killing and run.force_at is not None and now > run.force_at:
                    self._force(run)
                continue
            since = run.unschedulable_since
            if since is not None and now - since > section.unschedulable_timeout:
                self.send_back(run.job_id, run.epoch, run.unschedulable_why)
                continue
            if run.pull_since is not None and now - run.pull_since > section.image_pull_timeout:
                self._image_failed(run)
                continue
            if run.warning is not None and past_limit(run, now, lead=run.warn_lead):
                self.agents.signal_pod(run, run.warning)  # --signal's, as an agent's
                run.warning = None
            if past_limit(run, now) and not run.holds:
                run.timed_out = True
                self.kill(run.slot_node, run.job_id, run.epoch, run.kill_grace)
            if run.killing and run.force_at is not None and now > run.force_at:
                self._force(run)

    def _force(self, run: PodRun) -> None:
        run.force_at = None
        if not run.gone:
            log.warning("pod %s is still terminating past its grace: force-deleted", run.name)
            self.spawn(self.delete(run, grace=None, force=True))

    def _image_failed(self, run: PodRun) -> None:
        for other in self.of_job(run.job_id, run.epoch):
            other.ended = True
            self.spawn(self.delete(other, grace=None, force=True))
        error = f"the image {run.image} cannot be pulled ({run.pull_why})"
        job = self._job(run.job_id, run.epoch)
        teller = job.allocation[0].node_id if job is not None else run.slot_node
        self.tell(teller, _exited(run.job_id, run.epoch, launch_error=error))


def past_limit(run: PodRun, now: float, lead: float = 0.0) -> bool:
    """Whether the run is within `lead` seconds of its time limit, or past it."""
    limit, started = run.time_limit, run.started_at
    if limit is None or started is None or run.killing:
        return False
    return now - started > limit - lead


def _grace(grace: float | None) -> int | None:
    return None if grace is None else max(1, round(grace))


def _exited(
    job_id: str,
    epoch: int,
    *,
    exit_code: int | None = None,
    launch_error: str | None = None,
    timed_out: bool = False,
    out_of_memory: bool = False,
) -> Exited:
    """An exit to tell the master; a `launch_error` here is fatal (the job's, not a node's)."""
    return Exited(
        job_id=job_id,
        epoch=epoch,
        exit_code=exit_code,
        time=time.time(),
        timed_out=timed_out,
        launch_error=launch_error,
        fatal=launch_error is not None,
        out_of_memory=out_of_memory,
    )
