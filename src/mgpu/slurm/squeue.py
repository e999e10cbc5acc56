"""`squeue`: the queue in Slurm's columns (`-o/--format`, `-O/--Format`, `-u`, `--me`, `-j`,
`-t`, `-p`, `-n`, `-h`, `-l`, `-r`, `-i`)."""

from __future__ import annotations

import os
import time

from mgpu.slurm import common, fields, opts, output, states, tres
from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "squeue"
USAGE = (
    "[-u user_list] [--me] [-j job_list] [-t state_list] [-h] [-o format] [-O fields] "
    "[-p partitions] [-n names] [-l] [-r] [-i seconds]"
)
DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
OPTIONS = opts.table(
    "user=/u me jobs?/j states=/t noheader/h format=/o Format=/O partition=/p name=/n "
    "long/l array/r iterate=/i sort=/S all/a account=/A verbose/v nodelist=/w clusters=/M "
    "qos=/q steps?/s start help usage version/V"
)


def _now() -> float:
    return time.time()


def _used(job: dict[str, Any]) -> float:
    start = job.get("start_time")
    if not start or job.get("state") == "queued":
        return 0.0
    return float((job.get("end_time") or _now()) - start)


def _shown_id(job: dict[str, Any]) -> str:
    if job.get("array_tasks") and job.get("array_job_id"):
        return f"{job['array_job_id']}_[{job['array_tasks']}]"
    return common.job_id_of(job)


def _nodes(job: dict[str, Any]) -> str:
    alloc = job.get("allocation") or []
    return str(len(alloc) if alloc and job.get("state") != "queued" else job.get("nodes") or 1)


def _time_left(job: dict[str, Any]) -> str:
    limit = job.get("time_limit")
    if limit is None or limit == float("inf"):
        return "UNLIMITED"
    return common.elapsed(max(0.0, float(limit) - _used(job)))


def _gres(job: dict[str, Any]) -> str:
    """The GPUs asked per node; N/A for a Slurm job that asked them per job (`--gpus`:
    scontrol's TresPerJob), as Slurm's."""
    if common.slurm_block(job).get("gpus") is not None:
        return "N/A"
    gpus = job.get("gpus_per_node") if (job.get("nodes") or 1) > 1 else job.get("gpus")
    return f"gres:gpu:{gpus}" if gpus else "N/A"


def _where(job: dict[str, Any]) -> str:
    if job.get("state") == "queued":
        return f"({states.reason(job)})"
    return common.hostlist(job)


def _null(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "(null)"
    return ",".join(value) if isinstance(value, list) else str(value)


def _uid(job: dict[str, Any]) -> str:
    try:
        import pwd

        return str(pwd.getpwnam(job["user"]).pw_uid)
    except (KeyError, ImportError):
        return "N/A"


def _priority(job: dict[str, Any]) -> str:
    value = job.get("priority_value")
    return str(int(value)) if isinstance(value, int | float) else str(job.get("priority") or 0)


def _when(key: str) -> Any:
    return lambda job: common.timestamp(job.get(key), "N/A")


COLUMNS: list[tuple[str, str, str, Any]] = [
    # %-letter, its -O names, title, value
    ("i", "jobid jobarrayid", "JOBID", _shown_id),
    ("A", "", "JOBID", common.job_id_of),
    ("F", "arrayjobid", "ARRAY_JOB_ID", lambda j: str(j.get("array_job_id") or j["id"])),
    ("K", "arraytaskid", "ARRAY_TASK_ID", lambda j: _array_task(j)),
    ("j", "name", "NAME", common.job_name),
    ("u", "username user", "USER", lambda j: str(j.get("user") or "")),
    ("U", "userid", "UID", _uid),
    ("t", "statecompact", "ST", lambda j: states.letters(states.state(j))),
    ("T", "state", "STATE", states.state),
    ("M", "timeused", "TIME", lambda j: common.elapsed(_used(j))),
    ("l", "timelimit", "TIME_LIMIT", common.time_limit),
    ("L", "timeleft", "TIME_LEFT", _time_left),
    ("D", "numnodes", "NODES", _nodes),
    ("R", "reasonlist", "NODELIST(REASON)", _where),
    ("r", "reason", "REASON", states.reason),
    ("N", "nodelist", "NODELIST", common.hostlist),
    ("B", "batchhost", "EXEC_HOST", lambda j: common.hostlist(j).split(",")[0] or "n/a"),
    ("P", "partition", "PARTITION", common.partition),
    ("C", "numcpus", "CPUS", lambda j: str(tres.num_cpus(j))),
    ("c", "mincpus", "MIN_CPUS", lambda j: str(common.slurm_block(j).get("cpus_per_task") or 1)),
    ("m", "minmemory", "MIN_MEMORY", lambda j: tres.min_memory(j)[1]),
    ("b", "tres-per-node", "TRES_PER_NODE", _gres),
    ("o", "command", "COMMAND", lambda j: str(j.get("script_name") or j.get("command") or "")),
    ("Z", "workdir", "WORK_DIR", lambda j: str(j.get("cwd") or "")),
    ("V", "submittime", "SUBMIT_TIME", _when("submit_time")),
    ("S", "starttime", "START_TIME", _when("start_time")),
    ("e", "endtime", "END_TIME", _when("end_time")),
    ("E", "dependency", "DEPENDENCY", lambda j: _null(j.get("dependency"))),
    ("p", "priority", "PRIORITY", _priority),
    ("Q", "prioritylong", "PRIORITY", _priority),
    ("q", "qos", "QOS", lambda j: "normal"),
    ("a", "account", "ACCOUNT", lambda j: "(null)"),
    ("v", "reservation", "RESERVATION", lambda j: _null(j.get("reservation"))),
    ("k", "comment", "COMMENT", lambda j: "(null)"),
    ("n", "reqnodes", "REQ_NODES", lambda j: _null(j.get("nodelist"))),
    ("x", "excnodes", "EXC_NODES", lambda j: _null(j.get("exclude"))),
]
"""squeue's fields, each once: `-o %X` by its letter, `-O name` by any of its names (in
any case, whole: squeue's opts.c compares them with xstrcasecmp)."""
KNOWN, LONG_NAMES = fields.columns(COLUMNS)


def _array_task(job: dict[str, Any]) -> str:
    if job.get("array_tasks"):
        return f"[{job['array_tasks']}]"
    task = job.get("array_task_id")
    return "N/A" if task is None else str(task)


def _split(text: str) -> set[str]:
    return {w.strip() for w in text.split(",") if w.strip()}


_STATE_ORDER = {"PENDING": 0, "RUNNING": 1}


def _sort_key(job: dict[str, Any]) -> tuple[Any, ...]:
    prio = job.get("priority_value")
    numeric = str(job["id"]).replace("_", ".")
    return (
        common.partition(job),
        _STATE_ORDER.get(states.state(job), 2),
        -(prio if isinstance(prio, int | float) else 0),
        len(numeric),
        numeric,
    )


def select(
    jobs: list[dict[str, Any]],
    ids: set[str] | None,
    users: set[str] | None,
    wanted: set[str] | None,
    partitions: set[str] | None,
    names: set[str] | None,
) -> list[dict[str, Any]]:
    """The jobs the filters keep (an array id names its tasks), in squeue's order."""
    out = []
    for job in jobs:
        own = {str(job["id"]), str(job.get("array_job_id")), common.own_id(job)}
        if ids is not None and not (own & ids):
            continue
        if users is not None and job.get("user") not in users:
            continue
        if wanted is not None and states.state(job) not in wanted:
            continue
        if partitions is not None and common.partition(job) not in partitions:
            continue
        if names is not None and common.job_name(job) not in names:
            continue
        out.append(job)
    return sorted(out, key=_sort_key)


def main(argv: list[str]) -> int:
    given, rest = opts.command_line(PROG, argv, OPTIONS, USAGE)
    ids = given.get("jobs")
    if not ids and rest and "jobs" in given:
        ids, rest = rest[0], rest[1:]
    if rest:
        raise fail(PROG, f"Unrecognized option: {rest[0]}")
    fmt = given.get("format") or os.environ.get("SQUEUE_FORMAT")
    if "Format" in given or (fmt is None and os.environ.get("SQUEUE_FORMAT2")):
        items = fields.parse_long(
            PROG, given.get("Format") or os.environ["SQUEUE_FORMAT2"], KNOWN, LONG_NAMES
        )
    else:
        fmt = fmt or (LONG if "long" in given else DEFAULT)
        items = fields.parse_percent(PROG, fmt, KNOWN)
    wanted = states.parse_states(PROG, given["states"]) if given.get("states") else None
    client = common.make_client()
    users = _split(given["user"]) if given.get("user") else None
    if "me" in given:
        users = {str(client.whoami()["user"])}
    id_set = _split(ids) if ids else None
    header = "noheader" not in given
    iterate = float(given["iterate"]) if given.get("iterate") else 0.0
    while True:
        ended = bool(wanted and wanted - set(states.ACTIVE))  # `-t CD`: the last ended jobs
        data = client.queue(all=ended, fold="array" not in given)
        jobs = select(
            list(data["jobs"]),
            id_set,
            users,
            wanted,
            _split(given["partition"]) if given.get("partition") else None,
            _split(given["name"]) if given.get("name") else None,
        )
        if id_set and not jobs:
            _check_ids(client, id_set)
        if iterate:
            output.out(time.strftime("%a %b %d %H:%M:%S %Y"))
        lines = fields.render_percent(items, KNOWN, jobs, header)
        if lines:
            output.out("\n".join(lines))
        if not iterate:
            return 0
        output.out(flush=True)
        time.sleep(iterate)


def _check_ids(client: Any, ids: set[str]) -> None:
    """`squeue -j ID` of no job at all is Slurm's error; of a job that has ended, an
    empty list."""
    from mgpu.client.api import RequestError

    for job_id in ids:
        try:
            client.show(job_id)
            return
        except RequestError as e:
            if e.status != 404:
                raise
    raise common.SlurmError("slurm_load_jobs error: Invalid job id specified")
