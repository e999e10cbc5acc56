"""Plain-text tables for the terminal (no heavy imports: the CLI must start fast)."""

from __future__ import annotations

import time

from mgpu import exits
from mgpu.durations import format_duration
from mgpu.safetext import escape_controls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell.  Every cell is escaped first: names, commands,
    reasons and hostnames are other users' text (mgpu.safetext)."""
    headers = [escape_controls(h) for h in headers]
    rows = [[escape_controls(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def where(job: dict[str, Any]) -> str:
    alloc = job.get("allocation") or []
    if job["state"] == "queued" or not alloc:
        return f"({job.get('reason') or 'queued'})"
    parts = []
    share = job.get("gpu_share")
    for a in alloc:
        gpus = ",".join(f"{g}({share:g})" if share else str(g) for g in a["gpu_ids"])
        parts.append(f"{a['node_id']}:{gpus}" if gpus else a["node_id"])
    text = ";".join(parts)
    if job["state"] not in ("queued", "running") and job.get("reason"):
        text += f" ({job['reason']})"
    return text


def _job_row(job: dict[str, Any], now: float) -> list[str]:
    start = job.get("start_time")
    end = job.get("end_time") or now
    elapsed = format_duration(end - start, "clock") if start else "-"
    prio = job.get("priority_value")
    return [
        job["id"],
        (job.get("name") or "")[:20],
        job["user"],
        job["state"] + (" (idle)" if job.get("idle") else ""),
        f"{job['gpu_share']:g}" if job.get("gpu_share") else str(job["gpus"]),
        f"{prio:.0f}" if isinstance(prio, int | float) else "-",
        elapsed,
        start_in(job.get("expected_start"), now) if job["state"] == "queued" else "",
        where(job),
    ]


def start_in(expected: float | None, now: float) -> str:
    """A queued job's estimated start, relative: `now`, `in 12m`, `in 1h 20m`, `-` if none."""
    if not expected:
        return "-"
    wait = expected - now
    if wait < 30:
        return "now"
    return "in " + format_duration(max(1, round(wait / 60)) * 60)  # to the minute


def explain_wait(job: dict[str, Any]) -> str | None:
    """What a queued job waits for, from the planner's `waiting_on` and `expected_start`:
    `2 GPUs held by jobs 1a2b3c4d, 5e6f7a8b until ~14:05; reservation course-a`."""
    held = job.get("waiting_on") or []
    expected = job.get("expected_start")
    if not held or not expected:
        return None
    jobs = [h for h in held if not h.startswith("reservation:")]
    reservations = [h.split(":", 1)[1] for h in held if h.startswith("reservation:")]
    need = (
        f"{job['gpu_share']:g} of a GPU"
        if job.get("gpu_share")
        else ("1 GPU" if job["gpus"] == 1 else f"{job['gpus']} GPUs")
    )
    until = time.strftime("%H:%M", time.localtime(expected))
    parts = []
    if jobs:
        word = "job" if len(jobs) == 1 else "jobs"
        parts.append(f"{need} held by {word} {', '.join(jobs)} until ~{until}")
    for name in reservations:
        parts.append(f"reservation {name} until ~{until}")
    return "; ".join(parts)


def render_queue(data: dict[str, Any]) -> str:
    return "\n".join(
        ["Jobs:", render_jobs(data["jobs"]), "", "Nodes:", render_nodes(data["nodes"])]
    )


def render_jobs(jobs: list[dict[str, Any]]) -> str:
    now = time.time()
    rows = []
    folded: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        if job.get("array_tasks"):  # folded by the master already
            row = _job_row(job, now)
            row[0] = f"{job['array_job_id']}_[{job['array_tasks']}]"
            rows.append(row)
            continue
        # Pending tasks of one array fold into one line, as squeue does.
        if job["state"] == "queued" and job.get("array_job_id"):
            folded.setdefault(job["array_job_id"], []).append(job)
            continue
        rows.append(_job_row(job, now))
    for array_id, tasks in folded.items():
        first = tasks[0]
        ids = [t["array_task_id"] for t in tasks]
        row = _job_row(first, now)
        row[0] = f"{array_id}_[{_ranges(ids)}]"
        rows.append(row)
    headers = ["JOBID", "NAME", "USER", "STATE", "GPUS", "PRIO", "TIME", "START"]
    headers.append("NODES (REASON)")
    if any(job.get("cpus") or job.get("mem_mb") or job.get("resources") for job in jobs):
        # CPUs and memory per node, where some job holds or asks for them (hidden for a
        # lab whose jobs ask nothing: its queue looks as it always has)
        headers[5:5] = ["CPUS", "MEM"]
        for job, row in zip(_listed(jobs), rows, strict=True):
            row[5:5] = [job_cpus(job), job_mem(job)]
    return table(headers, rows) if rows else "  (no jobs)"


def _listed(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs in the order `render_jobs` makes its rows (a folded array: its first)."""
    out: list[dict[str, Any]] = []
    folded: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if not job.get("array_tasks") and job["state"] == "queued" and job.get("array_job_id"):
            folded.setdefault(job["array_job_id"], job)
        else:
            out.append(job)
    return out + list(folded.values())


def mem_text(mb: int) -> str:
    """Slurm's way: `8G`, `1500M`."""
    return f"{mb // 1024}G" if mb and mb % 1024 == 0 else f"{mb}M"


def job_cpus(job: dict[str, Any]) -> str:
    """CPUs per node: what it holds, else what it asks (`-`: none, it shares its node's)."""
    if job.get("cpus"):
        return str(job["cpus"])
    ask = job.get("resources") or {}
    if ask.get("exclusive"):
        return "all"
    gpus = job.get("gpus_per_node") or job.get("gpus") or 0
    cpus = (ask.get("cpus_per_node") or 0) + (ask.get("cpus_per_gpu") or 0) * gpus
    return str(cpus) if cpus else "-"


def job_mem(job: dict[str, Any]) -> str:
    """Memory per node, as `job_cpus`."""
    if job.get("mem_mb"):
        return mem_text(job["mem_mb"])
    ask = job.get("resources") or {}
    if ask.get("exclusive") or ask.get("mem_per_node_mb") == 0:
        return "all"
    if ask.get("mem_per_node_mb"):
        return mem_text(ask["mem_per_node_mb"])
    if ask.get("mem_per_gpu_mb"):
        return f"{mem_text(ask['mem_per_gpu_mb'])}/GPU"
    if ask.get("mem_per_cpu_mb"):
        return f"{mem_text(ask['mem_per_cpu_mb'])}/CPU"
    return "-"


def render_array(array: dict[str, Any]) -> str:
    """`mgpu show ARRAY_ID`: its tasks by state, then the ones listed (the first 1,000)."""
    counts = array.get("counts")
    if counts is None:  # a master from before the counts: every task is listed
        counts = {}
        for task in array["tasks"]:
            counts[task["state"]] = counts.get(task["state"], 0) + 1
    total = sum(counts.values())
    by_state = ", ".join(f"{n} {state}" for state, n in counts.items())
    lines = [escape_controls(f"Array {array['array_job_id']}: {total} tasks ({by_state})")]
    lines.append(render_jobs(array["tasks"]))
    more = array.get("more") or 0
    if more:
        lines.append(f"... and {more} more tasks (mgpu show {array['array_job_id']} --all)")
    return "\n".join(lines)


def _ranges(ids: list[int]) -> str:
    ids = sorted(ids)
    parts = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def render_nodes(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "  (no nodes; start one with `mgpu node --node-id node001`)"
    rows = []
    for n in nodes:
        gpus = n.get("gpus") or []
        busy = sum(1 for g in gpus if g.get("busy_job") or g.get("shared_jobs"))
        foreign = [g for g in gpus if g.get("foreign_blocked") and not g.get("busy_job")]
        state = n["state"] + ("" if n.get("connected", True) else "*")
        util, mem = _gpu_use(gpus)
        reason = [n.get("reason") or ""]
        if n.get("kubernetes"):  # a Kubernetes Node: the other Pods that hold its GPUs
            reason += [_pod_note(p) for p in n.get("pods") or [] if p.get("gpus")]
        else:
            reason += [_foreign_note(n["node_id"], g) for g in foreign]
        reason += [shared_note(g) for g in gpus if g.get("shared_jobs")]
        reason.append(_shares_note(gpus))
        if n.get("run_as_user"):  # a non-root agent cannot switch users
            reason.append(f"jobs run as {n['run_as_user']}")
        rows.append(
            [
                n["node_id"],
                state,
                str(len(gpus)),
                str(len(gpus) - busy - len(foreign)),
                str(busy),
                util,
                mem,
                (gpus[0]["name"] if gpus else "-")[:28],
                n.get("hostname") or "-",
                n.get("ip") or "-",
                "; ".join(r for r in reason if r),
            ]
        )
    headers = ["NODE", "STATE", "GPUS", "FREE", "BUSY", "UTIL", "MEM", "GPU TYPE", "HOSTNAME"]
    headers += ["IP", "REASON"]
    if any(n.get("cpus") is not None or n.get("mem_mb") is not None for n in nodes):
        headers[7:7] = ["CPUS", "RAM"]  # free/offered, as the node says them
        for n, row in zip(nodes, rows, strict=True):
            row[7:7] = _node_cpus_mem(n)
    if any(n.get("features") for n in nodes):  # container runtimes (for --image jobs)
        headers.insert(-1, "FEATURES")
        for n, row in zip(nodes, rows, strict=True):
            row.insert(-1, ",".join(n.get("features") or []) or "-")
    return table(headers, rows)


def _node_cpus_mem(node: dict[str, Any]) -> list[str]:
    """`free/offered` CPUs and memory (`-` where the node does not say)."""
    cpus = node.get("cpus")
    cpu = f"{node.get('cpus_free', 0)}/{cpus}" if cpus is not None else "-"
    mem = node.get("mem_mb")
    free = node.get("mem_free_mb") or 0
    ram = f"{free / 1024:.0f}/{mem / 1024:.0f}G" if mem is not None else "-"
    return [cpu, ram]


def _gpu_use(gpus: list[dict[str, Any]]) -> tuple[str, str]:
    """Mean utilisation and memory used/total of a node's GPUs, from their telemetry."""
    tels = [g["telemetry"] for g in gpus if g.get("telemetry")]
    utils = [t["utilization_pct"] for t in tels if t.get("utilization_pct") is not None]
    used = [t["memory_used_mb"] for t in tels if t.get("memory_used_mb") is not None]
    total = sum(t.get("memory_total_mb") or 0 for t in tels)
    util = f"{sum(utils) / len(utils):.0f}%" if utils else "-"
    mem = f"{sum(used) / 1024:.0f}/{total / 1024:.0f}G" if used and total else "-"
    return util, mem


def shared_note(gpu: dict[str, Any]) -> str:
    """`GPU 0 shared: 0.75 used by 3 jobs`."""
    tenants = gpu.get("shared_jobs") or []
    used = gpu.get("share_used") or sum(t["share"] for t in tenants)
    jobs = "1 job" if len(tenants) == 1 else f"{len(tenants)} jobs"
    return f"GPU {gpu['index']} shared: {used:g} used by {jobs}"


def _pod_note(pod: dict[str, Any]) -> str:
    """`pod default/train holds 2 GPUs (Running)`: another workload's Pod on a Node."""
    gpus = int(pod["gpus"])
    return f"pod {pod['name']} holds {gpus} GPU{'' if gpus == 1 else 's'} ({pod.get('phase')})"


def _foreign_note(node_id: str, gpu: dict[str, Any]) -> str:
    """`GPU 0 is used outside mgpu (3.0 GiB, pid 679, user bob)` (the row names the node)."""
    from mgpu.gpuuse import outside_use

    return outside_use(node_id, gpu["index"], gpu.get("telemetry")).removeprefix(f"{node_id} ")


def _shares_note(gpus: list[dict[str, Any]]) -> str:
    """Said where the node's agent says GPU shares are not held to their limits (no MPS)."""
    said = [(g.get("telemetry") or {}).get("shares_enforced") for g in gpus]
    return "GPU shares not enforced (no MPS)" if False in said else ""


def render_job(job: dict[str, Any]) -> str:
    now = time.time()
    lines = [
        f"Job {job['id']}" + (f" ({job['name']})" if job.get("name") else ""),
        f"  user:       {job['user']}",
        f"  state:      {job['state']}" + (f" ({job['reason']})" if job.get("reason") else ""),
        f"  command:    {job['command']}",
        f"  gpus:       {job['gpus']}"
        + (f" (a share of {job['gpu_share']:g})" if job.get("gpu_share") else ""),
        f"  exit code:  {_exit(job['exit_code'])}",
        f"  submitted:  {_ts(job['submit_time'])}",
        f"  started:    {_ts(job.get('start_time'))}",
        f"  ended:      {_ts(job.get('end_time'))}",
    ]
    if job.get("time_limit"):
        lines.append(f"  time limit: {format_duration(job['time_limit'], 'clock')}")
    if job.get("start_time"):
        end = job.get("end_time") or now
        lines.append(f"  elapsed:    {format_duration(end - job['start_time'], 'clock')}")
    lines.append(f"  retries:    {job['retries']} of {job.get('max_retries', '-')}")
    lines += _job_control_lines(job)
    if job.get("gpu_util_mean") is not None or job.get("gpu_memory_peak_mb") is not None:
        util, peak = job.get("gpu_util_mean"), job.get("gpu_memory_peak_mb")
        lines.append(
            f"  gpu use:    mean {'-' if util is None else f'{util:.0f}%'} utilisation, "
            f"peak {'-' if peak is None else f'{peak} MB'} memory"
        )
    oom = job.get("end_reason") == "out_of_memory"
    if job.get("max_rss_mb") is not None or oom:
        peak = job.get("max_rss_mb")
        oom_text = ", out of memory: killed at its limit" if oom else ""
        lines.append(f"  memory:     peak {'-' if peak is None else f'{peak} MB'}{oom_text}")
    if job.get("idle"):
        lines.append(f"  idle:       yes, GPUs near 0% since {_ts(job.get('idle_since'))}")
    factors = job.get("priority_factors")
    if job.get("priority_value") is not None:
        detail = ""
        if factors:
            detail = " = " + " + ".join(f"{k} {v:.0f}" for k, v in factors.items())
        lines.append(f"  priority:   {job['priority_value']:.0f}{detail}")
    if job.get("reservation"):
        lines.append(f"  reservation: {job['reservation']}")
    lines += _cpu_mem_lines(job)
    if job.get("expected_start"):
        when = start_in(job["expected_start"], now)
        lines.append(f"  expected start: {_ts(job['expected_start'])} ({when})")
        waits = explain_wait(job)
        if waits:
            lines.append(f"  waits for:  {waits}")
    for a in job.get("allocation") or []:
        gpus = ",".join(map(str, a["gpu_ids"])) or "none"
        held = {True: "  share enforced", False: "  share NOT enforced (no MPS limits)"}
        lines.append(
            f"  ran on:     {a['node_id']} GPUs {gpus}  host {a.get('hostname') or '-'}"
            f"  ip {a.get('ip') or '-'}  pid {a.get('pid') or '-'}"
            + (f"  cpus {_ranges(a['cpu_ids'])}" if a.get("cpu_ids") else "")
            + (f"  mem {mem_text(a['mem_mb'])}" if a.get("mem_mb") else "")
            + held.get(a.get("share_enforced"), "")
        )
    for pod in job.get("pods") or []:  # a Kubernetes partition's job
        lines.append(f"  pod:        {pod['name']}  node {pod.get('node') or '-'}  {pod['phase']}")
    attempts = job.get("attempts") or []
    if attempts:
        lines.append("  attempts:")
        for i, at in enumerate(attempts, 1):
            nodes = ",".join(at["nodes"])
            span = f"start {_ts(at.get('start_time'))}  end {_ts(at.get('end_time'))}"
            lines.append(f"    {i}. {nodes}  {span}  {at.get('end_reason') or ''}".rstrip())
    # Each line is one line: a name, command or reason cannot add lines or escapes.
    return "\n".join(escape_controls(line) for line in lines)


def _cpu_mem_lines(job: dict[str, Any]) -> list[str]:
    """CPUs and memory per node (held, else asked) and the peak memory, where any."""
    lines = []
    cpus, mem = job_cpus(job), job_mem(job)
    if cpus != "-" or mem != "-":
        held = "" if job.get("cpus") or job.get("mem_mb") else " (asked)"
        cpu_text = "CPUs shared" if cpus == "-" else f"{cpus} CPUs"
        mem_shown = "memory shared" if mem == "-" else f"{mem} memory"
        lines.append(f"  per node:   {cpu_text}, {mem_shown}{held}")
    if job.get("max_rss_mb") is not None:
        lines.append(f"  max rss:    {mem_text(job['max_rss_mb'])}")
    return lines


def _job_control_lines(job: dict[str, Any]) -> list[str]:
    """Restarts, --signal, --notify, the job script and where its options came from."""
    lines = []
    if job.get("restart_count"):
        lines.append(f"  restarts:   {job['restart_count']}")
    if job.get("held"):
        lines.append(f"  held:       by {job.get('held_by') or '-'} (mgpu release {job['id']})")
    if job.get("signal"):
        lines.append(f"  signal:     {job['signal']} (seconds before the time limit)")
    if job.get("notify"):
        lines.append(f"  notify:     {job['notify']}")
    if job.get("script_name"):
        lines.append(f"  script:     {job['script_name']} (sent with the job)")
    sources = job.get("option_sources") or {}
    if sources:
        by: dict[str, list[str]] = {}
        for option, source in sorted(sources.items()):
            by.setdefault(source, []).append("--" + option.replace("_", "-"))
        # Lowest precedence first, as they were applied: the script's lines, then the CLI.
        rank = {"#SBATCH": 0, "#MGPU": 1, "command line": 2}
        order = sorted(by, key=lambda src: rank.get(src, 3))
        shown = "; ".join(f"{src}: {', '.join(by[src])}" for src in order)
        lines.append(f"  options:    {shown}; the rest: defaults")
    return lines


def _ts(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def render_tokens(tokens: list[dict[str, Any]]) -> str:
    rows = [
        [
            t["id"],
            t["user"],
            t["kind"],
            "yes" if t["admin"] else "",
            "yes" if t.get("owner") else "",
            "yes" if t.get("allow_root") else "",
            _ts(t["created"]),
            _ts(t["revoked"]) if t.get("revoked") else "",
        ]
        for t in tokens
    ]
    headers = ["ID", "USER", "KIND", "ADMIN", "OWNER", "ALLOW ROOT", "CREATED", "REVOKED"]
    return table(headers, rows)


def render_events(events: list[dict[str, Any]]) -> str:
    rows = [
        [
            _ts(e["time"]),
            e["kind"],
            e.get("actor") or "-",
            e.get("address") or "-",
            e.get("target") or "",
            (e.get("detail") or "")[:60],
        ]
        for e in reversed(events)
    ]
    return table(["TIME", "EVENT", "WHO", "FROM", "TARGET", "DETAIL"], rows)


def parse_since(text: str) -> float:
    """ "7d", "12h", "30m", "90s" -> an absolute time that far back."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return time.time() - float(text[:-1]) * units[text[-1]]
        return time.time() - float(text) * 86400
    except ValueError:
        from mgpu.client.api import MgpuError

        raise MgpuError(f"--since {text!r} is not a duration like 7d, 12h or 30m") from None


def _exit(code: int | None) -> str:
    """`mgpu show`'s exit code: `3`, `killed by signal 9 (SIGKILL)`, `-`."""
    if code is None:
        return "-"
    return exits.describe(code) if code < 0 else str(code)
