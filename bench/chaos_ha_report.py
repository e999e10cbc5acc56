"""bench/chaos_ha.py's figures: each fault's window (from its start to the next fault's),
what happened in it, and the table.  Every time here is this process's clock or the jobs'
(the machine's), never a master's."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from typing import Any

ROWS_OF_ERRORS = 3
"""Distinct user errors kept per fault, as examples."""


class Windows:
    def __init__(self, starts: list[float], end: float) -> None:
        self.starts = starts
        self.end = end

    def of(self, t: float) -> int | None:
        """The fault whose window holds `t`; None before the first one."""
        k = bisect.bisect_right(self.starts, t) - 1
        return k if k >= 0 and t <= self.end else (len(self.starts) - 1 if k >= 0 else None)


def classify_jobs(
    jobs: list[dict[str, Any]],
    lines: list[tuple[str, str, float]],
    acked_at: dict[str, float],
    end: float,
) -> dict[str, list[tuple[str, float]]]:
    """(job id, when) per verdict: lost (acknowledged, never ended), run_twice (a start
    after a run that ended, or more starts than attempts the master knows started),
    restarted (more than one started attempt: a run the master ended or lost, then ran
    again), relaunched (a launch the master gave up on as undelivered, sent again: one
    run), failed (ended in any state but completed)."""
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    for job_id, kind, t in lines:
        (starts if kind == "start" else ends).setdefault(job_id, []).append(t)
    out: dict[str, list[tuple[str, float]]] = {
        "lost": [], "run_twice": [], "restarted": [], "relaunched": [], "failed": [],
    }  # fmt: skip
    for job in jobs:
        jid = job["id"]
        s, e = sorted(starts.get(jid, [])), sorted(ends.get(jid, []))
        attempts = job.get("attempts") or []
        ran = sum(1 for a in attempts if a.get("start_time") is not None)
        when = s[1] if len(s) > 1 else (s[-1] if s else acked_at.get(jid, end))
        if len(s) > max(1, ran) or (e and any(t > e[0] for t in s)):
            out["run_twice"].append((jid, when))
        elif ran > 1:
            out["restarted"].append((jid, when))
        elif len(attempts) > 1:
            out["relaunched"].append((jid, when))
        if job["state"] in ("queued", "running"):
            out["lost"].append((jid, acked_at.get(jid, end)))
        elif job["state"] != "completed":
            out["failed"].append((jid, s[-1] if s else acked_at.get(jid, end)))
    return out


def per_fault(
    records: list[dict[str, Any]],
    end: float,
    verdicts: dict[str, list[tuple[str, float]]],
    lines: list[tuple[str, str, float]],
    stretches: dict[str, list[dict[str, Any]]],
    calls: list[tuple[str, float, float, str | None]],
    ticks_seen: dict[str, float],
    ticks_all: list[str],
    follow_exits: list[tuple[float, int, str]],
    lost_counts: list[int],
    slow_s: float,
) -> None:
    """Adds each fault's figures to its record."""
    w = Windows([r["t0"] for r in records], end)
    for r in records:
        r["figures"] = {
            "jobs_lost": [], "jobs_run_twice": [], "jobs_restarted": [], "jobs_failed": [],
            "jobs_relaunched": [],
            "nodes_not_online": [], "user_calls": 0, "user_call_longest_s": 0.0,
            "user_slow_or_failed": [],
            "logs_f_exits": [], "logs_f_lag_s": 0.0, "logs_f_missing": 0,
        }  # fmt: skip
    for verdict, found in verdicts.items():
        for jid, t in found:
            k = w.of(t)
            if k is not None:
                records[k]["figures"][f"jobs_{verdict}"].append(jid)
    for node, spans in stretches.items():
        for s in spans:
            k = w.of(s["from"])
            if k is not None:
                span = {"node": node, "s": round(s["to"] - s["from"], 2), "states": s["states"]}
                records[k]["figures"]["nodes_not_online"].append(span)
    for who, t0, took, error in calls:
        k = w.of(t0)
        if k is None:
            continue
        f = records[k]["figures"]
        f["user_calls"] += 1
        f["user_call_longest_s"] = max(f["user_call_longest_s"], took)
        if error is not None or took > slow_s:
            f["user_slow_or_failed"].append({"who": who, "s": took, "error": error})
    for t0, rc, err in follow_exits:
        k = w.of(t0)
        if k is not None:
            records[k]["figures"]["logs_f_exits"].append({"rc": rc, "error": err})
    for line in ticks_all:
        printed = float(line.split()[2])
        k = w.of(printed)
        if k is None or printed > end:  # the follower is stopped at the end
            continue
        f = records[k]["figures"]
        seen = ticks_seen.get(line)
        if seen is None:
            f["logs_f_missing"] += 1
        elif seen - printed > f["logs_f_lag_s"]:
            f["logs_f_lag_s"] = round(seen - printed, 2)
            # which tick and when, from the fault's start: to tell a lag's cause afterwards
            f["logs_f_lag_tick"] = {
                "tick": line.split()[1],
                "printed_after_s": round(printed - records[k]["t0"], 2),
                "seen_after_s": round(seen - records[k]["t0"], 2),
            }
    job_starts = sorted(t for _, kind, t in lines if kind == "start")
    for k, r in enumerate(records):
        upto = records[k + 1]["t0"] if k + 1 < len(records) else end
        inside = [t for t in job_starts if r["t0"] <= t < upto]
        marks = [r["t0"], *inside]
        r["figures"]["longest_without_a_start_s"] = round(
            max((b - a for a, b in itertools.pairwise(marks)), default=upto - r["t0"]),
            2,
        )
        r["figures"]["nodes_declared_lost"] = lost_counts[k + 1] - lost_counts[k]
        r["leader_s"] = None if r.get("ready") is None else round(r["ready"] - r["ref"], 2)


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per kind of fault (its repeats together): the table."""
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        name = r["fault"]
        f = r["figures"]
        row = rows.setdefault(
            name,
            {
                "fault": name, "runs": 0, "caught": 0, "leader_s": [], "stall_s": [],
                "lost": 0, "run_twice": 0, "failed": 0, "restarted": 0, "relaunched": 0,
                "nodes_declared_lost": 0, "node_not_online_stretches": 0,
                "node_not_online_longest_s": 0.0, "user_slow_or_failed": 0, "user_calls": 0,
                "user_call_longest_s": 0.0,
                "logs_f_exits": 0, "logs_f_missing": 0, "logs_f_lag_s": 0.0,
                "not_settled": 0, "load_average": [],
            },
        )  # fmt: skip
        row["runs"] += 1
        row["caught"] += 1 if r.get("caught") else 0
        row["leader_s"].append(r["leader_s"])
        row["stall_s"].append(f["longest_without_a_start_s"])
        for key in ("lost", "run_twice", "failed", "restarted", "relaunched"):
            row[key] += len(f[f"jobs_{key}"])
        row["nodes_declared_lost"] += f["nodes_declared_lost"]
        row["node_not_online_stretches"] += len(f["nodes_not_online"])
        row["node_not_online_longest_s"] = max(
            [row["node_not_online_longest_s"], *(s["s"] for s in f["nodes_not_online"])]
        )
        row["user_slow_or_failed"] += len(f["user_slow_or_failed"])
        row["user_calls"] += f["user_calls"]
        row["user_call_longest_s"] = max(row["user_call_longest_s"], f["user_call_longest_s"])
        row["logs_f_exits"] += len(f["logs_f_exits"])
        row["logs_f_missing"] += f["logs_f_missing"]
        row["logs_f_lag_s"] = max(row["logs_f_lag_s"], f["logs_f_lag_s"])
        row["not_settled"] += 0 if r.get("settled") else 1
        row["load_average"].append(r["load_average"][0])
    return list(rows.values())


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown, one line per fault."""
    head = (
        "| fault | runs | leader after (s) | longest without a job start (s) | lost / twice / "
        "failed / restarted (launches sent again) | nodes declared lost / shown not online "
        "(longest s) | user calls slow or failed (longest s) | `logs -f` exits / missing / "
        "longest lag (s) | load (1 min) |"
    )
    out = [head, "|" + " --- |" * 9]
    for r in rows:
        leader = ", ".join("—" if x is None else f"{x:.1f}" for x in r["leader_s"])
        stall = ", ".join(f"{x:.1f}" for x in r["stall_s"])
        caught = f" ({r['caught']} caught)" if "worst" in r["fault"] else ""
        unsettled = f" ({r['not_settled']} never settled)" if r["not_settled"] else ""
        out.append(
            f"| {r['fault']}{caught}{unsettled} | {r['runs']} | {leader} | {stall} | "
            f"{r['lost']} / {r['run_twice']} / {r['failed']} / {r['restarted']} "
            f"({r['relaunched']}) | "
            f"{r['nodes_declared_lost']} / {r['node_not_online_stretches']} "
            f"({r['node_not_online_longest_s']:.1f}) | "
            f"{r['user_slow_or_failed']} of {r['user_calls']} ({r['user_call_longest_s']:.1f}) | "
            f"{r['logs_f_exits']} / {r['logs_f_missing']} / {r['logs_f_lag_s']:.1f} | "
            f"{min(r['load_average']):.1f}–{max(r['load_average']):.1f} |"
        )
    return "\n".join(out)


def error_examples(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per fault, the most common user errors (who: error)."""
    out: dict[str, list[str]] = {}
    for r in records:
        seen = Counter(
            f"{c['who']}: {c['error'] or 'took ' + str(c['s']) + ' s'}"
            for c in r["figures"]["user_slow_or_failed"]
        )
        if seen:
            out.setdefault(r["fault"], []).extend(
                f"{n} x {text}" for text, n in seen.most_common(ROWS_OF_ERRORS)
            )
    return out


def job_details(
    jobs: list[dict[str, Any]], verdicts: dict[str, list[tuple[str, float]]]
) -> dict[str, Any]:
    """The master's record of every job with a verdict: its state and attempts."""
    named = {jid for found in verdicts.values() for jid, _ in found}
    keys = ("node", "start_time", "end_time", "end_reason", "exit_code")
    return {
        j["id"]: {
            "state": j["state"],
            "reason": j.get("reason"),
            "attempts": [{k: a.get(k) for k in keys} for a in j.get("attempts") or []],
        }
        for j in jobs
        if j["id"] in named
    }
