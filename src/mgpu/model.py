"""Jobs, nodes and the job state machine.

Every state change of a job goes through `Job.transition`, so the allowed moves
live in one place (`ALLOWED`).  The master writes the job to the store right
after each transition and before acting on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


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


class NodeState(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    DRAINING = "draining"
    DRAINED = "drained"


@dataclass(slots=True)
class Slot:
    """Where one part of a job runs: a node and GPUs there, plus what the agent saw."""

    node_id: str
    gpu_ids: list[int]
    hostname: str | None = None
    ip: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    done: bool = False


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
    retries: int = 0
    epoch: int = 0
    """Allocation epoch: bumped at every start, so stale messages from an old run are ignored."""
    allocation: list[Slot] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    cancel_requested: bool = False
    preempt_requested: bool = False
    timed_out: bool = False
    job_token_hashes: list[str] = field(default_factory=list)
    """Hashes of this run's credentials (mgpu.master.auth.new_job_token): the plaintext is
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
    cancel_reason: str | None = None
    """Final reason of a running job cancelled for a reason of the system (idle)."""
    image: str | None = None
    """Container image to run the job in (`--image`), with the node's container runtime."""

    def transition(self, new: JobState, reason: str | None = None) -> None:
        if new not in ALLOWED[self.state]:
            raise IllegalTransition(f"job {self.id}: {self.state} -> {new} is not allowed")
        self.state = new
        self.reason = reason

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def to_record(self) -> dict[str, Any]:
        """Everything, for the store (by hand: dataclasses.asdict is slow on a hot path)."""
        rec = {f: getattr(self, f) for f in _JOB_FIELDS}
        rec["allocation"] = [{f: getattr(s, f) for f in _SLOT_FIELDS} for s in self.allocation]
        rec["attempts"] = [{f: getattr(a, f) for f in _ATTEMPT_FIELDS} for a in self.attempts]
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Job:
        rec = dict(rec)
        legacy = rec.pop("job_token", None)
        if legacy:  # stored in clear by older versions: keep only its hash
            from mgpu.master.auth import token_hash

            rec["job_token_hashes"] = [*rec.get("job_token_hashes", []), token_hash(legacy)]
        rec["state"] = JobState(rec["state"])
        rec["allocation"] = [Slot(**s) for s in rec.get("allocation", [])]
        rec["attempts"] = [Attempt(**a) for a in rec.get("attempts", [])]
        if rec.get("node_gpu_ids") is not None:
            rec["node_gpu_ids"] = [(n, list(g)) for n, g in rec["node_gpu_ids"]]
        rec["dependency"] = [tuple(d) for d in rec.get("dependency", [])]
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
            "allocation": [
                {
                    "node_id": s.node_id,
                    "gpu_ids": list(s.gpu_ids),
                    "hostname": s.hostname,
                    "ip": s.ip,
                    "pid": s.pid,
                }
                for s in self.allocation
            ],
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "retries": self.retries,
            "attempts": [asdict(a) for a in self.attempts],
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
            "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id,
            "cwd": self.cwd,
            "image": self.image,
            "gpu_memory_peak_mb": self.gpu_memory_peak_mb,
            "gpu_util_mean": (None if self.gpu_util_mean is None else round(self.gpu_util_mean, 1)),
        }


_JOB_FIELDS = tuple(f.name for f in fields(Job))
_SLOT_FIELDS = tuple(f.name for f in fields(Slot))
_ATTEMPT_FIELDS = tuple(f.name for f in fields(Attempt))
