"""From the master's Launch to what the launcher starts (a LaunchRequest): whom the job
runs as and the environment the agent adds; what its grant makes of it (GPU variables,
device numbers, a share's MPS limits) is mgpu.agent.grants'."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from mgpu.agent import accounts, grants
from mgpu.agent.gpus import GpuInfo
from mgpu.agent.launchsteps import LaunchRequest, UserIds
from mgpu.agent.mps import MpsControl
from mgpu.protocol import Launch

__all__ = [
    "UserError",
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
    """The job's environment: the master's, its grant's GPUs, and what this node adds.
    `scheme`: how the job's own `mgpu` commands dial the masters ("https": as the agent
    does, TLS only)."""
    from mgpu.addresses import format_address

    env = grants.apply(msg.env, msg.grant, gpus)
    # So that `mgpu` inside a job (rsh, srun of a step, queue) finds the master: every
    # master the agent knows, the leader first ([SCHEME://]HOST:PORT,HOST:PORT).
    masters = master if isinstance(master, list) else [master]
    prefix = f"{scheme}://" if scheme else ""
    env["MGPU_MASTER"] = prefix + ",".join(format_address(m) for m in masters)
    # A shared GPU: under MPS where it can.
    env.update(mps.job_env(grants.share_variables(msg.grant), msg.job_id))
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
    share = grants.share_variables(msg.grant)
    if not share:
        return None
    try:
        ids = run_as(msg, hostname)
    except UserError:
        return None  # the launch says why
    uid = os.geteuid() if ids is None else ids[0]
    device, ordinal = grants.share_device(msg.grant, gpus)
    job_id = msg.job_id
    return lambda: mps.prepare(share, job_id, uid, device, ordinal)


def with_note(*notes: str | None) -> str | None:
    """Several notes for the job's stderr as one (a line each), or None."""
    return "\n".join(n for n in notes if n) or None


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
        gpu_ids=grants.device_numbers(msg.grant, gpus),
        warning=None if msg.signal is None else (msg.signal, msg.signal_lead, msg.signal_batch),
        script=None if msg.script is None else (msg.script_name or "script", msg.script),
        pty=None if msg.pty is None else (msg.pty.rows, msg.pty.cols),
        slurm_bin=msg.image is None,
        owner=owner,
        cpus=msg.grant.cpus,
        mem_mb=msg.grant.mem_mb,
        output=None
        if msg.output_file is None
        else (msg.output_file, msg.error_file or msg.output_file, msg.open_append),
    )
