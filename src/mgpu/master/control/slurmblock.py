"""The `slurm` block of a submission (`sbatch`): checked into `model.SlurmOptions`, and the
partition it names resolved against the cluster config.

The block carries what Slurm's options ask for that mgpu's own job fields have no room for
(tasks, CPUs and memory per task or node, the partition, the -o/-e patterns ...); GPUs,
nodes, arrays, dependencies and the rest map onto the JobSpec's own fields.  A refusal is
one sentence naming the option as sbatch spells it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from mgpu import gpubind
from mgpu import spec as specs
from mgpu.config import ClusterConfig, Partition
from mgpu.model import OPEN_MODES, SlurmOptions
from mgpu.slurmasks import CPUS_EXCLUSIVE, MEMORY_EXCLUSIVE
from mgpu.slurmenv import check_pattern

__all__ = ["PartitionChoice", "choose_partition", "parse_slurm_block"]

MAX_COUNT = 1_000_000
"""Largest task or CPU count taken (Slurm's own limits are far below it)."""
MAX_MEMORY_MB = 1 << 40

_COUNTS = {
    "ntasks": ("--ntasks", 1),
    "ntasks_per_node": ("--ntasks-per-node", 1),
    "cpus_per_task": ("--cpus-per-task", 1),
    "cpus_per_gpu": ("--cpus-per-gpu", 1),
    "gpus_per_task": ("--gpus-per-task", 1),
    "gpus": ("--gpus", 0),
    "gpus_per_node": ("--gpus-per-node", 0),
    "mem_per_node_mb": ("--mem", 0),  # --mem=0: all of the node's memory, in Slurm
    "mem_per_cpu_mb": ("--mem-per-cpu", 0),
    "mem_per_gpu_mb": ("--mem-per-gpu", 0),
}
_TEXTS = {
    "job_name_default": "the job's default name",
    "partition": "--partition",
    "output": "--output",
    "error": "--error",
    "submit_host": "the submit host",
    "submit_dir": "the submit directory",
    "script_path": "the script's path",
    "gpu_bind": "--gpu-bind",
    "export_env": "--export",
}
_FLAGS = ("batch", "kill_invalid_dep", "exclusive")
_KNOWN = frozenset({"open_mode", *_FLAGS, *_COUNTS, *_TEXTS})
_PARTITION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
MAX_PATTERN_CHARS = 4096


def parse_slurm_block(value: Any) -> SlurmOptions | None:
    """The request's `slurm` object as SlurmOptions; SpecError with one sentence if not."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise specs.SpecError("the slurm block must be a JSON object of Slurm's options")
    unknown = sorted(k for k in value if k not in _KNOWN)
    if unknown:
        raise specs.SpecError(f"the slurm block has no option {unknown[0]!r:.60}")
    out: dict[str, Any] = {}
    for key in _FLAGS:
        flag = value.get(key, False)
        if not isinstance(flag, bool):
            raise specs.SpecError(f"the slurm block's {key} must be true or false")
        out[key] = flag
    for key, (option, least) in _COUNTS.items():
        out[key] = _count(value.get(key), option, least)
    _check_cpus_memory(out)
    for key, what in _TEXTS.items():
        out[key] = _text(value.get(key), what)
    mode = value.get("open_mode") or "truncate"
    if mode not in OPEN_MODES:
        raise specs.SpecError(f"--open-mode {str(mode)!r:.40} is not append or truncate")
    out["open_mode"] = mode
    if out["partition"] is not None and _PARTITION_RE.fullmatch(out["partition"]) is None:
        raise specs.SpecError(
            f"--partition {out['partition']!r:.60} is not a partition name; use up to 64 "
            "letters, digits, '.', '_' or '-'"
        )
    for key in ("output", "error"):
        if out[key] is not None:
            check_pattern(out[key], _TEXTS[key])
    if out["gpu_bind"] is not None:
        try:
            gpubind.parse(out["gpu_bind"])
        except ValueError as e:
            raise specs.SpecError(str(e)) from None
    if out["submit_dir"] is not None and not os.path.isabs(out["submit_dir"]):
        raise specs.SpecError(f"the submit directory {out['submit_dir']!r:.60} is not absolute")
    return SlurmOptions(**out)


def _check_cpus_memory(out: dict[str, Any]) -> None:
    """Slurm's refusals of CPU and memory options that cannot go together (its words)."""
    forms = ("mem_per_node_mb", "mem_per_cpu_mb", "mem_per_gpu_mb")
    if sum(out[f] is not None for f in forms) > 1:
        raise specs.SpecError(MEMORY_EXCLUSIVE)
    if out["cpus_per_task"] is not None and out["cpus_per_gpu"] is not None:
        raise specs.SpecError(CPUS_EXCLUSIVE)


def _count(value: Any, option: str, least: int) -> int | None:
    if value is None:
        return None
    top = MAX_MEMORY_MB if option.startswith("--mem") else MAX_COUNT
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= top:
        raise specs.SpecError(
            f"{option} needs a whole number from {least} to {top}, not {value!r:.40}"
        )
    return value


def _text(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise specs.SpecError(f"{what} must be text, not {value!r:.40}")
    if len(value) > MAX_PATTERN_CHARS:
        raise specs.SpecError(f"{what} is longer than {MAX_PATTERN_CHARS} characters")
    return specs.validate_text(value, what)


# ---- partitions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionChoice:
    """Where a Slurm job runs: its partition and what that means for it."""

    name: str
    nodes: tuple[str, ...] | None
    """The partition's nodes (None: every node of the cluster)."""
    max_time: float | None
    """Seconds; None: no limit of the partition's."""
    warning: str | None = None
    """One line for the submit's answer (an unknown name ignored)."""


def choose_partition(asked: str | None, config: ClusterConfig) -> PartitionChoice:
    """The partition a Slurm job asked for, else the default one.  An unknown name is one
    warning and the default, unless the config refuses it (Slurm's sentence then)."""
    default = config.default_partition()
    if asked is None or asked == default.name:
        return _choice(default)
    found = config.partition(asked)
    if found is not None:
        return _choice(found)
    if config.refuse_unknown_partition:
        raise specs.SpecError(f"invalid partition specified: {asked}")
    warning = f"partition {asked!r} does not exist here; the job runs in {default.name!r}"
    return _choice(default, warning)


def _choice(partition: Partition, warning: str | None = None) -> PartitionChoice:
    limit = None if partition.max_time is None else specs.parse_time_limit(partition.max_time)
    nodes = partition.node_ids() or None
    return PartitionChoice(partition.name, nodes, limit, warning)
