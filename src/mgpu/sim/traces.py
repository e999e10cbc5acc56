"""Reading workload traces: SWF (Parallel Workloads Archive) and a small CSV format.

* **SWF** — `;` header lines, then 18 whitespace-separated fields per job.  Used here:
  1 job number, 2 submit time, 4 run time, 5 allocated processors, 8 requested processors,
  9 requested time (-1 = unknown), 12 user id (all 1-based).  Jobs with a negative run
  time or no processors (neither allocated nor requested) are skipped and counted, as
  archive logs mark cancelled or broken records that way.  Processors map to GPUs one
  to one.  The `; MaxProcs:` header, when present, is kept to size the default cluster.
* **CSV** — a header row naming `submit_time,duration,gpus,user,time_limit` (any order;
  `user` and `time_limit` may be left out or left empty), times in seconds; `gpus` below 1
  (0.25) is a share of one GPU, as `--gpu-share` asks; optional `priority` (as
  `--priority`), `preemptible` (0/1), `reservation` (as `--reservation`, replayed against
  `SimConfig.reservations`), `cpus` (the job's CPUs) and `mem_mb` (its memory: MiB, or a
  size such as `16G`; left empty or out: the cluster's defaults per GPU, `simulator.py`) and
  `dependency` columns too.  A
  dependency is written as `--dependency` is (`afterok:ID[:ID...]`, several joined by `,`
  in a quoted cell), where a job's ID is its line number minus one (the header is line 1,
  so the first job is 1); it must name a job of the file.  A hand-made file, so a malformed
  row is an error naming its line rather than a silent skip; rows asking for 0 GPUs are
  skipped and counted (nothing for a GPU scheduler to place).

Either may be gzipped (detected by its magic bytes, not its name).
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from mgpu.resources import SizeError, parse_size_mb

__all__ = [
    "Trace",
    "TraceError",
    "TraceJob",
    "compress",
    "read_csv",
    "read_swf",
    "read_trace",
    "resample",
]

TraceFormat = Literal["swf", "csv"]
CSV_COLUMNS = ("submit_time", "duration", "gpus", "user", "time_limit")
_OPTIONAL_CSV = ("priority", "preemptible", "dependency", "reservation", "cpus", "mem_mb")
_DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")
_REQUIRED_CSV = ("submit_time", "duration", "gpus")
_SWF_FIELDS = 18
_SHARE_UNITS = 1000
"""`mgpu.scheduler.SHARE_UNITS` (not imported: reading a trace needs no scheduler)."""


class TraceError(ValueError):
    """A trace that cannot be read; the message is one sentence naming the file and line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit: float
    run: float
    """Actual run time in seconds."""
    gpus: int
    user: str
    time_limit: float | None = None
    """Requested time in seconds; None when the trace does not say."""
    priority: int = 0
    preemptible: bool = False
    dependency: tuple[tuple[str, str], ...] = ()
    """(kind, job id) pairs, as `--dependency`: afterok, afterany or afternotok."""
    gpu_share: int = 0
    """A share of one GPU in share units (`mgpu.scheduler.SHARE_UNITS` = a GPU), with
    `gpus=1`; 0 = whole GPUs."""
    reservation: str | None = None
    """`--reservation NAME`."""
    cpus: int | None = None
    """CPUs the job asks for in all (None: the trace does not say)."""
    mem_mb: int | None = None
    """Memory (MiB) the job asks for in all (None: the trace does not say)."""

    @property
    def gpu_amount(self) -> float:
        """GPUs the job holds: its share, or its whole GPUs."""
        return self.gpu_share / _SHARE_UNITS if self.gpu_share else float(self.gpus)


@dataclass(slots=True)
class Trace:
    source: str
    format: TraceFormat
    jobs: list[TraceJob]
    """In submit order (stable for equal submit times)."""
    max_procs: int | None = None
    """The machine's size from the SWF header, if given."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Records left out, by reason."""


def read_trace(path: str | Path, fmt: TraceFormat | None = None) -> Trace:
    """Read an SWF or CSV trace (gzipped or not); the format is sniffed unless given."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"trace file {p} does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"trace file {p} is a directory") from None
    except OSError as e:
        raise TraceError(f"cannot read trace file {p}: {e.strerror or e}") from None
    text = _decode(raw, p)
    lines = text.splitlines()
    chosen = fmt or _sniff(lines, p)
    if chosen == "csv":
        return read_csv(lines, str(p))
    return read_swf(lines, str(p))


def _decode(raw: bytes, p: Path) -> str:
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise TraceError(f"{p} looks gzipped but cannot be decompressed ({e})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")  # old archive logs; only digits matter anyway


def _sniff(lines: list[str], p: Path) -> TraceFormat:
    """SWF or CSV, by the first meaningful line (names lie: `.gz` hides the real suffix)."""
    for line in lines:
        s = line.strip()
        if not s:
            continue
        if s.startswith(";"):
            return "swf"
        if "," in s:
            return "csv"
        if s.split()[0].lstrip("-").isdigit():
            return "swf"
        break
    name = p.name.lower().removesuffix(".gz")
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".swf"):
        return "swf"
    raise TraceError(f"{p} is neither an SWF trace nor a CSV trace with a header row")


# --------------------------------------------------------------------------- SWF


def read_swf(lines: Iterable[str], source: str = "<swf>") -> Trace:
    """Parse SWF lines (see the module docstring)."""
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    max_procs: int | None = None
    for lineno, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith(";"):
            max_procs = _header_procs(s, max_procs)
            continue
        fields = s.split()
        if len(fields) < _SWF_FIELDS:
            raise TraceError(
                f"{source} line {lineno}: an SWF job has {_SWF_FIELDS} fields, found {len(fields)}"
            )
        try:
            number = int(fields[0])
            submit = float(fields[1])
            run = float(fields[3])
            allocated = int(float(fields[4]))
            requested = int(float(fields[7]))
            req_time = float(fields[8])
            user = int(fields[11])
        except (ValueError, OverflowError):
            raise TraceError(f"{source} line {lineno}: SWF fields must be numbers") from None
        if not (math.isfinite(submit) and math.isfinite(run)):
            raise TraceError(f"{source} line {lineno}: submit and run times must be finite")
        procs = allocated if allocated > 0 else requested
        if run < 0:
            skipped["negative run time"] = skipped.get("negative run time", 0) + 1
            continue
        if procs <= 0:
            skipped["no processors"] = skipped.get("no processors", 0) + 1
            continue
        jobs.append(
            TraceJob(
                job_id=str(number),
                submit=submit,
                run=run,
                gpus=procs,
                user=f"u{user}" if user >= 0 else "unknown",
                time_limit=req_time if req_time > 0 else None,
            )
        )
    jobs.sort(key=lambda j: j.submit)
    return Trace(source, "swf", jobs, max_procs, skipped)


def _header_procs(line: str, current: int | None) -> int | None:
    """`; MaxProcs: 128` → 128 (the header's word for the machine's size)."""
    key, _, value = line.lstrip("; \t").partition(":")
    if key.strip().lower() != "maxprocs":
        return current
    try:
        n = int(value.split()[0])
    except (ValueError, IndexError):
        return current
    return n if n > 0 else current


# --------------------------------------------------------------------------- CSV


def read_csv(lines: Iterable[str], source: str = "<csv>") -> Trace:
    """Parse CSV lines: a header row, then one job per row (see the module docstring)."""
    numbered = ((n, line) for n, line in enumerate(lines, 1) if line.strip())
    first = next(numbered, None)
    if first is None:
        raise TraceError(f"{source} is empty")
    columns = _csv_header(first[1], source)
    jobs = [
        (lineno, _csv_job(row, lineno, columns, source))
        for lineno, row in _csv_rows(numbered, len(columns), source)
    ]
    skipped = {str(lineno - 1) for lineno, j in jobs if j is None}
    kept = [j for _, j in jobs if j is not None]
    _check_dependencies(kept, skipped, source)
    kept.sort(key=lambda j: j.submit)
    return Trace(source, "csv", kept, None, {"no GPUs": len(skipped)} if skipped else {})


def _csv_header(line: str, source: str) -> list[str]:
    columns = [c.strip().lower() for c in next(csv.reader([line]))]
    missing = [c for c in _REQUIRED_CSV if c not in columns]
    if missing:
        raise TraceError(
            f"{source} line 1: the header must name {','.join(CSV_COLUMNS)} "
            f"(missing {', '.join(missing)})"
        )
    unknown = [c for c in columns if c not in CSV_COLUMNS + _OPTIONAL_CSV]
    if unknown:
        raise TraceError(f"{source} line 1: unknown column {unknown[0]!r}")
    return columns


def _csv_rows(
    numbered: Iterator[tuple[int, str]], width: int, source: str
) -> Iterator[tuple[int, list[str]]]:
    for lineno, line in numbered:
        if line.lstrip().startswith("#"):
            continue
        row = next(csv.reader(io.StringIO(line)))
        if len(row) != width:
            raise TraceError(f"{source} line {lineno}: expected {width} fields, found {len(row)}")
        yield lineno, [cell.strip() for cell in row]


def _csv_job(row: list[str], lineno: int, columns: list[str], source: str) -> TraceJob | None:
    cell = dict(zip(columns, row, strict=True))
    where = f"{source} line {lineno}"
    submit = _number(cell["submit_time"], "submit_time", where)
    run = _number(cell["duration"], "duration", where)
    if run < 0:
        raise TraceError(f"{where}: duration must not be negative, got {cell['duration']!r}")
    gpus, share = _gpus(cell["gpus"], where)
    limit_text = cell.get("time_limit", "")
    limit = _number(limit_text, "time_limit", where) if limit_text else None
    if limit is not None and limit <= 0:
        limit = None  # as in SWF: a non-positive request means "not given"
    if gpus == 0:
        return None  # no GPUs: nothing for a GPU scheduler to place (counted as skipped)
    return TraceJob(
        job_id=str(lineno - 1),
        submit=submit,
        run=run,
        gpus=gpus,
        user=cell.get("user") or "user",
        time_limit=limit,
        priority=_integer(cell.get("priority") or "0", "priority", where),
        preemptible=_flag(cell.get("preemptible") or "0", where),
        dependency=_dependency(cell.get("dependency", ""), where),
        gpu_share=share,
        reservation=cell.get("reservation") or None,
        cpus=_cpus(cell.get("cpus", ""), where),
        mem_mb=_mem(cell.get("mem_mb", ""), where),
    )


def _cpus(text: str, where: str) -> int | None:
    """The `cpus` cell: a whole number of at least 1, or empty (not said)."""
    if not text:
        return None
    value = _integer(text, "cpus", where)
    if value < 1:
        raise TraceError(f"{where}: cpus must be at least 1, got {text!r}")
    return value


def _mem(text: str, where: str) -> int | None:
    """The `mem_mb` cell: MiB, or a size such as 16G; empty: not said."""
    if not text:
        return None
    try:
        value = parse_size_mb(text)
    except SizeError:
        raise TraceError(
            f"{where}: mem_mb must be MiB or a size such as 16G, got {text!r}"
        ) from None
    if value < 1:
        raise TraceError(f"{where}: mem_mb must be more than 0, got {text!r}")
    return value


def _gpus(text: str, where: str) -> tuple[int, int]:
    """`4` -> (4, 0); `0.25` -> (1, 250): whole GPUs, or a share of one (in share units)."""
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: gpus must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: gpus must not be negative, got {text!r}")
    if 0 < value < 1:
        units = round(value * _SHARE_UNITS)
        if not 0 < units < _SHARE_UNITS:
            raise TraceError(f"{where}: a share of a GPU must be 0.001 to 0.999, got {text!r}")
        return 1, units
    if value != int(value):
        raise TraceError(
            f"{where}: gpus must be a whole number, got {text!r} "
            "(or a share of one GPU below 1, such as 0.25)"
        )
    return int(value), 0


def _dependency(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """`afterok:3:4,afterany:5` → (("afterok", "3"), ("afterok", "4"), ("afterany", "5"))."""
    out: list[tuple[str, str]] = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        kind, _, ids = item.partition(":")
        kind = kind.strip().lower()
        if kind not in _DEPENDENCY_KINDS:
            raise TraceError(
                f"{where}: dependency type {kind!r} is not one of {', '.join(_DEPENDENCY_KINDS)}"
            )
        names = [i.strip() for i in ids.split(":")]
        if not ids.strip() or not all(names):
            raise TraceError(f"{where}: dependency {item!r} names no job (afterok:ID[:ID...])")
        for name in names:
            if (kind, name) not in out:
                out.append((kind, name))
    return tuple(out)


def _check_dependencies(jobs: Sequence[TraceJob], skipped: set[str], source: str) -> None:
    known = {j.job_id for j in jobs}
    for j in jobs:
        for _, target in j.dependency:
            if target in skipped:
                why = "which asks for no GPUs and is skipped"
            elif target not in known:
                why = "which is not a job of the trace (a job's ID is its line number minus one)"
            else:
                continue
            raise TraceError(
                f"{source} line {int(j.job_id) + 1}: dependency on job {target}, {why}"
            )


def _integer(text: str, name: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TraceError(f"{where}: {name} must be a whole number, got {text!r}") from None


def _flag(text: str, where: str) -> bool:
    value = text.lower()
    if value not in ("0", "1", "true", "false", "yes", "no"):
        raise TraceError(f"{where}: preemptible must be 0 or 1, got {text!r}")
    return value in ("1", "true", "yes")


def _number(text: str, name: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {name} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: {name} must be finite, got {text!r}")
    return value


# --------------------------------------------------------------------------- synthetic


def resample(trace: Trace, n: int, seed: int = 1) -> Trace:
    """A deterministic synthetic trace of `n` jobs drawn from `trace`.

    Each job copies (run time, GPUs, user, time limit) from a random job of `trace`, and
    arrives after a gap drawn from the trace's gaps between submissions, so the offered
    load per unit of time matches the original while the trace is as long as wanted.
    """
    if not trace.jobs:
        raise TraceError(f"{trace.source} has no jobs to resample")
    rng = random.Random(seed)
    submits = [j.submit for j in trace.jobs]
    gaps = [b - a for a, b in itertools.pairwise(submits)] or [0.0]
    jobs: list[TraceJob] = []
    now = 0.0
    for i in range(n):
        model = rng.choice(trace.jobs)
        jobs.append(replace(model, job_id=str(i + 1), submit=now))
        now += rng.choice(gaps)
    return Trace(
        f"{trace.source} resampled to {n} jobs (seed {seed})", trace.format, jobs, trace.max_procs
    )


def compress(jobs: Sequence[TraceJob], factor: float) -> list[TraceJob]:
    """The same jobs arriving `factor` times faster (gaps divided by `factor`).

    Archive logs usually ran at a modest load on their machine (NASA's: 47%), so their
    replay barely queues; compressing arrivals raises the offered load by `factor` without
    changing any job — the usual way to compare policies under pressure.
    """
    if factor <= 0:
        raise ValueError("the load factor must be positive")
    if not jobs or factor == 1:
        return list(jobs)
    origin = min(j.submit for j in jobs)
    return [replace(j, submit=origin + (j.submit - origin) / factor) for j in jobs]
