"""What a run was granted, made into its process: the one place that does it.

The master sends each launch's `Grant` (mgpu.protocol): the GPUs of this node the run may
use, the job's GPUs here, a `--gpu-share`'s part of its GPU and of its memory, whether
it is a Slurm job or an srun task.  Here alone that becomes

* the GPU variables of the run's environment (`variables`): `CUDA_VISIBLE_DEVICES` (MIG
  instances by UUID: CUDA numbers them apart from mgpu's indices), `MGPU_GPU_IDS`, a
  Slurm job's `SLURM_JOB_GPUS`, `SLURM_GPUS_ON_NODE` and `GPU_DEVICE_ORDINAL`, an srun
  task's `SLURM_STEP_GPUS`,
  and a share's `MGPU_GPU_SHARE`, `MGPU_GPU_MEMORY_LIMIT_MB` and
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (mgpu.agent.mps reads these, `share_variables`, to
  run it under MPS; the device it names is `share_device`'s);
* the device numbers the run may open (`device_numbers`: mgpu.agent.devices' rules);
* a container runtime's GPU flags and the `CUDA_VISIBLE_DEVICES` seen inside
  (`container_gpus`, for mgpu.agent.containers).

Only the grant says what a run sees: a variable of `OWNED` in the launch's own
environment is dropped (`apply`), whoever put it there.  Pure; unit-tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mgpu.agent.gpus import GpuInfo
from mgpu.agent.mps import device_name
from mgpu.protocol import Grant
from mgpu.scheduler.shares import format_share

__all__ = [
    "OWNED",
    "ContainerGpus",
    "apply",
    "container_gpus",
    "device_numbers",
    "share_device",
    "share_variables",
    "variables",
]

SHARE_VARIABLES = (
    "MGPU_GPU_SHARE",
    "MGPU_GPU_MEMORY_LIMIT_MB",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)
OWNED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",  # the container toolkit's: it would widen a container
        "MGPU_GPU_IDS",
        "SLURM_JOB_GPUS",
        "SLURM_GPUS_ON_NODE",
        "SLURM_STEP_GPUS",
        "GPU_DEVICE_ORDINAL",
        "MGPU_GPU_SHARE",
        "MGPU_GPU_MEMORY_LIMIT_MB",
    }
)
"""Names only a grant sets: one in the launch's environment is not the run's."""


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


def share_variables(grant: Grant) -> dict[str, str]:
    """A share's variables (empty for whole GPUs): its part of the GPU, of the GPU's
    memory where known, and the part of its threads MPS gives it."""
    if grant.share_units is None:
        return {}
    env = {
        "MGPU_GPU_SHARE": format_share(grant.share_units),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": format_share(grant.share_units * 100),
    }
    if grant.gpu_memory_mb is not None:
        env["MGPU_GPU_MEMORY_LIMIT_MB"] = str(grant.gpu_memory_mb)
    return env


def variables(grant: Grant, gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """The GPU variables of a run granted `grant` on a node with `gpus`."""
    visible = _ids(grant.gpus)
    if grant.gpus and any(g.mig for g in gpus):
        uuids = {g.index: g.uuid for g in gpus}
        visible = ",".join(uuids.get(i) or str(i) for i in grant.gpus)
    job_gpus = grant.gpus if grant.job_gpus is None else grant.job_gpus
    env = {"CUDA_VISIBLE_DEVICES": visible, "MGPU_GPU_IDS": _ids(job_gpus)}
    if grant.slurm and job_gpus:
        env["SLURM_JOB_GPUS"] = _ids(job_gpus)
        env["SLURM_GPUS_ON_NODE"] = str(len(job_gpus))
    if (grant.slurm or grant.step) and grant.gpus:
        env["GPU_DEVICE_ORDINAL"] = visible  # Slurm's gres/gpu sets both (AMD's ROCm reads it)
    if grant.step:
        env["SLURM_STEP_GPUS"] = _ids(grant.gpus)
    env.update(share_variables(grant))
    return env


def apply(env: Mapping[str, str], grant: Grant, gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """`env` with the grant's variables in place of any of `OWNED` it had."""
    out = {k: v for k, v in env.items() if k not in OWNED}
    out.update(variables(grant, gpus))
    return out


def device_numbers(grant: Grant, gpus: Sequence[GpuInfo]) -> list[int]:
    """The /dev/nvidiaN numbers of the granted GPUs, the only ones the run may open (a MIG
    instance's: its parent's)."""
    physical = {g.index: g.device_index for g in gpus if g.device_index is not None}
    return sorted({physical.get(i, i) for i in grant.gpus})


def share_device(grant: Grant, gpus: Sequence[GpuInfo]) -> tuple[str, str]:
    """A shared run's GPU as the MPS control daemon's commands name it (its UUID where
    known), and its index (for a daemon that does not take a UUID)."""
    gpu = next((g for g in gpus if g.index in grant.gpus), None)
    ordinal = str(gpu.index if gpu else min(grant.gpus, default=0))
    return (device_name(gpu.uuid, gpu.index) if gpu else ordinal), ordinal


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    """A container runtime's part of a run's GPUs (mgpu.agent.containers puts them in)."""

    flags: list[str]
    """What makes the granted GPUs (only those, where the runtime can) appear inside."""
    env: list[str]
    """The option that sets `CUDA_VISIBLE_DEVICES` inside."""


def container_gpus(runtime: str, grant: Grant) -> ContainerGpus:
    """podman (CDI names, `nvidia-ctk cdi generate`) and docker (the NVIDIA container
    toolkit) show only the granted GPUs, numbered from 0 inside; apptainer's `--nv` shows
    every GPU and `CUDA_VISIBLE_DEVICES` (the host indices) narrows it."""
    ids = list(grant.gpus)
    if runtime == "podman":
        flags = [f for i in ids for f in ("--device", f"nvidia.com/gpu={i}")]
        return ContainerGpus(flags, ["-e", "CUDA_VISIBLE_DEVICES=" + _ids(range(len(ids)))])
    if runtime == "docker":
        # The quotes are docker's: a comma inside --gpus must be quoted.
        flags = ["--gpus", f'"device={_ids(ids)}"'] if ids else []
        return ContainerGpus(flags, ["-e", "CUDA_VISIBLE_DEVICES=" + _ids(range(len(ids)))])
    if runtime == "apptainer":
        visible = ["--env", "CUDA_VISIBLE_DEVICES=" + _ids(ids)]
        return ContainerGpus(["--nv"] if ids else [], visible)
    raise ValueError(f"unknown container runtime {runtime!r}")
