"""The differences between Slurm and mgpu that the differential tier accepts.

INTENDED: mgpu differs on purpose (the README's compatibility section names each by its
`name`, with the same reason).  KNOWN: differences that are mgpu bugs or gaps still
open; a case showing one xfails with its reason instead of failing.  Anything else a
case shows fails it.  A pattern is matched (fnmatch) against `CASE/KEY`, KEY as
compare.py writes it (`env:SLURM_GTIDS`, `sacct:batch:NodeList`, `scontrol:Command`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any


@dataclass(frozen=True)
class Entry:
    name: str
    reason: str
    patterns: tuple[str, ...]
    when: Callable[[Any, Any], bool] | None = None
    """Where set, the entry covers only the differences whose values (Slurm's, mgpu's)
    it accepts: the intended kind of difference, not any value at those keys."""

    def matches(self, case: str, key: str, slurm: Any = None, mgpu: Any = None) -> bool:
        if self.when is not None and not self.when(slurm, mgpu):
            return False
        return any(fnmatchcase(f"{case}/{key}", p) for p in self.patterns)


def _env(*names: str, case: str = "*") -> tuple[str, ...]:
    return tuple(f"{case}/env:{n}" for n in names)


def _scontrol(*keys: str, case: str = "*") -> tuple[str, ...]:
    return tuple(f"{case}/scontrol:{k}" for k in keys)


INTENDED: tuple[Entry, ...] = (
    Entry(
        "slurm-internals",
        "variables that name Slurm's own machinery (its config file, its daemons' "
        "addresses and ports, its topology and binding plugins): mgpu has none of it",
        _env(
            "SLURM_CONF",
            "SLURM_WORKING_CLUSTER",
            "SLURM_NODE_ALIASES",
            "SLURM_TOPOLOGY_ADDR",
            "SLURM_TOPOLOGY_ADDR_PATTERN",
            "SLURM_PRIO_PROCESS",
            "SLURM_SRUN_COMM_HOST",
            "SLURM_SRUN_COMM_PORT",
            "SLURM_STEP_LAUNCHER_PORT",
            "SLURM_LAUNCH_NODE_IPADDR",
            "SLURM_UMASK",
            "SLURM_DISTRIBUTION",
            "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0",
            "SLURMD_TRES_BIND",
            "SLURM_CPU_BIND*",
        ),
    ),
    Entry(
        "no-memory-asked",
        "a job that asks for no memory holds none of its own in mgpu: it shares its node's, "
        "so that a lab that asks nothing packs jobs onto GPUs as before; Slurm with "
        "memory scheduled and no DefMemPer* gives it the whole node's (mem= in its TRES)",
        ("*/sacct:*:ReqTRES", "*/sacct:*:AllocTRES", "*/sacct:job:ReqMem", "*/scontrol:TRES"),
        when=lambda slurm, mgpu: _without_mem(slurm) == (mgpu or ""),
    ),
    Entry(
        "cpus-spread",
        "`-N 2 -n 4`: mgpu gives each node the CPUs of its own tasks (2 and 2); Slurm's "
        "cons_tres may hold more on the first node (3 and 1) for the same tasks",
        (
            *_env("SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", case="step_shapes"),
            "step_shapes/sacct:*:AllocCPUS",
            "step_shapes/sacct:*:ReqCPUS",
            "step_shapes/sacct:*:AllocTRES",
        ),
    ),
    Entry(
        "tasks-per-node-of-cpus",
        "a job of no task count but --exclusive or --cpus-per-gpu: Slurm's "
        "SLURM_TASKS_PER_NODE counts its CPUs (its srun still starts one task); mgpu's "
        "says the one task per node srun starts",
        (
            *_env("SLURM_TASKS_PER_NODE", case="exclusive"),
            *_env("SLURM_TASKS_PER_NODE", case="cpus_per_gpu"),
        ),
    ),
    Entry(
        "exclusive-gpus-named",
        "an --exclusive job holds its node's GPUs in both (AllocTRES gres/gpu); mgpu also "
        "names them to it (CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE...), Slurm names none "
        "to a job that asked for none",
        _env(
            "CUDA_VISIBLE_DEVICES",
            "GPU_DEVICE_ORDINAL",
            "SLURM_GPUS_ON_NODE",
            "SLURM_JOB_GPUS",
            "SLURM_STEP_GPUS",
            case="exclusive",
        ),
        when=lambda slurm, mgpu: slurm is None,
    ),
    Entry(
        "mem-zero-named",
        "`--mem=0` (all of the node's memory): mgpu's SLURM_MEM_PER_NODE says the memory "
        "held; Slurm 22.05 leaves it unset",
        _env("SLURM_MEM_PER_NODE", case="mem_zero"),
        when=lambda slurm, mgpu: slurm is None,
    ),
    Entry(
        "accounts",
        "mgpu has no accounts, QOS records or MCS labels",
        (*_env("SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS"), *_scontrol("Account", "MCS_label")),
    ),
    Entry(
        "priority-scale",
        "mgpu's priorities are its own numbers (fair share, age, size), not Slurm's",
        ("*/scontrol:Priority", "*/sacct:job:Priority"),
    ),
    Entry(
        "no-gpu-hidden",
        "a job or step that asked for no GPU sees none: mgpu sets CUDA_VISIBLE_DEVICES "
        "(and SLURM_STEP_GPUS) empty, where Slurm without device cgroups leaves them unset",
        ("*/env:CUDA_VISIBLE_DEVICES", "*/env:SLURM_STEP_GPUS"),
        when=lambda slurm, mgpu: slurm is None and mgpu == "",
    ),
    Entry(
        "gpu-bind-none-devices",
        "`srun --gpu-bind=none`: every task sees all of its job's GPUs on the node; mgpu "
        "names them (CUDA_VISIBLE_DEVICES...), Slurm leaves the variables unset (without "
        "device cgroups, as here, CUDA then sees the whole node)",
        _env("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_STEP_GPUS", case="gpus_per_task"),
        when=lambda slurm, mgpu: slurm is None and bool(mgpu),
    ),
    Entry(
        "scontrol-fields",
        "`scontrol show job` prints the fields mgpu has; these it has not (suspension, "
        "scheduler internals, power, licenses, features, mail, comments, TRES per node)",
        _scontrol(
            "SuspendTime",
            "SecsPreSuspend",
            "Scheduler",
            "Power",
            "OverSubscribe",
            "Network",
            "Licenses",
            "LastSchedEval",
            "Features",
            "DelayBoot",
            "Contiguous",
            "AccrueTime",
            "AllocNode:Sid",
            "TresPerNode",
            "TresPerTask",
            "MailUser",
            "MailType",
            "Comment",
        ),
    ),
    Entry(
        "warned-options",
        "an option mgpu accepts but does not honour (`--comment`, mail without SMTP or to "
        "a non-address) is named in one warning line on sbatch's stderr; Slurm says nothing",
        ("mail_placeholder/submit0:stderr", "time_limit/submit0:stderr"),
    ),
    Entry(
        "restart-count",
        "SLURM_RESTART_COUNT is always set (0 before any requeue), so scripts need no "
        "default; Slurm sets it only after a requeue",
        _env("SLURM_RESTART_COUNT"),
    ),
    Entry(
        "array-task-ids",
        "task I of array A is job A+I (the README's 'Job ids of array tasks'); Slurm gives "
        "a task the next free id when it starts and job A to the last task",
        (
            *_env("SLURM_JOB_ID", "SLURM_JOBID", case="array"),
            *_scontrol("ArrayTaskId", "StdOut", "StdErr", case="array"),
        ),
    ),
    Entry(
        "machine-has-slurm",
        "on a machine with a Slurm of its own, a login shell (`#!/bin/bash -l`) in an mgpu "
        "job finds that Slurm's commands in /usr/bin: mgpu never shadows them",
        ("login_shell/*",),
    ),
    Entry(
        "srun-diagnostics",
        "srun's and slurmstepd's own lines in the job's output (`srun: error: node001: "
        "task 0: Exited with exit code 1`, their warnings) are not written by mgpu",
        ("*/diagnostics:*",),
    ),
    Entry(
        "step-export-list",
        "a step sees the batch script's environment: Slurm's srun also applies sbatch's "
        "`--export` list again (SLURM_EXPORT_ENV), so that a step of `--export=A,B` lacks "
        "PATH and cannot find its program",
        ("export_list/*", "export_none/env:SLURM_EXPORT_ENV"),
    ),
)

KNOWN: tuple[Entry, ...] = ()


def _without_mem(value: object) -> str | None:
    """A TRES list without its `mem=` item (a ReqMem: empty); None if it had none."""
    text = str(value or "")
    if "mem=" not in text:
        return "" if text.endswith(("M", "G", "T")) and text[:1].isdigit() else None
    return ",".join(item for item in text.split(",") if not item.startswith("mem="))


def explain(case: str, key: str, slurm: Any = None, mgpu: Any = None) -> tuple[str, Entry | None]:
    """("intended" | "known" | "", the entry) for a difference of `case` at `key`, the two
    sides' values `slurm` and `mgpu`."""
    for entry in INTENDED:
        if entry.matches(case, key, slurm, mgpu):
            return "intended", entry
    for entry in KNOWN:
        if entry.matches(case, key, slurm, mgpu):
            return "known", entry
    return "", None
