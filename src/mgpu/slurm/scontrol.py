"""`scontrol show hostnames|job|node|partition`, `scontrol hold|release|requeue JOBS`,
`scontrol update JobId=ID TimeLimit=... JobName=...`."""

from __future__ import annotations

import os
import re
import shlex

from mgpu.safetext import escape_controls
from mgpu.slurm import common, output, states, tres
from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "scontrol"
UPDATABLE = {"timelimit": "time", "jobname": "name", "name": "name", "priority": "priority"}


def hostnames(words: list[str]) -> int:
    from mgpu.hostlist import HostlistError, expand

    env = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    text = ",".join(words) if words else env or ""
    if not text.strip():
        raise fail(PROG, "host list is empty")
    try:
        hosts = expand(text)
    except HostlistError:
        raise common.SlurmError(f"Invalid hostlist: {text}") from None
    output.out("\n".join(hosts))
    return 0


def _uid(user: str) -> str:
    try:
        import pwd

        entry = pwd.getpwnam(user)
        import grp

        return (
            f"{user}({entry.pw_uid}) GroupId={grp.getgrgid(entry.pw_gid).gr_name}({entry.pw_gid})"
        )
    except (KeyError, ImportError):
        return f"{user}(N/A) GroupId=N/A"


def _listed(value: Any) -> str:
    if not value:
        return "(null)"
    return ",".join(value) if isinstance(value, list) else str(value)


def job_text(job: dict[str, Any]) -> str:
    """`scontrol show job`'s block."""
    block = common.slurm_block(job)
    state = states.state(job)
    nodes = common.hostlist(job)
    used = 0.0
    if job.get("start_time"):
        import time

        used = (job.get("end_time") or time.time()) - job["start_time"]
    workdir = str(job.get("cwd") or "")
    out = err = None
    if block:  # as Slurm's: expanded (but what only the node knows) and absolute
        default = "slurm-%A_%a.out" if job.get("array_job_id") else "slurm-%j.out"
        out = _file_name(block.get("output") or default, job, workdir)
        err = _file_name(block["error"], job, workdir) if block.get("error") else out
    array = ""
    if job.get("array_job_id"):
        array = f" ArrayJobId={job['array_job_id']} ArrayTaskId={job.get('array_task_id')}"
    waiting = state == "PENDING"
    never_met = states.never_met(job)
    deps = _dependency(job, waiting, never_met)
    n_nodes = len(job.get("allocation") or []) or job.get("nodes") or 1
    # A held job, or one waiting on another, has no eligible time yet (nor ever will one
    # whose dependency can never be met).
    eligible = common.timestamp(job.get("begin_time") or job.get("submit_time"))
    if never_met or (
        waiting and states.reason(job) in ("JobHeldUser", "JobHeldAdmin", "Dependency")
    ):
        eligible = "Unknown"
    first_node = next((a["node_id"] for a in job.get("allocation") or ()), None)
    # A pending job of -N: Slurm's min-max node count (`2-2`).
    shown_nodes = f"{n_nodes}-{n_nodes}" if waiting and n_nodes > 1 else str(n_nodes)
    per_node_tasks = block.get("ntasks_per_node")
    n_tasks = block.get("ntasks") or (per_node_tasks or 1) * n_nodes
    if not block.get("ntasks") and not job.get("start_time") and not waiting:
        n_tasks = "N/A"  # as Slurm's: a job that ended unplaced asked no task count
    cpus_per_task = block.get("cpus_per_task") or 1
    lines = [
        f"JobId={common.own_id(job)}{array} JobName={common.job_name(job)}",
        f"UserId={_uid(str(job.get('user')))}",
        f"Priority={job.get('priority') or 0} Nice=0 Account=(null) QOS=normal",
        f"JobState={state} Reason={_reason(job, state)} Dependency={deps}",
        f"Requeue={0 if job.get('max_retries') == 0 else 1} "
        f"Restarts={job.get('restart_count') or 0} "
        f"BatchFlag={1 if block.get('batch') else 0} Reboot=0 ExitCode={states.exit_code(job)}",
        f"RunTime={common.clock(used)} TimeLimit={common.time_limit(job, 'sacct')} TimeMin=N/A",
        f"SubmitTime={common.timestamp(job.get('submit_time'))} EligibleTime={eligible}",
        f"StartTime={common.timestamp(job.get('start_time') or job.get('expected_start'))} "
        f"EndTime={common.timestamp(job.get('end_time'))} Deadline=N/A",
        f"Partition={common.partition(job)} AllocNode:Sid={block.get('submit_host') or 'N/A'}:0",
        f"ReqNodeList={_listed(job.get('nodelist'))} ExcNodeList={_listed(job.get('exclude'))}",
        f"NodeList={nodes}",  # empty until it runs; then its first node runs the script
        *([f"BatchHost={first_node if block.get('batch') else '(null)'}"] if first_node else []),
        f"NumNodes={shown_nodes} NumCPUs={tres.num_cpus(job)} NumTasks={n_tasks} "
        f"CPUs/Task={cpus_per_task} ReqB:S:C:T=0:0:*:*",
        f"TRES={_job_tres(job)}",
        f"Socks/Node=* NtasksPerN:B:S:C={per_node_tasks or 0}:0:*:* CoreSpec=*",
        "MinCPUsNode={} MinMemory{}={} MinTmpDiskNode=0".format(
            cpus_per_task * (per_node_tasks or 1), *tres.min_memory(job)
        ),
        f"Command={_command(job, block, workdir)}",
        f"WorkDir={workdir}",
    ]
    if block.get("kill_invalid_dep"):
        lines.append("KillOInInvalidDependent=Yes")  # (sic: Slurm 22.05's spelling)
    if block.get("gpus") is not None:
        lines.append(f"TresPerJob=gres:gpu:{block['gpus']}")
    asked = job.get("resources") or {}
    if asked.get("cpus_per_gpu"):
        lines.append(f"CpusPerTres=gres:gpu:{asked['cpus_per_gpu']}")
    if asked.get("mem_per_gpu_mb") is not None:
        lines.append(f"MemPerTres=gres:gpu:{asked['mem_per_gpu_mb']}")
    if out:
        lines += [f"StdErr={err}", "StdIn=/dev/null", f"StdOut={out}"]
    return _block(lines)


_FILE_PATTERN = re.compile(r"%(%)|%(\d*)([AajJux])")


def _reason(job: dict[str, Any], state: str) -> str:
    """The pending reason; a failed job's `NonZeroExitCode` (`JobLaunchFailure` where a
    signal killed its script, as slurmctld says it), and a job ended by a dependency
    never met `DependencyNeverSatisfied`, as Slurm's."""
    code = job.get("exit_code")
    if state == "FAILED" and isinstance(code, int) and code:
        return "NonZeroExitCode" if code > 0 else "JobLaunchFailure"
    if states.never_met(job):
        return "DependencyNeverSatisfied"
    return states.reason(job)


def _dependency(job: dict[str, Any], waiting: bool, never_met: bool) -> str:
    """Slurm's Dependency: a waiting job's conditions, each `(unfulfilled)` (met, they are
    gone); those that can never be met `(failed)`, kept after the job ended of it."""
    if never_met or (waiting and states.reason(job) == "DependencyNeverSatisfied"):
        status = "failed"
    elif waiting:
        status = "unfulfilled"
    else:
        return "(null)"
    return ",".join(f"{d}({status})" for d in job.get("dependency") or []) or "(null)"


def _file_name(pattern: str, job: dict[str, Any], workdir: str) -> str:
    """An -o/-e pattern as `scontrol show job` prints it: %A %a %j %J %u %x %% expanded
    (the node's %N %n %t are left, as Slurm leaves them), under the working directory
    unless absolute.  A backslash turns expansion off (mgpu.slurmenv.expand_pattern)."""
    if "\\" in pattern:
        name = re.sub(r"\\(\\?)", r"\1", pattern)
    else:
        task = job.get("array_task_id") if job.get("array_job_id") else None
        values = {
            "A": str(job.get("array_job_id") or common.own_id(job)),
            "a": str(task) if task is not None else "4294967294",
            "j": common.own_id(job),
            "J": common.own_id(job),
            "u": str(job.get("user") or ""),
            "x": common.job_name(job),
        }

        def one(m: re.Match[str]) -> str:
            if m.group(1):
                return "%"
            value = values[m.group(3)]
            width = min(int(m.group(2)), 10) if m.group(2) else 0
            return value.rjust(width, "0") if value.isdigit() else value

        name = _FILE_PATTERN.sub(one, pattern)
    return name if name.startswith("/") else f"{workdir.rstrip('/')}/{name}"


def _command(job: dict[str, Any], block: dict[str, Any], workdir: str) -> str:
    """A batch job's script as Slurm names it: its path in the submit directory and its
    arguments; `(null)` for `--wrap`.  Another job's: its command."""
    name = job.get("script_name")
    if not block.get("batch") or not name:
        return str(name or job.get("command") or "")
    if name == "wrap":
        return "(null)"
    path = block.get("script_path")
    base = block.get("submit_dir") or workdir
    try:  # a script job's command is its name and arguments, quoted; Slurm's unquoted
        args = shlex.split(str(job.get("command") or ""))
    except ValueError:
        args = [str(job.get("command"))]
    if args[:1] == [name]:
        args = args[1:]
    return " ".join([path or f"{base.rstrip('/')}/{name}", *args])


def _job_tres(job: dict[str, Any]) -> str:
    """What the job holds once it runs, else what it asks (scontrol's TRES=)."""
    held = tres.tres(job, alloc=True, by_name=False)
    return held or tres.tres(job, alloc=False, by_name=False)


def node_text(node: dict[str, Any]) -> str:
    gpus = node.get("gpus") or []
    busy = sum(1 for g in gpus if g.get("busy_job"))
    state = states.node_state(node)
    kinds = {g.get("name") for g in gpus}
    cpus, cpus_free = tres.node_cpus(node)
    mem, mem_free = tres.node_memory(node)
    alloc_mem = mem - mem_free if mem_free is not None else 0
    lines = [
        f"NodeName={node['node_id']} Arch=x86_64",
        f"CPUAlloc={cpus - cpus_free} CPUEfctv={cpus} CPUTot={cpus} CPULoad=N/A",
        f"Gres=gpu:{len(gpus)} GresUsed=gpu:{busy}",
        f"NodeAddr={node.get('ip') or node.get('hostname')} NodeHostName={node.get('hostname')}",
        f"RealMemory={mem} AllocMem={alloc_mem} FreeMem={'N/A' if mem_free is None else mem_free}",
        f"State={state.upper()}" + (f" Reason={node['reason']}" if node.get("reason") else ""),
        f"AvailableFeatures={','.join(sorted(k for k in kinds if k)) or '(null)'}",
    ]
    return _block(lines)


def _block(lines: list[str]) -> str:
    """`show`'s block: the first line, then the others indented.  Each line is escaped
    (mgpu.safetext), on a terminal or not, as squeue's fields are: a job's command, name or
    directory and a node's reason are their users' text, and each is one line."""
    first, *rest = (escape_controls(line) for line in lines)
    return first + "\n" + "".join(f"   {line}\n" for line in rest)


ENTITIES = (
    ("hostnames", 5, "hostnames"),
    ("jobs", 1, "job"),
    ("jobid", 4, "job"),
    ("nodes", 1, "node"),
    ("partitions", 2, "partition"),
)
"""`show`'s entities: a prefix this long or longer names it (Slurm's abbreviations)."""


def entity(word: str) -> str:
    w = word.lower()
    for full, shortest, name in ENTITIES:
        if len(w) >= shortest and full.startswith(w):
            return name
    return w


def show(client: Any, words: list[str]) -> int:
    what = entity(words[0]) if words else ""
    rest = words[1:]
    if what == "hostnames":
        return hostnames(rest)
    if what == "job":
        if rest:
            from mgpu.client.api import RequestError

            try:
                job = client.show(rest[0])
            except RequestError as e:
                if e.status == 404:
                    raise common.SlurmError(
                        "slurm_load_jobs error: Invalid job id specified"
                    ) from None
                raise
            jobs = job.get("tasks") or [job]
        else:
            jobs = client.queue()["jobs"]
        if not jobs:
            output.out("No jobs in the system")
        output.out("\n".join(job_text(j) for j in jobs), end="")
        return 0
    if what == "node":
        nodes = client.nodes()
        if rest:
            nodes = [n for n in nodes if rest[0] in (n["node_id"], n.get("hostname"))]
            if not nodes:
                raise common.SlurmError(f"Node {rest[0]} not found")
        output.out("\n".join(node_text(n) for n in nodes), end="")
        return 0
    if what == "partition":
        from mgpu.slurm.sinfo import partitions

        for part in partitions(client, client.nodes()):
            if rest and part.name != rest[0]:
                continue
            limit = "UNLIMITED" if part.limit == "infinite" else part.limit
            output.out(
                f"PartitionName={part.name}\n   Default={'YES' if part.default else 'NO'} "
                f"MaxTime={limit} State=UP\n   Nodes={','.join(part.nodes)}\n"
                f"   TotalNodes={len(part.nodes)}\n"
            )
        return 0
    raise fail(PROG, f"invalid entity: {what or '(none)'} for keyword: show")


def _job_list(words: list[str]) -> list[str]:
    ids = [i for w in words for i in w.split(",") if i]
    if not ids:
        raise fail(PROG, "Invalid job id specified")
    return ids


def job_action(client: Any, verb: str, words: list[str]) -> int:
    from mgpu.client.api import RequestError

    call = {
        "hold": client.hold,
        "uhold": client.hold,
        "release": client.release,
        "requeue": client.requeue,
    }[verb]
    status = 0
    for job_id in _job_list(words):
        try:
            call(job_id)
        except RequestError as e:
            status = 1
            why = "Invalid job id specified" if e.status == 404 else str(e)
            output.err(
                f"{verb} error on job {job_id}: {why}"
                if verb != "requeue"
                else f"Requeue of JobId={job_id} failed: {why}"
            )
    return status


def update(client: Any, words: list[str]) -> int:
    """`update JobId=ID TimeLimit=2:00:00 JobName=x StartTime=now+1hour` (keys in any
    case)."""
    job_id = None
    changes: dict[str, Any] = {}
    for word in words:
        key, eq, value = word.partition("=")
        k = key.lower()
        if not eq:
            raise fail(PROG, f"Invalid input: {word}")
        if k in ("jobid", "job"):
            job_id = value
        elif k in ("starttime", "begintime"):  # as sbatch --begin reads it
            from mgpu.slurm import begintime

            try:
                changes["begin"] = begintime.parse_begin(value, begintime.now())
            except ValueError as e:
                raise fail(PROG, f"Invalid time specification: {value}: {e}") from None
        elif k in UPDATABLE:
            changes[UPDATABLE[k]] = int(value) if k == "priority" and value.isdigit() else value
        else:
            raise common.SlurmError(f"Update of this parameter is not supported: {word}")
    if job_id is None:
        raise fail(PROG, "No job identification provided")
    if not changes:
        raise fail(PROG, "No changes specified")
    from mgpu.client.api import RequestError

    try:
        client.update(job_id, **changes)
    except RequestError as e:
        why = "Invalid job id specified" if e.status == 404 else str(e)
        raise common.SlurmError(f"Job {job_id} update error: {why}") from None
    return 0


def main(argv: list[str]) -> int:
    words = [w for w in argv if not w.startswith("-") or w in ("-", "--")]
    flags = [w for w in argv if w.startswith("-") and w not in ("-", "--")]
    if any(f in ("-h", "--help", "--usage") for f in flags) or not words:
        output.out(
            "Usage: scontrol show hostnames|job|node|partition [ID] | "
            "hold|release|requeue JOBS | update JobId=ID TimeLimit=T JobName=N"
        )
        return 0 if words or flags else 1
    verb = words[0].lower()
    if verb == "show" and len(words) > 1 and entity(words[1]) == "hostnames":
        return hostnames(words[2:])  # no master needed (launchers run this on every node)
    client = common.make_client()
    if verb == "show":
        return show(client, words[1:])
    if verb in ("hold", "uhold", "release", "requeue"):
        return job_action(client, verb, words[1:])
    if verb == "update":
        return update(client, words[1:])
    raise fail(PROG, f"Invalid keyword: {words[0]}")
