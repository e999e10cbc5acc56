"""Text and CSV forms of `mgpu history` and `mgpu report` (standard library only)."""

from __future__ import annotations

import csv
import io
import time
from typing import Any

from mgpu.client.render import table
from mgpu.durations import format_duration


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _wait(value: float | None) -> str:
    if value is None or value >= 60:
        return format_duration(value, "clock")
    return f"{value:.1f}s"


def render_history(data: dict[str, Any]) -> str:
    jobs = data.get("jobs") or []
    if not jobs:
        return "(no finished jobs" + _since(data) + ")"
    rows = []
    for j in jobs:
        end = time.strftime("%m-%d %H:%M", time.localtime(j["end_time"])) if j["end_time"] else "-"
        rows.append(
            [
                j["id"],
                (j.get("name") or "")[:20],
                j["user"],
                j["state"],
                str(j["gpus"]),
                ",".join(j.get("nodes") or []) or "-",
                _wait(j.get("wait")),
                format_duration(j.get("runtime"), "clock"),
                _hours(j.get("gpu_hours")),
                "-" if j.get("exit_code") is None else str(j["exit_code"]),
                end,
            ]
        )
    headers = ["JOBID", "NAME", "USER", "STATE", "GPUS", "NODES", "WAIT", "RUNTIME", "GPU-H"]
    headers += ["EXIT", "ENDED"]
    total = sum(j.get("gpu_hours") or 0.0 for j in jobs)
    return table(headers, rows) + f"\n{len(jobs)} job(s), {total:.2f} GPU-hours" + _since(data)


def _since(data: dict[str, Any]) -> str:
    since = data.get("since")
    if not since:
        return ""
    return " since " + time.strftime("%Y-%m-%d %H:%M", time.localtime(since))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def render_report(data: dict[str, Any]) -> str:
    by = data.get("by", "user")
    rows = []
    for r in [*data.get("rows", []), data.get("total")]:
        if not r:
            continue
        rows.append(
            [
                "TOTAL" if r is data.get("total") else r["key"],
                str(r["jobs"]),
                _hours(r["gpu_hours"]),
                _rate(r["success_rate"]),
                _wait(r["mean_wait"]),
                _wait(r["p90_wait"]),
            ]
        )
    headers = [by.upper(), "JOBS", "GPU-HOURS", "SUCCESS", "MEAN WAIT", "P90 WAIT"]
    return table(headers, rows) + "\n" + "finished jobs" + _since(data)


def report_csv(data: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = ["jobs", "completed", "failed", "cancelled", "gpu_hours", "success_rate"]
    cols += ["mean_wait", "p90_wait"]
    w.writerow([data.get("by", "user"), *cols])
    for r in data.get("rows", []):
        w.writerow([r["key"], *("" if r[c] is None else r[c] for c in cols)])
    return buf.getvalue()
