"""From the master's Launch to what the launcher starts (a LaunchRequest): whom the job
runs as, the environment the agent adds, and the device numbers of its GPUs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from mgpu.agent import accounts
from mgpu.agent.gpus import GpuInfo
from mgpu.agent.launchsteps import LaunchRequest, UserIds
from mgpu.agent.mps import MpsControl, device_name
from mgpu.protocol import Launch

__all__ = [
    "UserError",
    "device_ids",
    "job_env",
    "launch_request",
    "run_as",
    "share_setup",
    "with_note",
]


class UserError(RuntimeError):
    """The job cannot run here as its user: the job fails, the node is fine."""


def run_as(msg: Launch, hostname: str) -> UserIds | None:
    """uid, gid and groups to run the job as; None = as this agent's own user."""
    if os.geteuid() != 0:
        return None
    if not msg.user:  # the master always names one: root only with the owner's grant
        if msg.allow_root:
            return None
        raise UserError("refusing to run a job that names no user as root")
    try:
        account = accounts.lookup(msg.user)
    except KeyError:
        raise UserError(f"user {msg.user} does not exist on {hostname}") from None
    if account.uid == 0 and not msg.allow_root:
        raise UserError(f"refusing to run a job of {msg.user} as root (uid 0)")
    return account.uid, account.gid, list(account.groups)


def job_env(
    msg: Launch,
    master: tuple[str, int] | list[tuple[str, int]],
    gpus: list[GpuInfo],
    mps: MpsControl,
    scheme: str | None = None,
) -> dict[str, str]:
    """The job's environment: the master's, and what this node adds.  `scheme`: how the
    job's own `mgpu` commands dial the masters ("https": as the agent does, TLS only)."""
    from mgpu.addresses import format_address

    env = dict(msg.env)
    # So that `mgpu` inside a job (rsh, srun of a step, queue) finds the master: every
    # master the agent knows, the leader first ([SCHEME://]HOST:PORT,HOST:PORT).
    masters = master if isinstance(master, list) else [master]
    prefix = f"{scheme}://" if scheme else ""
    env["MGPU_MASTER"] = prefix + ",".join(format_address(m) for m in masters)
    env.update(mps.job_env(env, msg.job_id))  # a shared GPU: under MPS where it can
    if any(g.mig for g in gpus) and msg.gpu_ids:
        # MIG: CUDA numbers instances apart from mgpu's indices; name them by UUID.
        uuids = {g.index: g.uuid for g in gpus}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids.get(i) or str(i) for i in msg.gpu_ids)
    if msg.mpi:
        launcher = f"{sys.executable} -m mgpu rsh"
        env.update(
            {
                "OMPI_MCA_plm_rsh_agent": launcher,  # Open MPI 4
                "PRTE_MCA_plm_ssh_agent": launcher,  # Open MPI 5 (PRRTE)
                "HYDRA_LAUNCHER": "ssh",  # MPICH: ssh-style launcher...
                "HYDRA_LAUNCHER_EXEC": launcher,  # ...that is really mgpu rsh
            }
        )
    return env


def share_setup(
    msg: Launch, hostname: str, gpus: list[GpuInfo], mps: MpsControl
) -> Callable[[], None] | None:
    """A shared job's MPS daemon and server limits, set before its process starts (what
    `site.prepare` runs in a thread); None for a job that is not shared.  Asked of every
    shared job, MPS or not: `MpsControl.prepare` tries again a daemon whose start failed,
    and records what it achieved for the job (`share_held`)."""
    if "MGPU_GPU_SHARE" not in msg.env:
        return None
    try:
        ids = run_as(msg, hostname)
    except UserError:
        return None  # the launch says why
    uid = os.geteuid() if ids is None else ids[0]
    gpu = next((g for g in gpus if g.index in msg.gpu_ids), None)
    ordinal = str(gpu.index if gpu else min(msg.gpu_ids, default=0))
    device = device_name(gpu.uuid, gpu.index) if gpu else ordinal
    env, job_id = dict(msg.env), msg.job_id
    return lambda: mps.prepare(env, job_id, uid, device, ordinal)


def with_note(*notes: str | None) -> str | None:
    """Several notes for the job's stderr as one (a line each), or None."""
    return "\n".join(n for n in notes if n) or None


def device_ids(gpus: list[GpuInfo], gpu_ids: list[int]) -> list[int]:
    """The /dev/nvidiaN numbers of the job's GPUs (a MIG instance's: its parent's)."""
    physical = {g.index: g.device_index for g in gpus if g.device_index is not None}
    return sorted({physical.get(i, i) for i in gpu_ids})


def launch_request(
    msg: Launch,
    argv: list[str],
    env: dict[str, str],
    ids: UserIds | None,
    note: str | None,
    gpus: list[GpuInfo],
    owner: UserIds | None,
) -> LaunchRequest:
    """The run of `msg` to start, as `argv` with `env` (the site hooks may have wrapped
    the job's own: a container), run as `ids`, for its user `owner` (`run_as`)."""
    return LaunchRequest(
        job_id=msg.job_id,
        epoch=msg.epoch,
        argv=argv,
        env=env,
        cwd=msg.cwd,
        time_limit=msg.time_limit,
        kill_grace=msg.kill_grace,
        user_ids=ids,
        hostfile=msg.hostfile,
        note=note,
        gpu_ids=device_ids(gpus, msg.gpu_ids),
        warning=None if msg.signal is None else (msg.signal, msg.signal_lead, msg.signal_batch),
        script=None if msg.script is None else (msg.script_name or "script", msg.script),
        pty=None if msg.pty is None else (msg.pty.rows, msg.pty.cols),
        slurm_bin=msg.image is None,
        owner=owner,
        output=None
        if msg.output_file is None
        else (msg.output_file, msg.error_file or msg.output_file, msg.open_append),
    )
