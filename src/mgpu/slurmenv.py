"""Slurm's environment variables, as Slurm formats them (pure functions).

`task_env`: what each task of a step (`srun` inside a job) gets on top of its job's
variables on its node (those, SLURM_JOB_ID and SLURMD_NODENAME included, are the job's).
"""

from __future__ import annotations

from collections.abc import Sequence

from mgpu import hostlist

__all__ = ["task_env"]


def _tasks_per_node(counts: Sequence[int]) -> str:
    """Slurm's SLURM_TASKS_PER_NODE form: [2, 2, 1] -> "2(x2),1"."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(parts)


def task_env(
    *,
    step_id: int,
    procid: int,
    localid: int,
    nodeid: int,
    ntasks: int,
    step_hosts: Sequence[str],
    node_tasks: Sequence[int],
    gpu_ids: Sequence[int],
) -> dict[str, str]:
    """One task's variables: `procid` its rank in the step, `localid` on its node, `nodeid`
    its node's index in the step; `step_hosts` the step's nodes' hostnames in order and
    `node_tasks` their task counts; `gpu_ids` the GPUs the task sees."""
    nodelist = hostlist.compress(list(step_hosts))
    return {
        "SLURM_STEP_ID": str(step_id),
        "SLURM_STEPID": str(step_id),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(len(step_hosts)),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": _tasks_per_node(node_tasks),
        "SLURM_TASKS_PER_NODE": _tasks_per_node(node_tasks),  # srun's: the step's
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_ids)),
        "SLURM_STEP_GPUS": ",".join(map(str, gpu_ids)),
    }
