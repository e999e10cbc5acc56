"""Jobs, nodes and their state machines.

A job's `state` is what the master observed (queued, running, or how it ended); what the
master *wants* of a running job is apart from it (`Job.desired`, Nomad's DesiredStatus
beside its ClientStatus).  Every state change goes through `Job.transition`, so the allowed
moves live in one place (`ALLOWED`); why a run ended is an `EndReason`, which decides the
next state and whether a retry is spent (`mgpu.master.control.lifecycle` applies it).  Each slot of
a run has its own launch phase (`SlotPhase`).  Node states move by `NODE_MOVES`.  The
master writes a job to the store right after each transition and before acting on it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.slurmoptions import OPEN_MODES as OPEN_MODES
from mgpu.slurmoptions import SlurmOptions as SlurmOptions


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})

ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    # running -> queued is a requeue (node lost, preemption, launch failure).
    JobState.RUNNING: frozenset(
        {
            JobState.QUEUED,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
        }
    ),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMEOUT: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


class DesiredState(StrEnum):
    """What the master wants of a running job; it gets there by killing its processes."""

    RUN = "run"
    STOP = "stop"
    """End it (cancelled, idle): it ends cancelled once its processes are gone."""
    PREEMPT = "preempt"
    """Make room for higher-priority work: back to the queue, no retry spent."""
    REQUEUE = "requeue"
    """Run it again later (`mgpu requeue`): back to the queue, no retry spent."""


class EndReason(StrEnum):
    """Why a run (or a queued job) ended: decides the job's next state (`to_state`) and
    whether a retry is spent (`counts_retry`), as dstack's JobTerminationReason does.  The
    text shown in `reason` is separate: these are for control flow, never the text."""

    EXIT_OK = "exit_ok"
    EXIT_NONZERO = "exit_nonzero"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    IDLE = "idle"
    """Cancelled for leaving its GPUs idle (`scheduling.idle_action: cancel`)."""
    DEPENDENCY_NEVER = "dependency_never"
    """A dependency that can never be satisfied."""
    NEVER_FITS = "never_fits"
    """Queued before any node joined, and could never run on the nodes that did."""
    LAUNCH_FATAL = "launch_fatal"
    """The launch cannot succeed anywhere (no such user, a message that cannot be sent)."""
    RETRIES_EXHAUSTED = "retries_exhausted"
    NODE_LOST = "node_lost"
    """Its node went silent, restarted without it, or was removed."""
    LAUNCH_FAILED = "launch_failed"
    """The node could not launch it (the node's fault): tried elsewhere, a retry spent."""
    PROLOG_FAILED = "prolog_failed"
    """The site's prolog refused the node: tried again without spending a retry."""
    NOT_LAUNCHED = "not_launched"
    """Its launch never reached the agent (a master crash before it was sent): free."""
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    OUT_OF_MEMORY = "out_of_memory"
    """Killed by its node for going past its memory limit: its own failure, no retry spent,
    the node not blamed."""
    NO_ROOM = "no_room"
    """Kubernetes had no room for its Pods after all (another workload won the race):
    back to the queue with a backoff, no retry spent, no node blamed."""

    def to_state(self) -> JobState:
        return _END_STATE[self]

    @property
    def counts_retry(self) -> bool:
        """Whether a requeue for this reason spends one of the job's retries."""
        return self in (EndReason.NODE_LOST, EndReason.LAUNCH_FAILED)

    @property
    def desired(self) -> DesiredState:
        """The desired state of a running job being stopped for this reason."""
        return _STOP_DESIRED.get(self, DesiredState.STOP)

    @property
    def end_code(self) -> EndCode:
        """The job's public `end_code` when it ends for this reason (a requeue reason: when
        it ends for want of retries, this being its last run's)."""
        return _END_CODE.get(self, EndCode.FAILED)

    @property
    def run_end(self) -> str | None:
        """How a run that ended for this reason ended, the job JSON's `end_reason` code
        (None: the reason ends no run, as a queued job's)."""
        return _RUN_END.get(self, self.value)


class WaitCode(StrEnum):
    """Why a queued job waits, typed (the job's `reason_code`, beside its English `reason`):
    what Slurm's commands map to their reason codes (mgpu.slurm.states), never the text."""

    RESOURCES = "resources"
    """Its GPUs are in use."""
    PRIORITY = "priority"
    """It would fit, but higher-priority work waits ahead of it for the same GPUs."""
    DEPENDENCY = "dependency"
    DEPENDENCY_NEVER_SATISFIED = "dependency_never_satisfied"
    """A Slurm job whose dependency can never be met (`afterok` on a job that failed): it
    stays queued, as in Slurm, unless it asked `--kill-on-invalid-dep=yes`."""
    BEGIN_TIME = "begin_time"
    """Not before a time (`--begin`, or a requeued job's backoff)."""
    HELD = "held"
    """`mgpu hold` / `scontrol hold` (by whom: the job's `held_by`)."""
    RESERVATION = "reservation"
    """Waiting for its reservation (its start, or its GPUs)."""
    NODE_NOT_AVAILABLE = "node_not_available"
    """The nodes it asked for are down or drained."""
    USER_JOB_LIMIT = "user_job_limit"
    """Its user is at the limit of running jobs."""
    USER_GPU_LIMIT = "user_gpu_limit"
    """Its user is at the limit of GPUs in use."""
    ARRAY_LIMIT = "array_limit"
    """Its array is at its `%N` limit of running tasks."""
    PARTITION_TIME_LIMIT = "partition_time_limit"
    """A Slurm job whose time limit is over its partition's `max_time`: it waits until one
    of them changes (`scontrol update TimeLimit=`)."""


class EndCode(StrEnum):
    """How an ended job ended, typed (the job's `end_code`, beside its English `reason`):
    what Slurm's commands map to their states (mgpu.slurm.states), never the text."""

    COMPLETED = "completed"
    FAILED = "failed"
    """Its command failed (a non-zero exit, a signal)."""
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"
    """Out of retries, its last run's node lost (silent, restarted without it, removed)."""
    BOOT_FAIL = "boot_fail"
    """Out of retries, its last run's node could not launch it (the node's fault)."""
    LAUNCH_FAILED = "launch_failed"
    """It could be launched nowhere (no such user, a launch that cannot be sent)."""
    IDLE = "idle"
    """Cancelled for leaving its GPUs idle."""
    DEPENDENCY_NEVER = "dependency_never"
    """Cancelled: a dependency that can never be satisfied."""
    NEVER_FITS = "never_fits"
    """Failed: it could never run on the cluster's nodes."""
    OUT_OF_MEMORY = "out_of_memory"
    """Failed: killed by its node for going past its memory limit."""


_END_CODE: dict[EndReason, EndCode] = {
    EndReason.EXIT_OK: EndCode.COMPLETED,
    EndReason.EXIT_NONZERO: EndCode.FAILED,
    EndReason.TIMEOUT: EndCode.TIMEOUT,
    EndReason.CANCELLED: EndCode.CANCELLED,
    EndReason.IDLE: EndCode.IDLE,
    EndReason.DEPENDENCY_NEVER: EndCode.DEPENDENCY_NEVER,
    EndReason.NEVER_FITS: EndCode.NEVER_FITS,
    EndReason.LAUNCH_FATAL: EndCode.LAUNCH_FAILED,
    EndReason.NODE_LOST: EndCode.NODE_FAIL,
    EndReason.LAUNCH_FAILED: EndCode.BOOT_FAIL,
    EndReason.OUT_OF_MEMORY: EndCode.OUT_OF_MEMORY,
}
"""The others end no job: RETRIES_EXHAUSTED takes its last requeue reason's code, and the
requeue reasons that spend no retry never run out of them (FAILED, should one ever)."""

_END_STATE: dict[EndReason, JobState] = {
    EndReason.EXIT_OK: JobState.COMPLETED,
    EndReason.EXIT_NONZERO: JobState.FAILED,
    EndReason.TIMEOUT: JobState.TIMEOUT,
    EndReason.CANCELLED: JobState.CANCELLED,
    EndReason.IDLE: JobState.CANCELLED,
    EndReason.DEPENDENCY_NEVER: JobState.CANCELLED,
    EndReason.NEVER_FITS: JobState.FAILED,
    EndReason.LAUNCH_FATAL: JobState.FAILED,
    EndReason.RETRIES_EXHAUSTED: JobState.FAILED,
    EndReason.NODE_LOST: JobState.QUEUED,
    EndReason.LAUNCH_FAILED: JobState.QUEUED,
    EndReason.PROLOG_FAILED: JobState.QUEUED,
    EndReason.NOT_LAUNCHED: JobState.QUEUED,
    EndReason.PREEMPTED: JobState.QUEUED,
    EndReason.REQUEUED: JobState.QUEUED,
    EndReason.OUT_OF_MEMORY: JobState.FAILED,
    EndReason.NO_ROOM: JobState.QUEUED,
}
_RUN_END: dict[EndReason, str | None] = {
    EndReason.EXIT_OK: "exit",
    EndReason.EXIT_NONZERO: "exit",
    EndReason.IDLE: "cancelled",
    EndReason.LAUNCH_FATAL: "launch_failed",
    EndReason.NOT_LAUNCHED: "launch_failed",
    EndReason.DEPENDENCY_NEVER: None,
    EndReason.NEVER_FITS: None,
    EndReason.RETRIES_EXHAUSTED: None,
}
"""`EndReason.run_end` where it is not the reason's own value."""
_STOP_DESIRED = {
    EndReason.PREEMPTED: DesiredState.PREEMPT,
    EndReason.REQUEUED: DesiredState.REQUEUE,
}


ALLOCATION = "allocation"
"""`Job.kind` of an allocation (`mgpu alloc`)."""


class SlotPhase(StrEnum):
    """Where the launch of one slot stands: pending → sent → started → exited."""

    PENDING = "pending"
    """Allocated; the launch waits (for the rank-0 node's port) and has not been sent."""
    SENT = "sent"
    """The launch is on its way (stored before it is sent); the agent has not said started."""
    STARTED = "started"
    """The agent reported the process started."""
    EXITED = "exited"
    """Its process ended (or the run was given up: requeued)."""
    HELD = "held"
    """No process of its own: the GPUs of an `--mpi` job's other ranks, or of an allocation,
    used by its steps."""


class NodeState(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    DRAINING = "draining"
    DRAINED = "drained"


class NodeEvent(StrEnum):
    """What moves a node's state, and who makes it happen."""

    JOINED = "joined"
    """Its agent said hello (master/control/agents.py)."""
    LOST = "lost"
    """Silent past the timeout (master/liveness.py)."""
    DRAIN = "drain"
    """An admin's drain, too many consecutive failures, an epilog error."""
    RESUME = "resume"
    """An admin's resume."""
    EMPTIED = "emptied"
    """The last job left it (the GPU ledger, master/state/memory.py)."""


NODE_MOVES: dict[tuple[NodeState, NodeEvent], NodeState] = {
    # A node that joins is online; its drain request, kept while it was away, is applied
    # again at once (NodeRecord.move).
    **{(s, NodeEvent.JOINED): NodeState.ONLINE for s in NodeState},
    **{(s, NodeEvent.LOST): NodeState.OFFLINE for s in NodeState},
    (NodeState.ONLINE, NodeEvent.DRAIN): NodeState.DRAINING,
    (NodeState.DRAINING, NodeEvent.RESUME): NodeState.ONLINE,
    (NodeState.DRAINED, NodeEvent.RESUME): NodeState.ONLINE,
    (NodeState.DRAINING, NodeEvent.EMPTIED): NodeState.DRAINED,
}
"""(state, event) → next state; a pair not listed leaves the state as it is (an offline
node stays offline whatever an admin does, until its agent joins)."""


@dataclass(slots=True)
class Slot:
    """Where one part of a job runs: a node and GPUs there, plus what the agent saw."""

    node_id: str
    gpu_ids: list[int]
    hostname: str | None = None
    ip: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    phase: SlotPhase = SlotPhase.PENDING
    share_enforced: bool | None = None
    """A shared job's share is held to its limits on this node (MPS), as its agent said
    when the slot started; None: not a shared job, not started, or an older agent."""
    cpus: int | None = None
    """CPUs the slot holds on its node (None: placed before CPUs were counted, or not yet)."""
    cpu_ids: list[int] | None = None
    """Which CPUs (its cpuset), picked by the master near its GPUs; None: not pinned."""
    mem_mb: int | None = None
    """Memory (MiB) the slot holds, its limit on the node; None: not limited."""

    @property
    def done(self) -> bool:
        """No live process of this slot: it exited, or it never has one (held)."""
        return self.phase in (SlotPhase.EXITED, SlotPhase.HELD)

    @property
    def started(self) -> bool:
        """The agent has (or had) a process of this slot."""
        return self.phase in (SlotPhase.STARTED, SlotPhase.EXITED)

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Slot:
        rec = dict(rec)
        if "done" in rec:  # before launch phases: done, else started when a pid is known
            done = rec.pop("done")
            started = rec.get("pid") is not None
            phase = SlotPhase.EXITED if done else SlotPhase.STARTED if started else SlotPhase.SENT
            rec["phase"] = phase
        rec["phase"] = SlotPhase(rec.get("phase", SlotPhase.PENDING))
        return cls(**rec)


@dataclass(slots=True)
class Attempt:
    """One try at running a job (the first run, or a run after a requeue)."""

    epoch: int
    nodes: list[str]
    gpu_ids: dict[str, list[int]]
    start_time: float | None = None
    end_time: float | None = None
    end_reason: str | None = None


@dataclass(slots=True)
class Job:
    id: str
    user: str
    argv: list[str]
    command: str
    name: str | None = None
    state: JobState = JobState.QUEUED
    reason: str | None = None
    reason_code: WaitCode | None = None
    """A queued job's `reason` typed (None: any other, or not yet decided)."""
    end_code: EndCode | None = None
    """How an ended job ended, typed (None until it ends)."""
    exit_code: int | None = None
    gpus: int = 1
    gpu_ids: list[int] | None = None
    node_gpu_ids: list[tuple[str, list[int]]] | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    nodelist: list[str] | None = None
    exclude: list[str] = field(default_factory=list)
    gpu_type: str | None = None
    policy: str | None = None
    distributed: bool = False
    mpi: bool = False
    time_limit: float | None = None
    priority: int = 0
    max_retries: int = 5
    preemptible: bool = False
    dependency: list[tuple[str, str]] = field(default_factory=list)
    waited_on_dependency: bool | None = None
    """It waited in the queue for a dependency not yet met (sacct's Reason once it left the
    queue, Slurm's `state_reason_prev`; None: a record from before this was kept)."""
    array_job_id: str | None = None
    array_task_id: int | None = None
    array_max_running: int | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    interactive: bool = False
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    eligible_time: float = 0.0
    """Not before this time (backoff after a requeue)."""
    begin_time: float | None = None
    """`--begin` (`scontrol update StartTime=`): not before this time (None: no such wish)."""
    retries: int = 0
    epoch: int = 0
    """Allocation epoch: bumped at every start, so stale messages from an old run are ignored."""
    allocation: list[Slot] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    stop_reason: EndReason | None = None
    """Why the master is stopping this run (see `desired`); None: it should run."""
    stop_text: str | None = None
    """The reason the job will show when the stop is done (None: the usual text)."""
    timed_out: bool = False
    out_of_memory: bool = False
    """Its current run was killed on a node for going past its memory limit."""
    last_end: EndReason | None = None
    """How its last run ended (the job JSON's `end_reason`); None while none has ended."""
    job_token_hashes: list[str] = field(default_factory=list)
    """Hashes of this run's credentials (mgpu.master.security.auth.new_job_token): the plaintext is
    only in the job's environment and the master's memory.  Empty when not running."""
    allow_root: bool = False
    """Decided at submit from the submitting token's grant: may this job run as uid 0."""
    port: int | None = None
    """MASTER_PORT of a distributed run (reserved on the rank-0 node)."""
    failed_node: str | None = None
    """The first node whose process failed (multi-node jobs)."""
    gpu_memory_peak_mb: int | None = None
    """Highest memory used on any one of the job's GPUs (agent telemetry)."""
    gpu_util_mean: float | None = None
    """Mean utilisation (%) over every telemetry sample of the job's GPUs."""
    gpu_util_samples: int = 0
    image: str | None = None
    """Container image to run the job in (`--image`), with the node's container runtime."""
    container: dict[str, Any] | None = None
    """Its options beyond the image (mgpu.containeropts.ContainerOptions, as a dict)."""
    held: bool = False
    """Kept from starting (`--hold`, `mgpu hold`) until `mgpu release`."""
    held_by: str | None = None
    """Who held it: a job an admin held for another user only an admin releases."""
    cancelled_by: str | None = None
    """The account that cancelled it (`mgpu cancel`, `scancel`); None: not cancelled by a
    user (ended by the cluster itself, or not cancelled)."""
    signal: str | None = None
    """`--signal` in its canonical form `[B:]SIG@SECONDS` (mgpu.signalspec.format_signal)."""
    restarts: int = 0
    """Runs requeued so far, for any reason (`MGPU_RESTART_COUNT` of the next run)."""
    notify: str | None = None
    """Told when the job ends (`--notify`): an http(s) URL, or mailto:ADDRESS."""
    script: str | None = None
    """The job script (`mgpu submit FILE`), run with its `#!` interpreter; `argv` holds
    its arguments."""
    script_name: str | None = None
    option_sources: dict[str, str] = field(default_factory=dict)
    """Where the job's options came from (a job script's `#MGPU` / `#SBATCH` lines, the
    command line); options not named took their defaults."""
    limit_changed: bool = False
    """Its time limit was changed while it ran (`mgpu update`): sent to its agents again
    when they reconnect."""
    gpu_share: float | None = None
    """`--gpu-share F`: a fraction of one GPU (with `gpus` = 1), packed with other shares."""
    reservation: str | None = None
    """`--reservation NAME`: runs only inside that reservation's window, on its GPUs."""
    pty: bool = False
    """Runs on a pseudo-terminal (`mgpu srun --pty`); its client holds it (allocations.py)."""
    pty_size: list[int] | None = None
    """[rows, cols] of the client's terminal, as last told (the pty's size at launch)."""
    ask: ResourceAsk = NO_ASK
    """CPUs and memory it asks of each node (`--cpus`, `--mem`, Slurm's `-c`, `--mem*`,
    `--exclusive`), as given; what each node holds is in its slots."""
    max_rss_mb: int | None = None
    """The job's peak memory (MiB) over its nodes' cgroups, as its agents last said."""
    kind: str = "job"
    """`job`, or `allocation` (`mgpu alloc`): its GPUs are held and nothing runs on them but
    the steps its client starts (master/control/allocations.py)."""
    slurm: SlurmOptions | None = None
    """Submitted the Slurm way (`sbatch`): Slurm's options mgpu has no field of its own
    for; None: mgpu's own behaviour (and every job stored before this field)."""
    pods: list[dict[str, str]] = field(default_factory=list)
    """A Kubernetes partition's job: its last run's Pods (`name`, `node`, `phase`)."""

    def transition(self, new: JobState, reason: str | None = None) -> None:
        if new not in ALLOWED[self.state]:
            raise IllegalTransition(f"job {self.id}: {self.state} -> {new} is not allowed")
        self.state = new
        self.reason, self.reason_code = reason, None

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def gpu_fraction(self) -> float:
        """What each GPU the job holds counts for in accounting: F for a share, else 1."""
        return self.gpu_share or 1.0

    @property
    def share_enforced(self) -> bool | None:
        """A shared job's share is held to its limits: False where one of its nodes said it
        is not, True where every node that started it said it is; None: not a shared job,
        or not said yet."""
        said = [s.share_enforced for s in self.allocation if s.share_enforced is not None]
        if not self.gpu_share or not said:
            return None
        return all(said)

    @property
    def not_before(self) -> float:
        """The job may not start before this time (`--begin`, retry backoff)."""
        return max(self.eligible_time, self.begin_time or 0.0)

    @property
    def desired(self) -> DesiredState:
        """What the master wants of this job (it is stopped by killing its processes)."""
        return DesiredState.RUN if self.stop_reason is None else self.stop_reason.desired

    def to_record(self) -> dict[str, Any]:
        """Everything, for the store (by hand: dataclasses.asdict is slow on a hot path)."""
        rec = dict(zip(_JOB_FIELDS, _job_values(self), strict=True))
        rec["allocation"] = [{f: getattr(s, f) for f in _SLOT_FIELDS} for s in self.allocation]
        rec["attempts"] = [{f: getattr(a, f) for f in _ATTEMPT_FIELDS} for a in self.attempts]
        if self.slurm is not None:
            rec["slurm"] = self.slurm.to_record()
        rec["ask"] = self.ask.to_record()
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Job:
        rec = dict(rec)
        rec.pop("steps", None)  # its srun steps, kept in the record before their own rows
        legacy = rec.pop("job_token", None)
        if legacy:  # stored in clear by older versions: keep only its hash
            from mgpu.tokens import token_hash

            rec["job_token_hashes"] = [*rec.get("job_token_hashes", []), token_hash(legacy)]
        _migrate_stop(rec)
        rec["state"] = JobState(rec["state"])
        if rec.get("reason_code") is not None:
            rec["reason_code"] = WaitCode(rec["reason_code"])
        _migrate_end_code(rec)
        if rec.get("last_end") is not None:
            rec["last_end"] = EndReason(rec["last_end"])
        rec["allocation"] = [Slot.from_record(s) for s in rec.get("allocation", [])]
        rec["attempts"] = [Attempt(**a) for a in rec.get("attempts", [])]
        if rec.get("node_gpu_ids") is not None:
            rec["node_gpu_ids"] = [(n, list(g)) for n, g in rec["node_gpu_ids"]]
        rec["dependency"] = [tuple(d) for d in rec.get("dependency", [])]
        if rec.get("slurm") is not None:
            rec["slurm"] = SlurmOptions.from_record(rec["slurm"])
        rec["ask"] = ResourceAsk.from_record(rec.get("ask"))
        return cls(**rec)

    def to_public(self) -> dict[str, Any]:
        """The job JSON of the contract (`mgpu show --json`)."""
        return {
            "id": self.id,
            "name": self.name,
            "user": self.user,
            "state": self.state.value,
            "command": self.command,
            "gpus": self.gpus,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "reason_code": self.reason_code,
            "end_code": self.end_code,
            "end_reason": None if self.last_end is None else self.last_end.run_end,
            "allocation": [
                {
                    "node_id": s.node_id,
                    "gpu_ids": list(s.gpu_ids),
                    "hostname": s.hostname,
                    "ip": s.ip,
                    "pid": s.pid,
                    "share_enforced": s.share_enforced,
                    "cpus": s.cpus,
                    "cpu_ids": s.cpu_ids,
                    "mem_mb": s.mem_mb,
                }
                for s in self.allocation
            ],
            "submit_time": self.submit_time,
            "begin_time": self.begin_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "retries": self.retries,
            "attempts": [_attempt_public(a) for a in self.attempts],
            "priority": self.priority,
            "time_limit": self.time_limit,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "node_gpu_ids": (
                None if self.node_gpu_ids is None else {n: g for n, g in self.node_gpu_ids}
            ),
            "gpu_ids": self.gpu_ids,
            "nodelist": self.nodelist,
            "exclude": self.exclude,
            "distributed": self.distributed,
            "mpi": self.mpi,
            "max_retries": self.max_retries,
            "preemptible": self.preemptible,
            "dependency": [f"{k}:{j}" for k, j in self.dependency],
            "waited_on_dependency": self.waited_on_dependency,
            "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id,
            "cwd": self.cwd,
            "image": self.image,
            "container": self.container,
            "kind": self.kind,
            "pty": self.pty,
            "gpu_memory_peak_mb": self.gpu_memory_peak_mb,
            "gpu_util_mean": (None if self.gpu_util_mean is None else round(self.gpu_util_mean, 1)),
            "held": self.held,
            "held_by": self.held_by,
            "cancelled_by": self.cancelled_by,
            "signal": self.signal,
            "restart_count": self.restarts,
            "notify": shown_target(self.notify),
            "script_name": self.script_name,
            "option_sources": dict(self.option_sources),
            "gpu_share": self.gpu_share,
            "share_enforced": self.share_enforced,
            "reservation": self.reservation,
            "cpus": self.allocation[0].cpus if self.allocation else None,
            "mem_mb": self.allocation[0].mem_mb if self.allocation else None,
            "max_rss_mb": self.max_rss_mb,
            "resources": None if self.ask.empty else self.ask.to_record(),
            "slurm": None if self.slurm is None else self.slurm.to_record(),
            **({"pods": [dict(p) for p in self.pods]} if self.pods else {}),
        }


def shown_target(target: str | None) -> str | None:
    """A notification target as others may see it: a webhook's path is often its secret
    (Slack's are), so only the scheme and host are shown."""
    if target is None or target.startswith("mailto:"):
        return target
    scheme, _, rest = target.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return f"{scheme}://{host}" + ("" if rest.rstrip("/") == host else "/...")


def _migrate_stop(rec: dict[str, Any]) -> None:
    """Records of versions before `stop_reason`: flags and a text instead."""
    cancel = rec.pop("cancel_requested", False)
    preempt = rec.pop("preempt_requested", False)
    text = rec.pop("cancel_reason", None)
    if cancel:
        idle = text is not None and text.startswith("idle")
        rec["stop_reason"], rec["stop_text"] = EndReason.IDLE if idle else EndReason.CANCELLED, text
    elif preempt:
        rec["stop_reason"] = EndReason.PREEMPTED
    if rec.get("stop_reason") is not None:
        rec["stop_reason"] = EndReason(rec["stop_reason"])


def _migrate_end_code(rec: dict[str, Any]) -> None:
    """Records of versions before `end_code`: an ended job's code from its state, and a
    lost node from the reason those versions wrote (`node N lost`, `node N removed`,
    `... went silent`), once here so that nothing else reads the text."""
    if "end_code" in rec:  # a record of this version: what it says, None included
        if rec["end_code"] is not None:
            rec["end_code"] = EndCode(rec["end_code"])
        return
    state = rec["state"]
    if not state.terminal:
        return
    text = str(rec.get("reason") or "")
    node_lost = "node" in text and any(w in text for w in ("lost", "silent", "removed"))
    if state is JobState.FAILED and node_lost:
        rec["end_code"] = EndCode.NODE_FAIL
    else:
        rec["end_code"] = EndCode(state.value)


_JOB_FIELDS = tuple(f.name for f in fields(Job))
_job_values = operator.attrgetter(*_JOB_FIELDS)


def _attempt_public(a: Attempt) -> dict[str, Any]:
    """asdict(a), by hand: every ended job's JSON has it (a waiting client reads each)."""
    return {
        "epoch": a.epoch,
        "nodes": list(a.nodes),
        "gpu_ids": {node: list(ids) for node, ids in a.gpu_ids.items()},
        "start_time": a.start_time,
        "end_time": a.end_time,
        "end_reason": a.end_reason,
    }


_SLOT_FIELDS = tuple(f.name for f in fields(Slot))
_ATTEMPT_FIELDS = tuple(f.name for f in fields(Attempt))
