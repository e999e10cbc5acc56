"""The differences between Slurm and mgpu that the differential tier accepts.

INTENDED: mgpu differs on purpose (the README's compatibility section names each by its
`name`, with the same reason).  KNOWN: differences that are mgpu bugs or gaps still
open; a case showing one xfails with its reason instead of failing.  Anything else a
case shows fails it.  A pattern is matched (fnmatch) against `CASE/KEY`, KEY as
compare.py writes it (`env:SLURM_GTIDS`, `sacct:batch:NodeList`, `scontrol:Command`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Entry:
    name: str
    reason: str
    patterns: tuple[str, ...]

    def matches(self, case: str, key: str) -> bool:
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
        "cpus-and-memory",
        "CPUs and memory are not scheduled (mgpu schedules GPUs): the CPU counts, "
        "the CPU and memory TRES and the per-node CPU/memory minimums are not Slurm's",
        (
            *_env("SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE"),
            *_scontrol(
                "NumCPUs",
                "TRES",
                "MinCPUsNode",
                "MinMemoryNode",
                "MinTmpDiskNode",
                "ReqB:S:C:T",
                "Socks/Node",
                "NtasksPerN:B:S:C",
                "CoreSpec",
            ),
            "*/sacct:*:ReqTRES",
            "*/sacct:*:AllocTRES",
        ),
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

KNOWN: tuple[Entry, ...] = (
    Entry(
        "steps-keep-exports",
        "issue 31 item 1: a step gets mgpu's MASTER_ADDR/MASTER_PORT/WORLD_SIZE/NODE_RANK "
        "over the script's own (fixed on branch h31-env)",
        _env("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK"),
    ),
    Entry(
        "gpu-bind",
        "issue 31 item 4: `--gpu-bind=none` is ignored (fixed on branch h31-env)",
        ("gpus_per_task/*",),
    ),
    Entry(
        "missing-variables",
        "Slurm sets SLURM_GPUS_PER_NODE in a job of --gpus-per-node, and SLURM_TASK_PID in "
        "every step task; mgpu not yet",
        _env("SLURM_GPUS_PER_NODE", "SLURM_TASK_PID"),
    ),
    Entry(
        "export-none-user-env",
        "`--export=NONE` or a list: Slurm loads the account's login environment into the "
        "batch script (`--get-user-env`: USER, LOGNAME, SLURM_GET_USER_ENV); mgpu not",
        ("export_none/*",),
    ),
    Entry(
        "srun-reads-ntasks",
        "srun inside a job takes SLURM_NTASKS as its -n (so `srun --ntasks-per-node=1` in a "
        "4-task job still runs 4 tasks, with a warning); mgpu's srun takes the shape asked",
        ("spellings/*",),
    ),
    Entry(
        "signal-exit",
        "a batch script killed by a signal: Slurm says CANCELLED/`0:9`, mgpu FAILED/`137:0` "
        "and a `Killed` line from its launcher shell",
        ("killed_by_signal/*",),
    ),
    Entry(
        "kill-on-bad-exit-state",
        "`srun -K`: Slurm records the step CANCELLED `0:15` (its tasks killed) and srun "
        "exits 143; mgpu FAILED with the failing task's code, srun exits with it",
        ("kill_on_bad_exit/*",),
    ),
    Entry(
        "derived-exit-code",
        "sacct's DerivedExitCode is the highest exit code of the job's srun steps in Slurm; "
        "mgpu prints the job's own exit code",
        ("*/sacct:job:DerivedExitCode",),
    ),
    Entry(
        "scontrol-job-text",
        "`scontrol show job`: Slurm prints Command as the script's absolute path and "
        "arguments ((null) for --wrap), StdOut/StdErr expanded and absolute, Reason "
        "NonZeroExitCode for a failed job; mgpu the script's name, the patterns as given, None",
        _scontrol("Command", "StdOut", "StdErr", "Reason"),
    ),
    Entry(
        "never-run-job",
        "a job cancelled by a dependency that can never be satisfied: Slurm keeps its "
        "reason (DependencyNeverSatisfied), clears a satisfied dependency and shows "
        "StartTime as the cancel time; mgpu differs in these fields",
        (
            "dependency_chain/scontrol:*",
            "dependency_chain/sacct:job:Timelimit",
            "dependency_chain/sacct:job:Reason",
            "commands/sacct-held:Timelimit",
            "commands/sacct-held:Start",
        ),
    ),
    Entry(
        "cancelled-by",
        "sacct's State of a cancelled job is `CANCELLED by UID` in Slurm (`CANCELLED+` in a "
        "column), `CANCELLED` in mgpu",
        ("commands/sacct-*:State",),
    ),
    Entry(
        "cancelled-exit-code",
        "a running job cancelled: Slurm's job line says ExitCode `0:0` (its batch step "
        "`0:15`), mgpu's job line `0:15`",
        ("commands/sacct-runner:ExitCode",),
    ),
)


def explain(case: str, key: str) -> tuple[str, Entry | None]:
    """("intended" | "known" | "", the entry) for a difference of `case`."""
    for entry in INTENDED:
        if entry.matches(case, key):
            return "intended", entry
    for entry in KNOWN:
        if entry.matches(case, key):
            return "known", entry
    return "", None
