"""A Slurm job's environment and its -o/-e file names, formatted exactly as Slurm's.

Pure functions: the job, where it runs and the cluster's names in; strings out.  The
master calls `job_env` for every node of a job submitted the Slurm way (a `slurm` block:
`mgpu.model.SlurmOptions`) and `output_files` for a batch job's first node.  The formats
follow Slurm 22.05: SLURM_TASKS_PER_NODE is ``2(x3),1``, node lists are host lists
(`mgpu.hostlist`), `%a` of a job that is not an array is Slurm's NO_VAL (4294967294).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mgpu import spec as specs
from mgpu.hostlist import compress
from mgpu.model import Job

__all__ = [
    "NO_VAL",
    "Where",
    "check_pattern",
    "cpus_per_node",
    "expand_pattern",
    "job_env",
    "job_number",
    "memory_env",
    "node_names",
    "output_files",
    "task_counts",
    "task_env",
    "tasks_per_node",
]

NO_VAL = 4294967294
"""What Slurm prints for a value a job does not have (`%a` of a job that is no array)."""


@dataclass(frozen=True, slots=True)
class Where:
    """Where a job runs, as its Slurm variables name it."""

    names: tuple[str, ...]
    """The allocation's node names in rank order (`node_names`)."""
    cluster: str
    partition: str


def node_names(hosts: Sequence[tuple[str, str | None]]) -> tuple[str, ...]:
    """The names SLURM_JOB_NODELIST lists, from (node id, hostname) in rank order.  Slurm
    lists host names, and `scontrol show hostnames ... | head -n1` must reach the first node
    (MASTER_ADDR): the agents' host names, unless two nodes share one (several agents on
    one machine) or one is unknown: then the node ids, which tell them apart."""
    hostnames = [h or "" for _, h in hosts]  # as the agents say them: names that resolve
    if all(hostnames) and len(set(hostnames)) == len(hostnames):
        return tuple(hostnames)
    return tuple(node_id for node_id, _ in hosts)


def job_number(job: Job) -> str:
    """SLURM_JOB_ID: the job's id; an array task's own number (`specs.task_job_number`)."""
    if job.array_job_id is None or job.array_task_id is None:
        return job.id
    number = specs.task_job_number(job.array_job_id, job.array_task_id)
    return job.id if number is None else str(number)


def task_counts(nnodes: int, ntasks: int | None, per_node: int | None) -> list[int]:
    """Tasks on each node: --ntasks-per-node each, else --ntasks spread as Slurm's block
    distribution does (the first nodes take one more), else one per node."""
    if per_node is not None:
        counts = [per_node] * nnodes
        if ntasks is not None:  # -n caps the total: the last nodes take fewer
            left = ntasks
            counts = []
            for _ in range(nnodes):
                counts.append(max(0, min(per_node, left)))
                left -= counts[-1]
        return counts
    if ntasks is None:
        return [1] * nnodes
    base, extra = divmod(ntasks, nnodes)
    return [base + 1 if i < extra else base for i in range(nnodes)]


def tasks_per_node(counts: Sequence[int]) -> str:
    """SLURM_TASKS_PER_NODE: runs of equal counts as ``N(xK)``: [2, 2, 2, 1] -> ``2(x3),1``."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        run = j - i
        parts.append(str(counts[i]) if run == 1 else f"{counts[i]}(x{run})")
        i = j
    return ",".join(parts)


def job_env(job: Job, rank: int, where: Where) -> dict[str, str]:
    """The SLURM_* variables of the job's process on node `rank` of its allocation (but
    its GPUs': the agent's, from the run's grant, mgpu.agent.grants)."""
    slurm = job.slurm
    assert slurm is not None, "only jobs submitted with a slurm block have Slurm's variables"
    names = where.names
    counts = task_counts(len(names), slurm.ntasks, slurm.ntasks_per_node)
    cpus = cpus_per_node(job, counts)
    job_id = job_number(job)
    nodelist = compress(list(names))
    env = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_JOB_NAME": job_name(job),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_NNODES": str(len(names)),
        "SLURM_JOB_NUM_NODES": str(len(names)),
        "SLURM_TASKS_PER_NODE": tasks_per_node(counts),
        "SLURM_JOB_CPUS_PER_NODE": tasks_per_node(cpus),
        "SLURM_CPUS_ON_NODE": str(cpus[rank]),
        "SLURM_CLUSTER_NAME": where.cluster,
        "SLURM_JOB_PARTITION": where.partition,
        "SLURM_JOB_USER": job.user,
        "SLURM_NODEID": str(rank),
        "SLURMD_NODENAME": names[rank],
        "SLURM_RESTART_COUNT": str(job.restarts),
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_GTIDS": "0",
    }
    optional = {
        "SLURM_NTASKS_PER_NODE": slurm.ntasks_per_node,
        "SLURM_CPUS_PER_TASK": slurm.cpus_per_task,
        "SLURM_CPUS_PER_GPU": slurm.cpus_per_gpu,
        "SLURM_GPUS_PER_TASK": slurm.gpus_per_task,
        "SLURM_GPUS": slurm.gpus,
        "SLURM_GPUS_PER_NODE": slurm.gpus_per_node,
        "SLURM_GPU_BIND": slurm.gpu_bind,  # srun reads these two, as Slurm's
        "SLURM_EXPORT_ENV": slurm.export_env,
        # --export other than ALL: the node loads the account's login environment under
        # the variables sent, as Slurm's sbatch asks (mgpu.agent.userenv)
        "SLURM_GET_USER_ENV": "1" if slurm.export_env else None,
        "SLURM_SUBMIT_HOST": slurm.submit_host,
        "SLURM_SUBMIT_DIR": slurm.submit_dir or job.cwd,
    }
    env.update({k: str(v) for k, v in optional.items() if v is not None})
    if slurm.ntasks is not None or slurm.ntasks_per_node is not None:  # Slurm's: only then
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(sum(counts))
    env.update(memory_env(job, rank))
    if job.array_job_id is not None and job.array_task_id is not None:
        env.update(array_env(job))
    return env


def cpus_per_node(job: Job, counts: Sequence[int]) -> list[int]:
    """CPUs on each node of the job: those it was granted there; for a job that holds none
    of its own (it asked for none, and the cluster sets no default), its tasks there times
    its -c, as Slurm's default of one CPU per task."""
    granted = [s.cpus for s in job.allocation]
    if len(granted) == len(counts) and all(isinstance(c, int) and c > 0 for c in granted):
        return [int(c or 0) for c in granted]
    per_task = job.slurm.cpus_per_task if job.slurm is not None else None
    return [c * (per_task or 1) for c in counts]


def memory_env(job: Job, rank: int) -> dict[str, str]:
    """SLURM_MEM_PER_NODE (what the job holds on the node: `--mem=0`'s is the node's
    memory), SLURM_MEM_PER_CPU or SLURM_MEM_PER_GPU, of the one memory option the job gave
    (mgpu's `--mem` is a `--mem`); none without one, as Slurm's."""
    asked = job.ask if not job.ask.empty else job.slurm
    if asked is None:
        return {}
    if asked.mem_per_cpu_mb is not None:
        return {"SLURM_MEM_PER_CPU": str(asked.mem_per_cpu_mb)}
    if asked.mem_per_gpu_mb is not None:
        return {"SLURM_MEM_PER_GPU": str(asked.mem_per_gpu_mb)}
    if asked.mem_per_node_mb is None:
        return {}
    slot = job.allocation[rank] if rank < len(job.allocation) else None
    held = slot.mem_mb if slot is not None and slot.mem_mb else asked.mem_per_node_mb
    return {"SLURM_MEM_PER_NODE": str(held)} if held else {}


def job_name(job: Job) -> str:
    """SLURM_JOB_NAME: --job-name, else the script's file name (``wrap`` for --wrap)."""
    slurm = job.slurm
    default = slurm.job_name_default if slurm is not None else None
    return job.name or default or job.script_name or "sbatch"


def array_env(job: Job) -> dict[str, str]:
    """SLURM_ARRAY_* of an array task (the array's shape is kept on its SlurmOptions)."""
    slurm = job.slurm
    assert slurm is not None and job.array_job_id is not None
    env = {
        "SLURM_ARRAY_JOB_ID": job.array_job_id,
        "SLURM_ARRAY_TASK_ID": str(job.array_task_id),
    }
    shape = {
        "SLURM_ARRAY_TASK_COUNT": slurm.array_count,
        "SLURM_ARRAY_TASK_MIN": slurm.array_min,
        "SLURM_ARRAY_TASK_MAX": slurm.array_max,
        "SLURM_ARRAY_TASK_STEP": slurm.array_step,
    }
    env.update({k: str(v) for k, v in shape.items() if v is not None})
    return env


def array_shape(indices: Sequence[int]) -> tuple[int, int, int, int]:
    """(count, min, max, step) of an array's indices, as SLURM_ARRAY_TASK_*: the step of
    evenly spaced indices, else 1."""
    low, high = min(indices), max(indices)
    gaps = {b - a for a, b in itertools.pairwise(indices)}
    step = gaps.pop() if len(gaps) == 1 else 1
    return len(indices), low, high, step


# ---- output file names -----------------------------------------------------------------

_CONVERSION = re.compile(r"%(%|(\d*)([aAjJNnstux]))")
_MAX_WIDTH = 10
"""Slurm pads a number to at most this many digits (`%012j` is `%010j`)."""
_KNOWN = "aAjJNnstux"


def check_pattern(pattern: str, what: str = "--output") -> str:
    """An -o/-e pattern as given, if a file name can be made of it.  A `%` Slurm does not
    know stays as it is in the name (as in Slurm); the name must not be empty or hold NUL."""
    if not pattern.strip():
        raise specs.SpecError(f"{what} is empty; give a file name such as slurm-%j.out")
    if "\0" in pattern:
        raise specs.SpecError(f"{what} contains a NUL byte")
    return pattern


@dataclass(frozen=True, slots=True)
class PatternValues:
    """What `%` stands for in a batch job's -o/-e pattern."""

    job_id: str
    array_job_id: str
    array_task_id: int | None
    job_name: str
    user: str
    node_name: str
    node_id: int = 0
    task_id: int = 0


def expand_pattern(pattern: str, values: PatternValues) -> str:
    """Slurm's filename pattern of a batch step: %j %J (job id: the batch step has no step
    number) %x %u %A %a %N %n %t %s (``batch``) %%, each number zero-padded to the width
    written between % and the letter (at most 10).  A backslash anywhere turns expansion
    off and is removed (Slurm's `remove_path_slashes`); any other `%` is kept as is."""
    if "\\" in pattern:
        return re.sub(r"\\(\\?)", r"\1", pattern)

    def number(value: int | str, width: str) -> str:
        text = str(value)
        wid = min(int(width), _MAX_WIDTH) if width else 0
        return text.rjust(wid, "0") if text.isdigit() else text

    def one(m: re.Match[str]) -> str:
        if m.group(1) == "%":
            return "%"
        width, letter = m.group(2), m.group(3)
        task = values.array_task_id
        if letter in "jJ":
            return number(values.job_id, width)
        if letter == "A":
            return number(values.array_job_id if task is not None else values.job_id, width)
        if letter == "a":
            return number(NO_VAL if task is None else task, width)
        if letter == "n":
            return number(values.node_id, width)
        if letter == "t":
            return number(values.task_id, width)
        if letter == "s":
            return "batch"
        return {"N": values.node_name, "u": values.user, "x": values.job_name}[letter]

    return _CONVERSION.sub(one, pattern)


def output_files(job: Job, node_name: str) -> tuple[str, str]:
    """A batch job's (stdout, stderr) file names on its first node, relative to its
    working directory unless absolute: -o (default ``slurm-%j.out``, arrays
    ``slurm-%A_%a.out``), -e (default: the stdout file)."""
    slurm = job.slurm
    assert slurm is not None
    array = job.array_job_id is not None
    values = PatternValues(
        job_id=job_number(job),
        array_job_id=job.array_job_id or job.id,
        array_task_id=job.array_task_id if array else None,
        job_name=job_name(job),
        user=job.user,
        node_name=node_name,
    )
    default = "slurm-%A_%a.out" if array else "slurm-%j.out"
    out = expand_pattern(slurm.output or default, values)
    err = out if slurm.error is None else expand_pattern(slurm.error, values)
    return out, err


def task_env(
    *,
    step_id: int,
    procid: int,
    localid: int,
    nodeid: int,
    ntasks: int,
    step_hosts: Sequence[str],
    node_tasks: Sequence[int],
    node_procids: Sequence[int] = (),
) -> dict[str, str]:
    """One task's variables: `procid` its rank in the step, `localid` on its node, `nodeid`
    its node's index in the step; `step_hosts` the step's nodes' hostnames in order,
    `node_tasks` their task counts and `node_procids` the ranks of the tasks on this task's
    node (SLURM_GTIDS; default its own).  The GPUs it sees are its grant's
    (mgpu.agent.grants).  As srun's, SLURM_NNODES is the step's node count."""
    nodelist = compress(list(step_hosts))
    return {
        "SLURM_GTIDS": ",".join(str(p) for p in node_procids or (procid,)),
        "SLURM_NNODES": str(len(step_hosts)),
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
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node(node_tasks),
        "SLURM_TASKS_PER_NODE": tasks_per_node(node_tasks),  # srun's: the step's
    }
