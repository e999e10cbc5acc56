"""mgpu's job states in Slurm's words: squeue's `%t`/`%T`, sacct's State, the pending
reason codes and `EXIT:SIGNAL` exit codes, all from the job's state and typed codes
(`end_code`, `reason_code`), never from its English `reason`."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAMES = {
    "queued": "PENDING",
    "running": "RUNNING",
    "completed": "COMPLETED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "timeout": "TIMEOUT",
}
LETTERS = {
    "PENDING": "PD",
    "RUNNING": "R",
    "COMPLETED": "CD",
    "COMPLETING": "CG",
    "FAILED": "F",
    "CANCELLED": "CA",
    "TIMEOUT": "TO",
    "NODE_FAIL": "NF",
    "BOOT_FAIL": "BF",
    "OUT_OF_MEMORY": "OOM",
    "PREEMPTED": "PR",
    "REQUEUED": "RQ",
}
ACTIVE = ("PENDING", "RUNNING")
ALL_NAMES = frozenset(LETTERS)


END_CODES = {
    "completed": "COMPLETED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "timeout": "TIMEOUT",
    "node_fail": "NODE_FAIL",
    "boot_fail": "BOOT_FAIL",
    "launch_failed": "FAILED",
    "idle": "CANCELLED",
    "dependency_never": "CANCELLED",
    "never_fits": "FAILED",
    "out_of_memory": "OUT_OF_MEMORY",
}
"""An ended job's typed `end_code` (mgpu.model.EndCode) as Slurm's state."""


def state(job: dict[str, Any]) -> str:
    """Slurm's state name of an mgpu job: an ended one's from its `end_code`."""
    name = NAMES.get(str(job.get("state")), "PENDING")
    if name in ACTIVE:
        return name
    return END_CODES.get(str(job.get("end_code")), name)


def letters(name: str) -> str:
    return LETTERS.get(name, name[:2])


def parse_states(prog: str, text: str) -> set[str]:
    """`-t/--state` of squeue, scancel and sacct: names or letters, comma-separated, any
    case (`pd,R`, `running`); `all` is every state."""
    from mgpu.slurm.common import fail

    wanted: set[str] = set()
    by_letters = {v: k for k, v in LETTERS.items()}
    for item in text.split(","):
        word = item.strip().upper()
        if word == "ALL":
            return set(ALL_NAMES)
        if word in ALL_NAMES:
            wanted.add(word)
        elif word in by_letters:
            wanted.add(by_letters[word])
        else:
            raise fail(prog, f"Invalid job state specified: {item.strip()}")
    return wanted


WAIT_CODES = {
    "resources": "Resources",
    "priority": "Priority",
    "dependency": "Dependency",
    "dependency_never_satisfied": "DependencyNeverSatisfied",
    "partition_time_limit": "PartitionTimeLimit",
    "begin_time": "BeginTime",
    "reservation": "Reservation",
    "node_not_available": "ReqNodeNotAvail",
    "user_job_limit": "QOSMaxJobsPerUserLimit",
    "user_gpu_limit": "QOSMaxGRESPerUser",
    "array_limit": "JobArrayTaskLimit",
}
"""The job's typed `reason_code` (mgpu.model.WaitCode) as Slurm's pending reason; a held
job's is JobHeldUser or JobHeldAdmin (by its `held_by`)."""


def reason(job: dict[str, Any]) -> str:
    """squeue's REASON of a pending job (Slurm's codes, from the job's typed
    `reason_code`, never its English text), `None` for a running one or a job no pass
    has looked at yet (as Slurm's)."""
    if job.get("state") != "queued":
        return "None"
    if job.get("held") or job.get("reason_code") == "held":
        return "JobHeldAdmin" if job.get("held_by") == "admin" else "JobHeldUser"
    return WAIT_CODES.get(str(job.get("reason_code")), "None")


def never_met(job: dict[str, Any]) -> bool:
    """The job ended, never run, because a dependency of it can never be met
    (`--kill-on-invalid-dep=yes`)."""
    return job.get("end_code") == "dependency_never"


def exit_code(job: dict[str, Any]) -> str:
    """sacct's and scontrol's `EXIT:SIGNAL`: `0:0`, `1:0`, `0:9` (killed by SIGKILL), `0:125`
    (killed for its memory, as Slurm says it)."""
    if job.get("end_code") == "out_of_memory":
        return "0:125"
    code = job.get("exit_code")
    if not isinstance(code, int):
        return "0:0"
    if code < 0:
        return f"0:{-code}"
    if code > 128 and job.get("state") in ("cancelled", "timeout"):
        return f"0:{code - 128}"
    return f"{code}:0"


def node_state(node: dict[str, Any]) -> str:
    """Slurm's long node state: idle, mixed, allocated, draining, drained, down; with
    Slurm's `*` (not responding) while the node's agent is not connected: it lost its link,
    or a new leader has not heard from it yet (down once silent for its timeout)."""
    state = node.get("state")
    if state == "offline":
        return "down"
    return _up_state(node) + ("*" if node.get("connected") is False else "")


def _up_state(node: dict[str, Any]) -> str:
    state = node.get("state")
    gpus = node.get("gpus") or []
    busy = sum(1 for g in gpus if g.get("busy_job"))
    if state == "drained":
        return "drained"
    if state == "draining":
        return "draining" if busy else "drained"
    if gpus and busy == len(gpus):
        return "allocated"
    return "mixed" if busy else "idle"
