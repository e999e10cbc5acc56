"""A job submitted the Slurm way: what it asked for that mgpu's own options have no field
for (kept with the job, `Job.slurm`; re-exported by mgpu.model)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["OPEN_MODES", "SlurmOptions"]

OPEN_MODES = ("truncate", "append")


@dataclass(frozen=True, slots=True)
class SlurmOptions:
    """A job submitted the Slurm way (`sbatch`, or `#SBATCH` lines): what it asked for that
    mgpu's own options have no field for.  It gets Slurm's environment (mgpu.slurmenv), and
    a batch job its -o/-e files on the node."""

    batch: bool = False
    """sbatch semantics: the script once on the first node, Slurm's output files."""
    job_name_default: str | None = None
    """SLURM_JOB_NAME without --job-name: the script's file name (``wrap`` for --wrap)."""
    ntasks: int | None = None
    """--ntasks; None: one task per node."""
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None
    """--cpus-per-gpu (never with --cpus-per-task, as Slurm)."""
    mem_per_node_mb: int | None = None
    """--mem: 0 is all of the node's memory.  At most one of the three memory forms."""
    mem_per_cpu_mb: int | None = None
    mem_per_gpu_mb: int | None = None
    exclusive: bool = False
    """--exclusive: whole nodes.  What these ask of a node: mgpu.slurm.resources.slurm_ask."""
    gpus_per_task: int | None = None
    gpus: int | None = None
    """`--gpus` as asked (SLURM_GPUS, scontrol's TresPerJob); None: not asked so."""
    gpus_per_node: int | None = None
    """`--gpus-per-node` as asked (SLURM_GPUS_PER_NODE); None: not asked so."""
    partition: str | None = None
    """As asked; once stored, the partition the job runs in (the default one when it named
    none, or one that does not exist)."""
    partition_nodes: tuple[str, ...] | None = None
    """The nodes of that partition, kept with the job (None: every node): the only ones it
    may run on (master/state/snapshot.py)."""
    partition_max_time: float | None = None
    """That partition's `max_time` in seconds (None: none), kept with the job: a longer
    time limit waits as PartitionTimeLimit (master/state/snapshot.py)."""
    kill_invalid_dep: bool = False
    """`--kill-on-invalid-dep=yes`: a dependency that can never be met cancels the job;
    otherwise it waits as DependencyNeverSatisfied (Slurm's default)."""
    gpu_bind: str | None = None
    """`--gpu-bind` as given (mgpu.gpubind): its steps' default, as SLURM_GPU_BIND."""
    export_env: str | None = None
    """sbatch's `--export` other than ALL, as SLURM_EXPORT_ENV: its sruns' default."""
    output: str | None = None
    """The -o pattern as given; None: slurm-%j.out (arrays slurm-%A_%a.out)."""
    error: str | None = None
    """The -e pattern; None: the same file as the output."""
    open_mode: str = "truncate"
    submit_host: str | None = None
    submit_dir: str | None = None
    script_path: str | None = None
    """The batch script as sbatch found it (scontrol's Command); None: not said."""
    array_count: int | None = None
    """An array's shape (SLURM_ARRAY_TASK_COUNT, _MIN, _MAX, _STEP), set at submit."""
    array_min: int | None = None
    array_max: int | None = None
    array_step: int | None = None

    def to_record(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _SLURM_FIELDS}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> SlurmOptions:
        fields = {k: v for k, v in rec.items() if k in _SLURM_FIELDS}
        if fields.get("partition_nodes") is not None:
            fields["partition_nodes"] = tuple(fields["partition_nodes"])
        return cls(**fields)


_SLURM_FIELDS = tuple(f.name for f in fields(SlurmOptions))
