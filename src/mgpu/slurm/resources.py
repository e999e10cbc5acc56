"""Slurm's CPU and memory options: checked as Slurm 22.05 checks them, and what they ask
of each node (`slurm_ask`, the one translation into a `mgpu.resources.ResourceAsk`).

The options: `-c/--cpus-per-task`, `--cpus-per-gpu` (not with `-c`), `--mem`,
`--mem-per-cpu`, `--mem-per-gpu` (one of the three; `--mem=0`: all of the node's memory),
`--exclusive` (whole nodes).  Sizes are Slurm's (`str_to_mbytes`): a whole number, MiB
unless K, M, G or T follows (an optional B after it).  A job asks for CPUs when it names
them (`-c`, `--cpus-per-gpu`, `--mem-per-cpu`'s CPUs, `--exclusive`): then each node holds
its tasks there times `-c` (default 1), as Slurm's.  Tasks alone ask for none, so a script
that never said CPUs packs onto GPUs as before.

Light to import (the Slurm commands run with the system's python3): `mgpu.resources` is
loaded only when an ask is built.
"""

from __future__ import annotations

from mgpu.slurm.common import fail
from mgpu.slurmasks import CPUS_EXCLUSIVE, MEMORY_EXCLUSIVE, slurm_ask, tasks_on_node

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Set


__all__ = [
    "CPUS_EXCLUSIVE",
    "MEMORY_EXCLUSIVE",
    "MEMORY_EXCLUSIVE_ENV",
    "MEMORY_OPTIONS",
    "exclusive",
    "memory_mb",
    "memory_option",
    "own_words",
    "slurm_ask",
    "tasks_on_node",
]

MEMORY_OPTIONS = ("mem", "mem-per-cpu", "mem-per-gpu")
MEMORY_EXCLUSIVE_ENV = (
    "SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive."
)
_UNITS = "KMGT"


def memory_mb(prog: str, option: str, text: str | None) -> int | None:
    """`--mem`'s (and the others') size in MiB, as Slurm's `str_to_mbytes` reads it: a whole
    number (`1.5G` is refused, as Slurm refuses it), K rounded up; Slurm's sentence if not."""
    if text is None:
        return None
    body = text.strip()
    if len(body) > 1 and body[-1] in "bB" and body[-2].upper() in _UNITS:
        body = body[:-1]
    number = body[:-1] if body[-1:].upper() in _UNITS else body
    if not (number.isascii() and number.isdigit()):
        raise fail(prog, f"Invalid --{option} specification")
    from mgpu.resources import parse_size_mb

    return parse_size_mb(body)


def memory_option(prog: str, values: Mapping[str, str], from_env: Set[str]) -> str | None:
    """Which of --mem, --mem-per-cpu, --mem-per-gpu stands (None: none given), by Slurm's
    rule: two given in the script or on the command line are refused; one given there
    drops the others an input variable gave; two variables alone are refused."""
    given = [name for name in MEMORY_OPTIONS if values.get(name) is not None]
    by_hand = [name for name in given if name not in from_env]
    if len(by_hand) > 1:
        raise fail(prog, MEMORY_EXCLUSIVE)
    if by_hand:
        return by_hand[0]
    if len(given) > 1:
        raise fail(prog, MEMORY_EXCLUSIVE_ENV)
    return given[0] if given else None


def exclusive(prog: str, text: str | None) -> tuple[bool, str | None]:
    """`--exclusive[=exclusive|oversubscribe|user|mcs]`: (whole nodes?, the warning of a
    form mgpu ignores).  `user` and `mcs` (nodes shared only among one user's or one
    label's jobs) would change what runs beside the job: refused."""
    if text is None:
        return False, None
    kind = text.strip().lower()
    if kind in ("", "exclusive"):
        return True, None
    if kind == "oversubscribe":
        return False, "--exclusive=oversubscribe"
    if kind in ("user", "mcs"):
        raise fail(
            prog,
            f"--exclusive={kind} is not supported by mgpu (nodes shared only among one "
            f"{kind}'s jobs); use --exclusive for whole nodes",
        )
    raise fail(prog, "Invalid --exclusive specification")


def own_words(block: Mapping[str, object], gpus_per_node: int, nodes: int) -> list[str]:
    """`mgpu srun`'s `--cpus N --mem SIZE` (and `--exclusive`) for Slurm's options of an
    srun outside any job (its own new job): the same CPUs and memory per node, as numbers."""
    per_task = block.get("cpus_per_task")
    per_gpu = block.get("cpus_per_gpu")
    ntasks, per_node = block.get("ntasks"), block.get("ntasks_per_node")
    cpus = 0
    if isinstance(per_task, int) or isinstance(block.get("mem_per_cpu_mb"), int):
        tasks = tasks_on_node(
            nodes,
            ntasks if isinstance(ntasks, int) else None,
            per_node if isinstance(per_node, int) else None,
        )
        cpus = tasks * (per_task if isinstance(per_task, int) else 1)
    if isinstance(per_gpu, int):
        cpus = per_gpu * gpus_per_node
    words = ["--cpus", str(cpus)] if cpus else []
    mem = block.get("mem_per_node_mb")
    if not isinstance(mem, int):
        per_cpu, per_gpu_mem = block.get("mem_per_cpu_mb"), block.get("mem_per_gpu_mb")
        if isinstance(per_cpu, int):
            mem = per_cpu * cpus
        elif isinstance(per_gpu_mem, int):
            mem = per_gpu_mem * gpus_per_node
    if isinstance(mem, int) and (mem or block.get("mem_per_node_mb") == 0):
        words += ["--mem", f"{mem}M"]
    if block.get("exclusive"):
        words.append("--exclusive")
    return words
