"""What an agent is sent to start one part of a job: the `Launch` message, built here only.

Pure: the job, its allocation, the nodes' addresses and the run's credential in, the
environment (`MGPU_*`, torchrun's variables), the run's grant (its GPUs and share: the
agent alone makes them the contract's `CUDA_VISIBLE_DEVICES` and the other GPU variables,
mgpu.agent.grants), the MPI hostfile and the message out.  The caller decides when to send
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mgpu import slurmenv
from mgpu.config import ClusterConfig
from mgpu.containeropts import ContainerOptions
from mgpu.master.state.registry import NodeRecord
from mgpu.master.state.shares import job_share_units
from mgpu.model import Job, Slot
from mgpu.protocol import Grant, Launch, TerminalSize
from mgpu.scheduler.shares import SHARE_UNITS
from mgpu.signalspec import SignalSpec, parse_signal

__all__ = [
    "grant",
    "hostfile",
    "job_env",
    "job_launch",
    "preempt_warning",
    "rendezvous_env",
    "slurm_env",
    "step_launch",
    "terminal_size",
]


def job_env(
    job: Job, rank: int, slot: Slot, nodes: Mapping[str, NodeRecord], credential: str
) -> dict[str, str]:
    """The environment of the job's process on one node (rank = index in the allocation)."""
    alloc = job.allocation
    env = dict(job.env)
    env.update(
        {
            "MGPU_JOB_ID": job.id,
            "MGPU_NODE_ID": slot.node_id,
            "MGPU_JOB_NAME": job.name or "",
            "MGPU_USER": job.user,
            "MGPU_NNODES": str(len(alloc)),
            "MGPU_NODE_RANK": str(rank),
            "MGPU_NODELIST": ",".join(s.node_id for s in alloc),
        }
    )
    env["MGPU_TOKEN"] = credential
    env["MGPU_RESTART_COUNT"] = str(job.restarts)  # as SLURM_RESTART_COUNT: 0 on the first run
    if job.array_job_id is not None:
        env["MGPU_ARRAY_JOB_ID"] = job.array_job_id
        env["MGPU_ARRAY_TASK_ID"] = str(job.array_task_id)
    for name, value in rendezvous_env(job, rank, slot, nodes).items():
        env.setdefault(name, value)  # a Slurm job's own (it exported them) stand
    return env


def rendezvous_env(
    job: Job, rank: int, slot: Slot, nodes: Mapping[str, NodeRecord]
) -> dict[str, str]:
    """torchrun's variables of a distributed run on node `rank`: none for a Slurm job that
    did not ask (`--distributed`), whose script sets its own as in Slurm."""
    alloc = job.allocation
    if job.port is None or (job.slurm is not None and not job.distributed):
        return {}
    dist = {
        "MASTER_ADDR": nodes[alloc[0].node_id].ip,
        "MASTER_PORT": str(job.port),
        "NNODES": str(len(alloc)),
        "NODE_RANK": str(rank),
        "NPROC_PER_NODE": str(len(slot.gpu_ids) or 1),
        "WORLD_SIZE": str(sum(len(s.gpu_ids) or 1 for s in alloc)),
    }
    # torchrun reads PET_* as defaults for its flags: a bare `torchrun x.py` joins.
    pet = ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT")
    return {**dist, **{f"PET_{k}": dist[k] for k in pet}}


def slurm_env(
    job: Job, rank: int, nodes: Mapping[str, NodeRecord], config: ClusterConfig
) -> dict[str, str]:
    """A Slurm job's SLURM_* variables on node `rank` (mgpu.slurmenv)."""
    assert job.slurm is not None
    partition = job.slurm.partition or config.default_partition().name
    where = slurmenv.Where(slurm_node_names(job, nodes), config.cluster.name, partition)
    return slurmenv.job_env(job, rank, where)


def slurm_node_names(job: Job, nodes: Mapping[str, NodeRecord]) -> tuple[str, ...]:
    """The job's nodes as SLURM_JOB_NODELIST names them, in rank order (mgpu.slurmenv).
    A host name that several of the cluster's nodes share (agents on one machine) names
    none of them, also in a job on one of them: the node ids do, as squeue's do."""
    seen: dict[str, int] = {}
    for node in nodes.values():
        if node.hostname:
            seen[node.hostname] = seen.get(node.hostname, 0) + 1
    hosts = []
    for slot in job.allocation:
        hostname = known_hostname(nodes, slot.node_id)
        hosts.append((slot.node_id, hostname if hostname and seen[hostname] == 1 else None))
    return slurmenv.node_names(hosts)


def known_hostname(nodes: Mapping[str, NodeRecord], node_id: str) -> str | None:
    """The hostname the node's agent reported; None for a node not known (or not said)."""
    node = nodes.get(node_id)
    return node.hostname if node is not None else None


def output_files(
    job: Job, rank: int, nodes: Mapping[str, NodeRecord]
) -> tuple[str | None, str | None]:
    """A batch job's -o/-e files, written on its first node (None: none here)."""
    if job.slurm is None or not job.slurm.batch or rank != 0:
        return None, None
    first = job.allocation[0].node_id
    # %N is the host's short name, as slurmstepd's (not the node's Slurm name).
    host = (known_hostname(nodes, first) or first).split(".")[0]
    return slurmenv.output_files(job, host)


def grant(
    job: Job,
    slot: Slot,
    nodes: Mapping[str, NodeRecord],
    gpus: Sequence[int] | None = None,
    step: bool = False,
) -> Grant:
    """What the run on `slot`'s node was granted: the job's GPUs there, or `gpus` of them
    (an srun task's), and a fractional job's (`--gpu-share F`) share: F and its part of
    the GPU's memory (rounded down, from the node's hello); the CPUs and memory the job
    holds there (None: it holds none, and shares the node's).  `step`: an srun task, which
    runs within its job's CPUs and memory (it holds none of its own)."""
    units = job_share_units(job) or None
    memory = None
    if units is not None:
        node = nodes.get(slot.node_id)
        memory = next(
            (g.memory_mb for g in (node.gpus if node else []) if g.index in slot.gpu_ids), None
        )
    return Grant(
        gpus=list(slot.gpu_ids if gpus is None else gpus),
        job_gpus=list(slot.gpu_ids),
        share_units=units,
        gpu_memory_mb=None if units is None or memory is None else memory * units // SHARE_UNITS,
        slurm=job.slurm is not None,
        step=step,
        cpus=None if slot.cpu_ids is None else list(slot.cpu_ids),
        mem_mb=slot.mem_mb,
    )


def hostfile(job: Job, nodes: Mapping[str, NodeRecord]) -> str:
    """One line per node, slots = its GPUs (Open MPI and MPICH both read this form)."""
    lines = []
    for s in job.allocation:
        node = nodes[s.node_id]
        lines.append(f"{node.hostname or node.ip or s.node_id} slots={len(s.gpu_ids) or 1}")
    return "\n".join(lines) + "\n"


def job_launch(
    job: Job,
    rank: int,
    nodes: Mapping[str, NodeRecord],
    credential: str,
    config: ClusterConfig,
) -> Launch:
    """The launch of rank `rank` of the job's current run."""
    slot = job.allocation[rank]
    site = config.site
    warning = None if job.signal is None else parse_signal(job.signal)
    env = job_env(job, rank, slot, nodes, credential)
    if job.slurm is not None:
        env.update(slurm_env(job, rank, nodes, config))
    output, error = output_files(job, rank, nodes)
    return Launch(
        job_id=job.id,
        epoch=job.epoch,
        argv=job.argv,
        env=env,
        cwd=job.cwd,
        grant=grant(job, slot, nodes),
        time_limit=job.time_limit,
        kill_grace=config.scheduling.kill_grace,
        user=job.user,
        allow_root=job.allow_root,  # decided at submit from the token's grant, never a name
        mpi=job.mpi,
        hostfile=hostfile(job, nodes) if job.mpi else None,
        image=job.image,
        container=None if job.container is None else ContainerOptions(**job.container),
        prolog=site.prolog,
        epilog=site.epilog,
        prolog_timeout=site.prolog_timeout,
        epilog_timeout=site.epilog_timeout,
        signal=None if warning is None else warning.number,
        signal_lead=0.0 if warning is None else float(warning.seconds),
        signal_batch=warning is not None and warning.batch_only,
        script=job.script,
        script_name=job.script_name,
        pty=terminal_size(job.pty_size) if job.pty else None,
        output_file=output,
        error_file=error,
        open_append=job.slurm is not None and job.slurm.open_mode == "append",
    )


def preempt_warning(job: Job, config: ClusterConfig) -> SignalSpec | None:
    """The signal a preempted job gets before it is stopped: its own `--signal`, else the
    cluster's `scheduling.preempt_signal` (None: just SIGTERM, grace, SIGKILL)."""
    text = job.signal or config.scheduling.preempt_signal
    return None if text is None else parse_signal(text)


def terminal_size(size: Sequence[int] | None) -> TerminalSize:
    """A pty's size: the client's terminal as last told, else the classic 24 x 80."""
    rows, cols = size if size else (24, 80)
    return TerminalSize(rows=rows, cols=cols)


def step_launch(
    step_id: str,
    job: Job,
    rank: int,
    argv: list[str],
    nodes: Mapping[str, NodeRecord],
    credential: str,
    config: ClusterConfig,
) -> Launch:
    """A job step (`mgpu rsh`): `argv` through /bin/sh, as ssh would, with the job's
    environment and GPUs on that node."""
    slot = job.allocation[rank]
    return Launch(
        job_id=step_id,
        epoch=job.epoch,
        argv=["/bin/sh", "-c", " ".join(argv)],
        env=job_env(job, rank, slot, nodes, credential),
        cwd=job.cwd,
        grant=grant(job, slot, nodes),
        kill_grace=config.scheduling.kill_grace,
        user=job.user,
        allow_root=job.allow_root,
    )
