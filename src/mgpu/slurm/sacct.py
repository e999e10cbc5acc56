"""`sacct`: jobs in Slurm's accounting columns (`-j`, `-u`, `-a`, `--format/-o`, `-X`, `-n`,
`-p`, `-P`, `--delimiter`, `-s`, `-S`, `-E`, `-b`, `-l`).  One line per job (array task);
without `-X` a batch job that has started has its `ID.batch` line after it, then a line
for each `srun` step that ended (`ID.0`, `ID.1`, ...: stored apart from the job, asked for
here: `ask_steps`), as Slurm's.  A step still running is not listed."""

from __future__ import annotations

import time

from mgpu.slurm import common, fields, opts, output, states, tres
from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "sacct"
USAGE = "[-j jobs] [-u users] [-a] [-o fields] [-X] [-n] [-p|-P] [-s states] [-S time] [-E time]"
OPTIONS = opts.table(
    "jobs=/j user=/u uid= allusers/a format=/o allocations/X noheader/n parsable/p "
    "parsable2/P delimiter= state=/s starttime=/S endtime=/E brief/b long/l name= "
    "partition=/r account=/A clusters=/M duplicates/D units= noconvert helpformat/e "
    "verbose/v help/h usage version/V array"
)
DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF = "JobID,State,ExitCode"
LONG = (
    "JobID,JobIDRaw,JobName,Partition,User,AllocCPUS,State,ExitCode,Submit,Start,End,"
    "Elapsed,Timelimit,NNodes,NodeList,WorkDir"
)


def _elapsed(job: dict[str, Any]) -> float:
    start = job.get("start_time")
    if not start:
        return 0.0
    return float((job.get("end_time") or time.time()) - start)


def _nnodes(job: dict[str, Any]) -> str:
    return str(len(job.get("allocation") or []) or job.get("nodes") or 1)


def _cpus(job: dict[str, Any]) -> str:
    if job.get("state") == "queued":
        return "0"
    if job.get(STEP) is not None and not all(s.get("cpus") for s in job.get("allocation") or ()):
        # a step of a job whose nodes do not say their CPUs: its own tasks times -c
        return str((job.get("_ntasks") or 1) * (common.slurm_block(job).get("cpus_per_task") or 1))
    return str(tres.alloc_cpus(job))  # a step's: the job's CPUs on its nodes, as Slurm's


def _req_cpus(job: dict[str, Any]) -> str:
    """The job's ask; a step's (and the batch step's): the CPUs it holds, as Slurm's."""
    return _cpus(job) if _suffix(job) else str(tres.req_cpus(job))


def _req_mem(job: dict[str, Any]) -> str:
    mb = tres.req_mem(job)
    return "" if mb is None else tres.memory(mb)


def _alloc_tres(job: dict[str, Any]) -> str:
    """The job's; a step's without billing (Slurm bills jobs, not steps)."""
    text = tres.tres(job, alloc=True, by_name=True, step=job.get(STEP) is not None)
    if not _suffix(job):
        return text
    return ",".join(i for i in text.split(",") if not i.startswith("billing="))


def _uid(job: dict[str, Any]) -> str:
    try:
        import pwd

        return str(pwd.getpwnam(str(job.get("user"))).pw_uid)
    except (KeyError, ImportError):
        return ""


def _group(job: dict[str, Any]) -> str:
    try:
        import grp
        import pwd

        return grp.getgrgid(pwd.getpwnam(str(job.get("user"))).pw_gid).gr_name
    except (KeyError, ImportError):
        return ""


def _max_rss(job: dict[str, Any]) -> str:
    """The job's peak memory as sacct writes it: KiB, in a larger unit where exact."""
    mb = job.get("max_rss_mb")
    if not isinstance(mb, int):
        return ""
    value, units = mb * 1024, "KMGTP"
    while value and value % 1024 == 0 and units[1:]:
        value, units = value // 1024, units[1:]
    return f"{value}{units[0]}"


def _unstarted(job: dict[str, Any]) -> str:
    return "Unknown" if job.get("state") == "queued" else "None"


def _time_limit(job: dict[str, Any]) -> str:
    """Slurm's: a job of no limit of its own that has not started is held to its
    partition's, `Partition_Limit` (once it starts, the partition's own)."""
    if job.get("time_limit") is None and not job.get("start_time"):
        return "Partition_Limit"
    return common.time_limit(job, "sacct")


def _reason(job: dict[str, Any]) -> str:
    """A waiting job's reason; a job's that has left the queue is Slurm's
    `state_reason_prev`: for one that waited on a dependency (met, or never met), the
    Dependency it waited on; else None (a dependency already met at submit: never waited
    on).  A record from before `waited_on_dependency` was kept: any dependency."""
    if job.get("state") == "queued":
        return states.reason(job)
    waited = job.get("waited_on_dependency")
    if waited is None:
        waited = bool(job.get("dependency"))
    return "Dependency" if states.never_met(job) or waited else "None"


def _state(job: dict[str, Any]) -> str:
    return states.state(job)


def _shown_state(row: dict[str, Any]) -> str:
    """sacct's State: a job a user cancelled is `CANCELLED by UID` (the canceller's uid;
    their name where this machine has no such account), as Slurm's; its steps' lines and
    a job the cluster ended say the state alone."""
    name = _state(row)
    by = row.get("cancelled_by")
    if name != "CANCELLED" or not by or _suffix(row):
        return name
    return f"CANCELLED by {_uid({'user': by}) or by}"


BATCH_STEP = "_batch_step"
"""Marks the row of a job's `ID.batch` line (its script, as Slurm's batch step)."""


def batch_step(job: dict[str, Any]) -> dict[str, Any] | None:
    """The `ID.batch` row of a batch job that has started, else None."""
    if not common.slurm_block(job).get("batch") or not job.get("start_time"):
        return None
    # The script ran on the allocation's first node, as one task.
    row = {**job, BATCH_STEP: True, "allocation": (job.get("allocation") or [])[:1]}
    code = job.get("exit_code")
    if job.get("state") == "failed" and isinstance(code, int) and code < 0:
        # a signal ended the script: Slurm's step is CANCELLED (its job stays FAILED)
        row["state"], row["end_code"] = "cancelled", None
    return row


STEP = "_step"
"""Marks the row of one of a job's srun steps (`ID.N`): its number."""


def step_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A row for each srun step the job ran (its `steps`): the job's, with the step's name,
    state, exit code, times and nodes."""
    slots = {slot.get("node_id"): slot for slot in job.get("allocation") or ()}
    return [
        {
            **job,
            STEP: step.get("number", i),
            "name": step.get("name") or "",
            "state": step.get("state"),
            "reason": None,
            # Its own end says how it ended, not its job's code (out_of_memory: a task
            # killed for its memory, OUT_OF_MEMORY and 0:125 as Slurm's step).
            "end_code": step.get("end_code"),
            "exit_code": step.get("exit_code"),
            "start_time": step.get("start"),
            "end_time": step.get("end"),
            # the job's slots on the step's nodes: its CPUs, memory and GPUs there
            "allocation": [slots.get(n) or {"node_id": n} for n in step.get("nodes") or ()],
            "_ntasks": step.get("ntasks"),
        }
        for i, step in enumerate(job.get("steps") or ())
    ]


def _exit_code(row: dict[str, Any]) -> str:
    """`EXIT:SIGNAL`; a cancelled job's own line `0:0`, as Slurm's (its batch step says
    the signal that ended the script)."""
    if row.get("state") == "cancelled" and not _suffix(row):
        return "0:0"
    return states.exit_code(row)


def derived_exit_code(job: dict[str, Any]) -> str:
    """Slurm's DerivedExitCode: the highest `EXIT:SIGNAL` of the job's srun steps (as
    slurmctld's, the larger wait status: an exit code over a signal), `0:0` with none."""
    best = (0, 0)
    for row in step_rows(job):
        code, _, signal = states.exit_code(row).partition(":")
        best = max(best, (int(code), int(signal or 0)))
    return f"{best[0]}:{best[1]}"


STEPS_ASKED = 500
"""Jobs whose steps one request asks for (the master takes up to 1,000)."""


def ask_steps(client: Any, jobs: list[dict[str, Any]]) -> None:
    """Fill in the `steps` of the jobs that have started and have none yet (a queue
    listing leaves them out): `GET /api/sruns`, a slice of jobs at a time."""
    from mgpu.client.api import RequestError, _quote  # ids as they are: urllib is slow

    wanted = [j for j in jobs if j.get("start_time") and "steps" not in j]
    for i in range(0, len(wanted), STEPS_ASKED):
        part = wanted[i : i + STEPS_ASKED]
        ids = ",".join(_quote(str(j["id"])) for j in part)
        try:
            found = client._request("GET", f"/api/sruns?jobs={ids}")["steps"]
        except RequestError as e:
            if e.status != 404:
                raise
            return  # a master of an older mgpu: its listings carried them, or it has none
        for job in part:
            job["steps"] = found.get(str(job["id"])) or []


def _suffix(row: dict[str, Any]) -> str:
    if row.get(BATCH_STEP):
        return ".batch"
    return f".{row[STEP]}" if row.get(STEP) is not None else ""


def _ntasks(row: dict[str, Any]) -> str:
    """A step's tasks (the batch step's: its one script); empty on a job's own line."""
    if row.get(BATCH_STEP):
        return "1"
    return str(row.get("_ntasks") or "") if row.get(STEP) is not None else ""


def _step_id(getter: Any) -> Any:
    return lambda j: getter(j) + _suffix(j)


def _job_level(getter: Any) -> Any:
    """A column the steps' lines leave empty (their job's line has it)."""
    return lambda j: "" if _suffix(j) else getter(j)


GETTERS: dict[str, Any] = {
    "JobID": _step_id(common.job_id_of),
    "JobIDRaw": _step_id(common.own_id),
    "JobName": lambda j: "batch" if j.get(BATCH_STEP) else common.job_name(j),
    "Partition": _job_level(common.partition),
    "Account": lambda j: "",
    "AllocCPUS": _cpus,
    "NCPUS": _cpus,
    "ReqCPUS": _req_cpus,
    "ReqMem": _job_level(_req_mem),
    "State": _shown_state,
    "ExitCode": _exit_code,
    "DerivedExitCode": _job_level(derived_exit_code),
    "Elapsed": lambda j: common.clock(_elapsed(j)),
    "ElapsedRaw": lambda j: str(int(_elapsed(j))),
    "Submit": lambda j: common.timestamp(j.get("submit_time")),
    "Eligible": lambda j: common.timestamp(j.get("submit_time")),
    # as Slurm's: a job that ended without starting started `None` (one waiting: Unknown)
    "Start": lambda j: common.timestamp(j.get("start_time"), _unstarted(j)),
    "End": lambda j: common.timestamp(j.get("end_time")),
    "NodeList": lambda j: common.hostlist(j) or "None assigned",
    "NNodes": _nnodes,
    "AllocNodes": lambda j: "0" if j.get("state") == "queued" else _nnodes(j),
    "User": _job_level(lambda j: str(j.get("user") or "")),
    "Timelimit": _job_level(_time_limit),
    "WorkDir": _job_level(lambda j: str(j.get("cwd") or "")),
    "Reason": _job_level(_reason),
    "ReqTRES": _job_level(lambda j: tres.tres(j, alloc=False, by_name=True)),
    "AllocTRES": _alloc_tres,
    "ArrayJobID": lambda j: str(j.get("array_job_id") or j["id"]),
    "ArrayTaskID": lambda j: str(j.get("array_task_id") if j.get("array_job_id") else ""),
    "Priority": _job_level(lambda j: str(j.get("priority") or 0)),
    "UID": _job_level(lambda j: _uid(j)),
    "Group": _job_level(lambda j: _group(j)),
    "QOS": lambda j: "normal",
    "Restarts": lambda j: str(j.get("restart_count") or 0),
    "Cluster": lambda j: "mgpu",
    "NTasks": _ntasks,
    "Comment": lambda j: "",
    "MaxRSS": _max_rss,
}
"""The values mgpu has; a field of Slurm's it has not is empty, as sacct's are for data
the cluster does not gather."""

SLURM_FIELDS = """
Account 10 AdminComment 15 AllocCPUS 10 AllocNodes 10 AllocTRES 10 AssocID 7 AveCPU 10
AveCPUFreq 10 AveDiskRead 14 AveDiskWrite 14 AvePages 10 AveRSS 10 AveVMSize 10 BlockID 16
Cluster 10 Comment 14 Constraints 19 ConsumedEnergy 14 ConsumedEnergyRaw 17 Container 19
CPUTime 10 CPUTimeRAW 10 DBIndex -10 DerivedExitCode 15 Elapsed 10 ElapsedRaw 10
Eligible 19 End 19 ExitCode 8 Flags 19 GID 6 Group 9 JobID -12 JobIDRaw -12 JobName 10
Layout 9 MaxDiskRead 12 MaxDiskReadNode 15 MaxDiskReadTask 15 MaxDiskWrite 12
MaxDiskWriteNode 16 MaxDiskWriteTask 16 MaxPages 8 MaxPagesNode 12 MaxPagesTask 14
MaxRSS 10 MaxRSSNode 10 MaxRSSTask 10 MaxVMSize 10 MaxVMSizeNode 14 MaxVMSizeTask 14
McsLabel 12 MinCPU 10 MinCPUNode 10 MinCPUTask 10 NCPUS 10 NNodes 8 NodeList 15 NTasks 8
Partition 10 Priority 10 QOS 10 QOSRAW 6 Reason 22 ReqCPUFreq 10 ReqCPUFreqGov 13
ReqCPUFreqMax 13 ReqCPUFreqMin 13 ReqCPUS 8 ReqMem 10 ReqNodes 8 ReqTRES 10
Reservation 20 ReservationId 8 Reserved 10 ResvCPU 10 ResvCPURAW 10 Start 19 State 10
Submit 19 SubmitLine 20 Suspended 10 SystemComment 15 SystemCPU 10 Timelimit 10
TimelimitRaw 10 TotalCPU 10 TRESUsageInAve 14 TRESUsageInMax 14 TRESUsageInMaxNode 18
TRESUsageInMaxTask 18 TRESUsageInMin 14 TRESUsageInMinNode 18 TRESUsageInMinTask 18
TRESUsageInTot 14 TRESUsageOutAve 15 TRESUsageOutMax 15 TRESUsageOutMaxNode 19
TRESUsageOutMaxTask 19 TRESUsageOutMin 15 TRESUsageOutMinNode 19 TRESUsageOutMinTask 19
TRESUsageOutTot 15 UID 6 User 9 UserCPU 10 WCKey 10 WCKeyID 10 WorkDir 20
ArrayJobID 15 ArrayTaskID 15 Restarts 8
"""
"""sacct's fields (src/sacct/sacct.c `fields[]` of Slurm 22.05, in its order: a name
given is the first it prefixes) and their widths; mgpu's own last (ArrayJobID ...)."""


def _fields() -> dict[str, tuple[int, Any]]:
    words = SLURM_FIELDS.split()
    blank = lambda j: ""  # noqa: E731
    return {
        name: (int(width), GETTERS.get(name, blank))
        for name, width in zip(words[::2], words[1::2], strict=True)
    }


KNOWN = _fields()


def _midnight() -> float:
    now = time.localtime()
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, 0, 0, 0, 0, 0, -1))


def _epoch(text: str) -> float:
    """sacct's -S/-E: `YYYY-MM-DD[THH:MM[:SS]]`, `now`, `now-Ndays|hours|minutes`."""
    t = text.strip().lower()
    if t.startswith("now"):
        rest = t[3:]
        if not rest:
            return time.time()
        units = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
        for unit, secs in units.items():
            if rest.endswith(unit) and rest[1 : -len(unit)].isdigit():
                sign = -1 if rest[0] == "-" else 1
                return time.time() + sign * int(rest[1 : -len(unit)]) * secs
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%m/%d/%y", "%m/%d"):
        try:
            parsed = time.strptime(text, fmt)
        except ValueError:
            continue
        if fmt == "%m/%d":
            parsed = time.strptime(f"{time.localtime().tm_year}/{text}", "%Y/%m/%d")
        return time.mktime(parsed)
    raise fail(PROG, f"Invalid time specification: {text}")


def gather(client: Any, given: dict[str, str]) -> list[dict[str, Any]]:
    from mgpu.client.api import RequestError

    jobs: list[dict[str, Any]] = []
    if given.get("jobs"):
        for job_id in (given["jobs"] or "").split(","):
            job_id = job_id.strip().partition(".")[0]  # ID.batch: the job
            if not job_id:
                continue
            try:
                job = client.show(job_id, all=True)
            except RequestError as e:
                if e.status == 404:
                    continue
                raise
            jobs += job.get("tasks") or [job]
        return jobs
    users: set[str] | None = None
    if given.get("user"):
        users = set((given["user"] or "").split(","))
    elif "allusers" not in given:
        who = client.whoami()  # an admin sees everyone's, as root does in Slurm
        users = None if who.get("admin") else {str(who["user"])}
    start = _epoch(given["starttime"] or "") if given.get("starttime") else _midnight()
    end = _epoch(given["endtime"] or "") if given.get("endtime") else None
    for job in client.queue(all=True)["jobs"]:
        if users is not None and job.get("user") not in users:
            continue
        if job.get("end_time") and job["end_time"] < start:
            continue
        if end is not None and (job.get("submit_time") or 0) > end:
            continue
        jobs.append(job)
    return jobs


def main(argv: list[str]) -> int:
    given, rest = opts.command_line(PROG, argv, OPTIONS, USAGE)
    if "helpformat" in given:
        output.out(" ".join(KNOWN))
        return 0
    if rest:
        raise fail(PROG, f"Unrecognized option: {rest[0]}")
    spec = given.get("format") or (
        BRIEF if "brief" in given else LONG if "long" in given else DEFAULT
    )
    columns = fields.parse_fields(PROG, spec, KNOWN)
    wanted = states.parse_states(PROG, given["state"]) if given.get("state") else None
    client = common.make_client()
    jobs = [j for j in gather(client, given) if wanted is None or _state(j) in wanted]
    jobs.sort(key=lambda j: (j.get("submit_time") or 0, str(j["id"])))
    if "allocations" not in given or any(c[0] == "DerivedExitCode" for c in columns):
        ask_steps(client, jobs)
    if "allocations" not in given:
        jobs = [row for j in jobs for row in (j, batch_step(j), *step_rows(j)) if row is not None]
    parsable = "P" if "parsable2" in given else "p" if "parsable" in given else None
    lines = fields.render_fields(
        columns, jobs, "noheader" not in given, parsable, given.get("delimiter") or "|"
    )
    if lines:
        output.out("\n".join(lines))
    return 0
