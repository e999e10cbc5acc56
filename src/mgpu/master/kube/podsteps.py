"""Steps in a job's Pods: what a Pod needs to run mgpu's pod agent, and a step's launch
made for its Pod.  Pure.

With `kubernetes.steps` set, every Pod of a job (rank 0's, which runs the job, and a held
slot's) starts `$MGPU_SLURM_BIN/mgpu pod-agent` beside its own command (mgpu.podagent):
it dials the master (`$MGPU_MASTER`) with the job's credential and names its Pod
(`$MGPU_POD_NAME`, the downward API), and runs the job's steps sent to that Pod's node.
The agent is started in a subshell that exits at once, so it is no child of the job's
script (a script's bare `wait` does not wait for it); it ends with the container.  The
job's own command then runs under `mgpu pod-init`, which tells its death by a signal.
"""

from __future__ import annotations

from typing import Any

from mgpu.exits import POD_INIT_MARK
from mgpu.kubesection import PodSteps
from mgpu.protocol import Grant, Launch

__all__ = ["POD_NAME", "pod_agent_env", "step_for_pod", "with_pod_agent"]

POD_NAME = "MGPU_POD_NAME"
POD_IP = "MGPU_POD_IP"
SLURM_BIN = "MGPU_SLURM_BIN"
WRAPPER = (
    'export PATH="$MGPU_SLURM_BIN:${PATH:-/usr/bin:/bin}"; '
    '( "$MGPU_SLURM_BIN/mgpu" pod-agent </dev/null >/dev/null 2>&1 & ); '
    f'export {POD_INIT_MARK}; exec "$MGPU_SLURM_BIN/mgpu" pod-init -- "$@"'
)
"""The Pod's command: the pod agent started aside, then the job's own command under
`mgpu pod-init` (mgpu.podagent.init: a death by signal told as such)."""


def with_pod_agent(command: list[str]) -> list[str]:
    """The container's command that starts the pod agent, then runs `command`."""
    return ["/bin/sh", "-c", WRAPPER, "mgpu-pod", *command]


def pod_agent_env(steps: PodSteps) -> list[dict[str, Any]]:
    """The Pod's variables the agent and the job's `srun` need (its name and address from
    the downward API)."""
    return [
        {"name": POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MGPU_MASTER", "value": steps.master},
        {"name": SLURM_BIN, "value": steps.bin},
    ]


def _local(ids: list[int] | None, held: list[int]) -> list[int] | None:
    """Node GPU indices as the Pod's container numbers them: its device plugin gives it
    the slot's GPUs, numbered from 0 in the slot's order."""
    if ids is None:
        return None
    return [held.index(i) for i in ids if i in held]


def step_for_pod(launch: Launch, slot_gpus: list[int]) -> Launch:
    """A step's launch as its Pod's agent runs it: its GPUs named as the container sees
    them (the slot's `slot_gpus` are the container's 0, 1, ...)."""
    grant: Grant = launch.grant.model_copy(
        update={
            "gpus": _local(launch.grant.gpus, slot_gpus) or [],
            "job_gpus": _local(launch.grant.job_gpus, slot_gpus),
            "cpus": None,  # the Pod's own limits hold it (the container's CPUs)
        }
    )
    return launch.model_copy(update={"grant": grant})
