"""What Slurm did against what mgpu did: normalised, then compared field by field.

A difference is a key (`env:SLURM_GTIDS`, `sacct:.batch:NodeList`, `files:slurm-4.out`,
...) with both sides' values; intended.py says which keys are intended (or known mgpu
bugs) and why.  Normalised away, because they differ between any two runs of the same
job: the submit directory (each system's own), process ids, times, and which of a node's
GPUs a job got (its devices are relabelled in order of first use, per node).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any

from runner import Outcome

HOST = socket.gethostname()
PID_VARS = ("SLURM_TASK_PID", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT")
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$")
DURATION = re.compile(r"^(\d+-)?\d\d:\d\d:\d\d$")


@dataclass(frozen=True)
class Difference:
    key: str
    slurm: Any
    mgpu: Any

    def __str__(self) -> str:
        return f"{self.key}: slurm {self.slurm!r}, mgpu {self.mgpu!r}"


class Normaliser:
    """One outcome's values in a form both systems' runs of the same job share."""

    def __init__(self, out: Outcome) -> None:
        self.work = str(out.workdir)
        self.root = str(out.workdir.parent)
        self._gpus: dict[str, dict[str, str]] = {}
        """Per node: each device index seen, in order of first use -> g0, g1..."""
        lists = [job.get("NodeList", "") for job in out.jobs.values()]
        lists = [n for n in lists if n not in ("", "(null)")]  # jobs that never ran
        self.one_node = bool(lists) and all(re.fullmatch(r"node\d+", n) for n in lists)
        """Each of the case's jobs ran on one node: which one is the scheduler's choice
        (two clusters busy with other jobs choose differently): named `<NODE>`."""

    def text(self, value: str) -> str:
        value = value.replace(self.work, "<WORK>").replace(self.root, "<ROOT>")
        if self.one_node:
            # mgpu names a node by its host name where that is unambiguous: here several
            # agents share this machine's (intended.NODE_NAMES).
            value = re.sub(rf"\b(node\d+|{re.escape(HOST)})\b", "<NODE>", value)
        return value

    def gpus(self, node: str, value: str) -> str:
        labels = self._gpus.setdefault(node, {})
        out = []
        for dev in value.split(","):
            if dev.strip().isdigit():
                dev = labels.setdefault(dev, f"g{len(labels)}")
            out.append(dev)
        return ",".join(out)

    def env(self, env: dict[str, str]) -> dict[str, str]:
        node = env.get("SLURMD_NODENAME", "?")
        out = {}
        for key, value in sorted(env.items()):
            if key in PID_VARS and value.isdigit():
                value = "<PID>"
            elif key in GPU_VARS:
                value = self.gpus(node, value)
            out[key] = self.text(value)
        return out

    def field(self, value: str) -> str:
        value = self.text(value)
        if TIME.match(value):
            return "<TIME>"
        if DURATION.match(value):
            return "<DURATION>"
        return value


def _records(out: Outcome, norm: Normaliser) -> dict[str, dict[str, Any]]:
    records = {}
    # Devices are labelled in the order the records are read: by label, then procid.
    for name, rec in sorted(out.records.items()):
        records[name] = {
            "argv": rec["argv"],
            "cwd": norm.text(str(rec["cwd"])),
            "env": norm.env(dict(rec["env"])),  # type: ignore[call-overload]
        }
    return records


def _lines(text: str, unordered: bool) -> list[str]:
    lines = text.splitlines()
    return sorted(lines) if unordered else lines


DIAGNOSTIC = re.compile(r"^(srun|slurmstepd(-\S+)?): ")
"""A line srun or slurmstepd writes into the job's output about the job (not the job's)."""


def _split(lines: list[str]) -> tuple[list[str], list[str]]:
    """(srun's and slurmstepd's own lines, the job's lines), each in order."""
    diag = [line for line in lines if DIAGNOSTIC.match(line)]
    return diag, [line for line in lines if not DIAGNOSTIC.match(line)]


def compare(
    slurm: Outcome, mgpu: Outcome, unordered: bool = False, racy: tuple[str, ...] = ()
) -> list[Difference]:
    """Every difference between the two outcomes of one case."""
    diffs: list[Difference] = []
    ns, nm = Normaliser(slurm), Normaliser(mgpu)

    for i, (s, m) in enumerate(zip(slurm.submits, mgpu.submits, strict=True)):
        if s[0] != m[0]:
            diffs.append(Difference(f"submit{i}:status", s[0], m[0]))
        if s[1] != m[1]:
            diffs.append(Difference(f"submit{i}:stdout", s[1], m[1]))
        if s[2] != m[2]:
            diffs.append(Difference(f"submit{i}:stderr", s[2], m[2]))

    rs, rm = _records(slurm, ns), _records(mgpu, nm)
    for name in sorted(rs.keys() | rm.keys()):
        if name not in rm or name not in rs:
            diffs.append(Difference(f"record:{name}", name in rs, name in rm))
            continue
        a, b = rs[name], rm[name]
        for what in ("argv", "cwd"):
            if a[what] != b[what]:
                diffs.append(Difference(f"{what}:{name}", a[what], b[what]))
        for var in sorted(a["env"].keys() | b["env"].keys()):
            va, vb = a["env"].get(var), b["env"].get(var)
            if va != vb:
                diffs.append(Difference(f"env:{var}", va, vb))

    for name in sorted(slurm.files.keys() | mgpu.files.keys()):
        if name not in slurm.files or name not in mgpu.files:
            diffs.append(Difference(f"file:{name}", name in slurm.files, name in mgpu.files))
            continue
        a_diag, a_lines = _split(_lines(ns.text(slurm.files[name]), unordered))
        b_diag, b_lines = _split(_lines(nm.text(mgpu.files[name]), unordered))
        if a_lines != b_lines:
            diffs.append(Difference(f"content:{name}", a_lines, b_lines))
        if a_diag != b_diag:
            diffs.append(Difference(f"diagnostics:{name}", a_diag, b_diag))

    diffs += _compare_rows(slurm, mgpu, ns, nm)
    for job_id in sorted(slurm.jobs.keys() | mgpu.jobs.keys()):
        a_job, b_job = slurm.jobs.get(job_id, {}), mgpu.jobs.get(job_id, {})
        for key in sorted(a_job.keys() | b_job.keys()):
            va = ns.field(a_job[key]) if key in a_job else None
            vb = nm.field(b_job[key]) if key in b_job else None
            if va != vb:
                diffs.append(Difference(f"scontrol:{key}", va, vb))
    diffs = [d for d in diffs if d.key not in racy and d.key.removeprefix("env:") not in racy]
    # One difference per key: the same variable differing in every task is one finding.
    unique: dict[str, Difference] = {}
    for d in diffs:
        unique.setdefault(d.key, d)
    return list(unique.values())


def _compare_rows(
    slurm: Outcome, mgpu: Outcome, ns: Normaliser, nm: Normaliser
) -> list[Difference]:
    """sacct's lines, matched by JobID: a job's, its `.batch`, its steps `.0`, `.1`..."""
    diffs = []
    if not slurm.sacct and not mgpu.sacct:
        return diffs
    a_rows = {r["JobID"]: r for r in slurm.sacct}
    b_rows = {r["JobID"]: r for r in mgpu.sacct}
    for job_id in sorted(a_rows.keys() | b_rows.keys()):
        suffix = job_id.split(".", 1)[1] if "." in job_id else "job"
        suffix = "step" if suffix.isdigit() else suffix
        if job_id not in a_rows or job_id not in b_rows:
            diffs.append(
                Difference(f"sacct:{suffix}:row {job_id}", job_id in a_rows, job_id in b_rows)
            )
            continue
        for field, va in a_rows[job_id].items():
            na, nb = ns.field(va), nm.field(b_rows[job_id].get(field, ""))
            if na != nb:
                diffs.append(Difference(f"sacct:{suffix}:{field}", na, nb))
    order_a = [r["JobID"] for r in slurm.sacct]
    order_b = [r["JobID"] for r in mgpu.sacct]
    if order_a != order_b and set(order_a) == set(order_b):
        diffs.append(Difference("sacct:order", order_a, order_b))
    return diffs
