"""Parsing and validation of the user-facing job option strings.

Everything here is pure (no I/O, no clock) and raises `SpecError` — a `ValueError` whose
message is one sentence a user can act on, naming the bad value — so that the CLI can print
``mgpu: error: <message>`` and the master can answer 400 with the same text.

Decisions where Slurm is loose or silent:

* ``--time``: ``UNLIMITED``/``infinite`` (any case) mean no limit and parse to
  ``math.inf``.  ``0`` is refused (Slurm reads it as "no limit", which surprises people);
  use ``UNLIMITED`` instead.  A bare number may have a fraction (``0.5`` = 30 s).  Fields
  after the first must be in range (minutes and seconds below 60, hours below 24 once days
  are given).
* GPU id lists are returned sorted with duplicates removed silently.
* ``--node-gpu-ids`` keeps the nodes in the order given (the first node is rank 0).
* Node lists expand Slurm hostlist ranges and keep the first occurrence of each name.
* Job ids are normalised to lower case.
* Text that reaches a program must be valid UTF-8 without NUL (`validate_text`): a lone
  surrogate (how Python carries a non-UTF-8 byte) cannot be encoded for the wire, a NUL
  cannot be passed to `execve`.  argv, the environment and paths: `mgpu.execspec`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from mgpu import hostlist
from mgpu.durations import format_duration
from mgpu.hostlist import HostlistError

__all__ = [
    "FIRST_JOB_ID",
    "JOB_ID_HINT",
    "MAX_ARRAY_INDEX",
    "MAX_ARRAY_TASKS",
    "MAX_COMMAND_BYTES",
    "MAX_GPU_INDEX",
    "MAX_JOB_NAME_CHARS",
    "MAX_NODE_LIST",
    "ArraySpec",
    "Dependency",
    "DependencyKind",
    "SpecError",
    "array_task_id",
    "format_array",
    "format_job_id",
    "format_time_limit",
    "is_job_id",
    "is_task_id",
    "job_number",
    "may_be_array_id",
    "parse_array",
    "parse_dependency",
    "parse_gpu_count",
    "parse_gpu_ids",
    "parse_int_option",
    "parse_node_count",
    "parse_node_gpu_ids",
    "parse_node_list",
    "parse_time_limit",
    "split_array_task_id",
    "task_job_number",
    "text_problem",
    "validate_command",
    "validate_job_id",
    "validate_job_name",
    "validate_node_id",
    "validate_text",
]

MAX_GPU_INDEX: Final = 1023
"""Largest GPU index accepted in a spec (the master checks the node's real range)."""
MAX_GPUS: Final = 65536
"""Largest `--gpus` count accepted syntactically."""
MAX_NODES: Final = 4096
MAX_NODE_LIST: Final = hostlist.MAX_HOSTS
"""Most node names a hostlist expression may expand to."""
MAX_ARRAY_TASKS: Final = 100000
MAX_ARRAY_INDEX: Final = 9_999_999
MAX_JOB_NAME_CHARS: Final = 128
MAX_COMMAND_BYTES: Final = 64 * 1024
MAX_NODE_ID_CHARS: Final = 64

DependencyKind = Literal["afterok", "afterany", "afternotok"]
_DEPENDENCY_KINDS: Final[tuple[DependencyKind, ...]] = ("afterok", "afterany", "afternotok")


class SpecError(ValueError):
    """A user-supplied option value is malformed; the message is one clear sentence."""


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """A parsed `--array` value."""

    indices: tuple[int, ...]
    """Task indices, sorted and unique."""
    max_running: int | None = None
    """At most this many tasks run at once (`%N`); None = no cap."""


@dataclass(frozen=True, slots=True)
class Dependency:
    """One `--dependency` condition: `job_id` must end as `kind` says."""

    kind: DependencyKind
    job_id: str


def _q(text: str, limit: int = 60) -> str:
    """Quote a user value for a message, shortened and with control characters escaped."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return repr(text)


# --------------------------------------------------------------------------- time limits

_TIME_HINT: Final = "use minutes (90), MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_UNLIMITED: Final = frozenset({"unlimited", "infinite", "inf"})
_FIELD: Final = r"([0-9]{1,9})"
_BARE_MINUTES_RE: Final = re.compile(r"([0-9]{1,9})(?:\.([0-9]{1,6}))?")
_CLOCK_RE: Final = re.compile(rf"{_FIELD}(?::{_FIELD}(?::{_FIELD})?)?")
_DAYS_RE: Final = re.compile(rf"{_FIELD}-{_FIELD}(?::{_FIELD}(?::{_FIELD})?)?")


def parse_time_limit(text: str) -> float:
    """Parse a Slurm-style `--time` value into seconds.

    ``90`` (minutes), ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``;
    ``UNLIMITED``/``infinite`` give ``math.inf``.  Zero and negative limits are refused.
    """
    raw = text
    text = text.strip()
    if not text:
        raise SpecError(f"the time limit is empty; {_TIME_HINT}")
    if text.lower() in _UNLIMITED:
        return math.inf
    if text.startswith("-"):
        raise SpecError(f"time limit {_q(raw)} is negative; a time limit must be positive")

    seconds: float
    if m := _BARE_MINUTES_RE.fullmatch(text):
        whole, frac = m.group(1), m.group(2) or "0"
        seconds = (int(whole) + float("0." + frac)) * 60.0
    elif m := _DAYS_RE.fullmatch(text):
        days, hours = int(m.group(1)), int(m.group(2))
        minutes = int(m.group(3) or 0)
        secs = int(m.group(4) or 0)
        if hours >= 24:
            raise SpecError(f"time limit {_q(raw)} has {hours} hours after the days; use 0-23")
        _check_sexagesimal(raw, minutes, secs)
        seconds = float(((days * 24 + hours) * 60 + minutes) * 60 + secs)
    elif m := _CLOCK_RE.fullmatch(text):
        if m.group(3) is None:  # MM:SS
            minutes, secs = int(m.group(1)), int(m.group(2))
            _check_sexagesimal(raw, 0, secs)
            seconds = float(minutes * 60 + secs)
        else:  # HH:MM:SS
            hours, minutes, secs = int(m.group(1)), int(m.group(2)), int(m.group(3))
            _check_sexagesimal(raw, minutes, secs)
            seconds = float((hours * 60 + minutes) * 60 + secs)
    else:
        raise SpecError(f"time limit {_q(raw)} is not understood; {_TIME_HINT}")

    if seconds <= 0:
        raise SpecError(
            f"time limit {_q(raw)} is zero; give a positive limit, or UNLIMITED for none"
        )
    return seconds


def _check_sexagesimal(raw: str, minutes: int, secs: int) -> None:
    if minutes >= 60:
        raise SpecError(f"time limit {_q(raw)} has {minutes} minutes in a field; use 0-59")
    if secs >= 60:
        raise SpecError(f"time limit {_q(raw)} has {secs} seconds in a field; use 0-59")


def format_time_limit(seconds: float | None) -> str:
    """Format seconds the way Slurm shows limits: ``[D-]HH:MM:SS``, or ``UNLIMITED``."""
    return format_duration(seconds, "limit")


# --------------------------------------------------------------------------- integers


def parse_int_option(
    value: int | str,
    option: str,
    *,
    minimum: int = 0,
    maximum: int | None = None,
) -> int:
    """Parse an integer option value (``--gpus``, ``--retries`` ...) within bounds."""
    if isinstance(value, bool):
        raise SpecError(f"{option} needs a whole number, not {value}")
    if isinstance(value, int):
        number = value
    else:
        stripped = value.strip()
        if not re.fullmatch(r"[+-]?[0-9]{1,12}", stripped):
            raise SpecError(f"{option} needs a whole number, not {_q(value)}")
        number = int(stripped)
    if number < minimum:
        if minimum == 0:
            raise SpecError(f"{option} must not be negative (got {number})")
        raise SpecError(f"{option} must be at least {minimum} (got {number})")
    if maximum is not None and number > maximum:
        raise SpecError(f"{option} must be at most {maximum} (got {number})")
    return number


def parse_gpu_count(value: int | str, option: str = "--gpus") -> int:
    """A GPU count: 0 (CPU-only job) or more."""
    return parse_int_option(value, option, minimum=0, maximum=MAX_GPUS)


def parse_node_count(value: int | str, option: str = "--nodes") -> int:
    """A node count: 1 or more."""
    return parse_int_option(value, option, minimum=1, maximum=MAX_NODES)


# --------------------------------------------------------------------------- GPU ids

_INT_OR_RANGE_RE: Final = re.compile(r"([0-9]{1,9})(?:\s*-\s*([0-9]{1,9}))?")


def parse_gpu_ids(text: str) -> tuple[int, ...]:
    """Parse ``0,1,3`` or ranges ``0-3`` (mixable) into sorted unique GPU indices."""
    stripped = text.strip()
    if not stripped:
        raise SpecError("the GPU id list is empty; give indices such as 0,1 or 0-3")
    ids: set[int] = set()
    for part in stripped.split(","):
        item = part.strip()
        if not item:
            raise SpecError(f"GPU id list {_q(text)} has an empty entry; write it like 0,1,3")
        m = _INT_OR_RANGE_RE.fullmatch(item)
        if m is None:
            if item.startswith("-") and item[1:].strip().isdigit():
                raise SpecError(f"GPU id {_q(item)} is negative; GPU indices start at 0")
            raise SpecError(f"GPU id {_q(item)} is not a whole number or a range such as 0-3")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low:
            raise SpecError(f"GPU id range {_q(item)} runs backwards; write it low-high")
        if high > MAX_GPU_INDEX:
            raise SpecError(f"GPU id {high} is too large; indices go up to {MAX_GPU_INDEX}")
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))


# --------------------------------------------------------------------------- node ids

_NODE_ID_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_NODE_ID_HINT: Final = "use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"


def validate_node_id(text: str) -> str:
    """Check a node id: 1..64 of ``[A-Za-z0-9._-]``, not starting with ``.`` or ``-``."""
    if not text:
        raise SpecError("the node id is empty; " + _NODE_ID_HINT)
    if len(text) > MAX_NODE_ID_CHARS:
        raise SpecError(
            f"node id {_q(text)} is {len(text)} characters long; at most 64 are allowed"
        )
    if _NODE_ID_RE.fullmatch(text) is None:
        raise SpecError(f"node id {_q(text)} is not valid; {_NODE_ID_HINT}")
    return text


def parse_node_gpu_ids(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Parse ``node001:0,1;node002:0`` into ``(("node001", (0, 1)), ("node002", (0,)))``.

    Nodes keep the order given; GPU lists accept ranges; spaces are allowed around the
    separators; a trailing ``;`` is ignored.
    """
    hint = "write it like node001:0,1;node002:0"
    if not text.strip():
        raise SpecError(f"the node GPU list is empty; {hint}")
    result: list[tuple[str, tuple[int, ...]]] = []
    seen: set[str] = set()
    for segment in text.split(";"):
        part = segment.strip()
        if not part:
            continue
        node, sep, gpus = part.partition(":")
        node = node.strip()
        if not sep or not gpus.strip():
            raise SpecError(f"node {_q(node or part)} has no GPU list in {_q(text)}; {hint}")
        validate_node_id(node)
        if node in seen:
            raise SpecError(f"node {_q(node)} is named twice in {_q(text)}; list it once")
        seen.add(node)
        try:
            ids = parse_gpu_ids(gpus)
        except SpecError as exc:
            raise SpecError(f"in {_q(part)}, {exc}") from None
        result.append((node, ids))
    if not result:
        raise SpecError(f"the node GPU list {_q(text)} names no node; {hint}")
    return tuple(result)


def parse_node_list(text: str) -> tuple[str, ...]:
    """Parse ``a,b`` and Slurm hostlists such as ``node[001-003,007]`` into node names.

    Several bracket groups multiply (``r[1-2]n[1-2]`` gives four names); zero padding follows
    the lower bound (``[001-010]``).  Duplicates are dropped, first occurrence kept.
    """
    if not text.strip():
        raise SpecError("the node list is empty; write it like node001,node002 or node[001-002]")
    names: list[str] = []
    seen: set[str] = set()
    try:
        parts = hostlist.split_top_level(text)
    except HostlistError as e:
        raise SpecError(str(e)) from None
    for part in parts:
        expr = part.strip()
        if not expr:
            raise SpecError(f"node list {_q(text)} has an empty entry")
        try:
            expanded = hostlist.expand_expr(expr)
        except HostlistError as e:
            raise SpecError(str(e)) from None
        for name in expanded:
            validate_node_id(name)
            if name not in seen:
                seen.add(name)
                names.append(name)
                if len(names) > MAX_NODE_LIST:
                    raise SpecError(
                        f"node list {_q(text)} names too many nodes (most {MAX_NODE_LIST})"
                    )
    return tuple(names)


# --------------------------------------------------------------------------- job arrays

_ARRAY_HINT: Final = "write it like 0-99, 1,3,5, 0-15:4 or 0-99%8"
_ARRAY_ITEM_RE: Final = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9})(?::([0-9]{1,9}))?)?")


def parse_array(text: str) -> ArraySpec:
    """Parse a Slurm ``--array`` value: ``0-99``, ``1,3,5``, ``0-15:4``, ``0-99%8``."""
    stripped = text.strip()
    if not stripped:
        raise SpecError(f"the array spec is empty; {_ARRAY_HINT}")
    body, pct, cap = stripped.partition("%")
    max_running: int | None = None
    if pct:
        cap = cap.strip()
        if not re.fullmatch(r"[0-9]{1,9}", cap):
            raise SpecError(f"the '%' limit in array spec {_q(text)} must be a whole number")
        max_running = int(cap)
        if max_running < 1:
            raise SpecError(f"the '%' limit in array spec {_q(text)} must be at least 1")
    if not body.strip():
        raise SpecError(f"array spec {_q(text)} has no indices; {_ARRAY_HINT}")
    indices: set[int] = set()
    for raw in body.split(","):
        item = raw.strip()
        m = _ARRAY_ITEM_RE.fullmatch(item)
        if m is None:
            if item.startswith("-"):
                raise SpecError(f"array index {_q(item)} is negative; indices start at 0")
            raise SpecError(
                f"array entry {_q(item)} in {_q(text)} is not understood; " + _ARRAY_HINT
            )
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        step = int(m.group(3)) if m.group(3) is not None else 1
        if high < low:
            raise SpecError(f"array range {_q(item)} runs backwards; write it low-high")
        if step < 1:
            raise SpecError(f"array step in {_q(item)} must be at least 1")
        if high > MAX_ARRAY_INDEX:
            raise SpecError(f"array index {high} is too large; the largest is {MAX_ARRAY_INDEX}")
        span = range(low, high + 1, step)
        if len(span) + len(indices) > MAX_ARRAY_TASKS:
            raise SpecError(
                f"array spec {_q(text)} has more than {MAX_ARRAY_TASKS} tasks; split it up"
            )
        indices.update(span)
    if len(indices) > MAX_ARRAY_TASKS:  # pragma: no cover - guarded above
        raise SpecError(f"array spec {_q(text)} has more than {MAX_ARRAY_TASKS} tasks")
    return ArraySpec(indices=tuple(sorted(indices)), max_running=max_running)


def format_array(array: ArraySpec) -> str:
    """An `ArraySpec` in Slurm's syntax, consecutive indices as ranges: ``0-99%8``."""
    cap = "" if array.max_running is None else f"%{array.max_running}"
    return encode_indices(array.indices) + cap


def encode_indices(indices: Sequence[int]) -> str:
    """Sorted unique indices as ranges: ``0-99999`` or ``1,3,5-9``."""
    if len(indices) > 1 and indices[-1] - indices[0] == len(indices) - 1:
        return f"{indices[0]}-{indices[-1]}"  # one range (most arrays): not a walk of each
    parts = []
    i = 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        parts.append(str(indices[i]) if i == j else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ",".join(parts)


# --------------------------------------------------------------------------- job ids

# Slurm's ids: an integer that grows per cluster (the store keeps the counter), array
# tasks ``ID_INDEX``.  Stores written by an older mgpu hold 8 lowercase hex characters
# (``a1b2c3d4``, ``a1b2c3d4_7``): they stay valid everywhere an id is taken.
_BASE_ID: Final = r"(?:[1-9][0-9]{0,17}|[0-9a-f]{8})"
_JOB_ID_RE: Final = re.compile(_BASE_ID + r"(?:_(?:0|[1-9][0-9]{0,8}))?")
_BASE_ID_RE: Final = re.compile(_BASE_ID)
JOB_ID_HINT: Final = "job ids are numbers such as 1234, or 1234_7 for an array task"
FIRST_JOB_ID: Final = 1
"""A new cluster's first job id (Slurm's FirstJobId default)."""


def format_job_id(number: int) -> str:
    """The id of the `number`-th job of the cluster (`mgpu.master.store` counts them)."""
    return str(number)


def job_number(job_id: str) -> int | None:
    """The counter value of a numeric job or array id (``"1234"`` -> 1234); None for a
    task id or an old hex id that is not all digits."""
    return int(job_id) if job_id.isdigit() and job_id.isascii() else None


def task_job_number(array_id: str, index: int) -> int | None:
    """Task `index`'s own job number (its SLURM_JOB_ID): as in Slurm, each task of an array
    has one, and the first (index 0) has the array's.  An array takes the block of ids
    from its own to its own + its highest index (`mgpu.master.store` reserves it); None
    for an array with an old hex id."""
    base = job_number(array_id)
    return None if base is None else base + index


def is_job_id(text: str) -> bool:
    """True for ``1234``, array task ids ``1234_7``, and old ids (``a1b2c3d4``,
    ``a1b2c3d4_7``)."""
    return _JOB_ID_RE.fullmatch(text) is not None


def is_task_id(job_id: str) -> bool:
    """Is this the id of one task of an array (``ID_INDEX``)?"""
    return "_" in job_id


def may_be_array_id(job_id: str) -> bool:
    """Could `job_id` name a whole array (a job id without a task index)?  The one rule
    behind "act on every task of the array" (cancel, hold, show ...)."""
    return _BASE_ID_RE.fullmatch(job_id) is not None


def validate_job_id(text: str) -> str:
    """Check (and lower-case) a job id or array task id given by a user."""
    norm = text.strip().lower()
    if not is_job_id(norm):
        raise SpecError(f"{_q(text)} is not a job id; {JOB_ID_HINT}")
    return norm


def array_task_id(array_id: str, index: int) -> str:
    """The id of task `index` of array job `array_id`, Slurm style: ``ARRAY_INDEX``."""
    return f"{array_id}_{index}"


def split_array_task_id(job_id: str) -> tuple[str, int | None]:
    """``"1234_7"`` → ``("1234", 7)``; a plain id → ``(id, None)``."""
    base, sep, index = job_id.partition("_")
    return (base, int(index)) if sep else (base, None)


# --------------------------------------------------------------------------- dependencies

_DEP_HINT: Final = "write it like afterok:1234[:1235], also afterany: or afternotok:"


def parse_dependency(text: str) -> tuple[Dependency, ...]:
    """Parse a Slurm ``--dependency`` value.

    ``afterok:ID[:ID...]``, ``afterany:...``, ``afternotok:...``; several joined with ``,``
    must all hold.  Identical conditions are kept once, in the order given.
    """
    stripped = text.strip()
    if not stripped:
        raise SpecError(f"the dependency is empty; {_DEP_HINT}")
    if "?" in stripped:
        raise SpecError(
            f"dependency {_q(text)} uses '?' (any of), which is not supported; "
            "join conditions with ',' (all must hold)"
        )
    deps: list[Dependency] = []
    seen: set[Dependency] = set()
    for raw in stripped.split(","):
        item = raw.strip()
        if not item:
            raise SpecError(f"dependency {_q(text)} has an empty entry; {_DEP_HINT}")
        kind_text, sep, ids_text = item.partition(":")
        kind_norm = kind_text.strip().lower()
        kind = next((k for k in _DEPENDENCY_KINDS if k == kind_norm), None)
        if kind is None:
            raise SpecError(
                f"dependency type {_q(kind_text.strip())} is not supported; "
                "use afterok, afterany or afternotok"
            )
        if not sep or not ids_text.strip():
            raise SpecError(f"dependency {_q(item)} names no job; {_DEP_HINT}")
        for raw_id in ids_text.split(":"):
            job_text = raw_id.strip()
            if not job_text:
                raise SpecError(f"dependency {_q(item)} has an empty job id; {_DEP_HINT}")
            job_id = job_text.lower()
            if not is_job_id(job_id):
                raise SpecError(
                    f"{_q(job_text)} in dependency {_q(item)} is not a job id; {JOB_ID_HINT}"
                )
            dep = Dependency(kind=kind, job_id=job_id)
            if dep not in seen:
                seen.add(dep)
                deps.append(dep)
    return tuple(deps)


# --------------------------------------------------------------------------- names, commands


def validate_job_name(text: str) -> str:
    """A job name: 1..128 printable characters (surrounding whitespace is stripped)."""
    name = text.strip()
    if not name:
        raise SpecError("the job name is empty; give a short label such as train")
    if len(name) > MAX_JOB_NAME_CHARS:
        raise SpecError(
            f"job name {_q(name)} is {len(name)} characters long; "
            f"at most {MAX_JOB_NAME_CHARS} are allowed"
        )
    if not name.isprintable():
        raise SpecError(
            f"job name {_q(name)} contains control or non-printable characters; use plain text"
        )
    return name


def validate_command(text: str) -> str:
    """A job command: not blank, at most 64 KiB of UTF-8, no NUL byte.  Returned unchanged."""
    if "\x00" in text:
        raise SpecError("the command contains a NUL byte, which a shell cannot run")
    if not text.strip():
        raise SpecError("the command is empty; give the command to run")
    validate_text(text, "the command")
    size = len(text.encode("utf-8"))
    if size > MAX_COMMAND_BYTES:
        raise SpecError(
            f"the command is {size} bytes long; at most {MAX_COMMAND_BYTES} bytes (64 KiB) "
            "are allowed, so put long scripts in a file"
        )
    return text


# --------------------------------------------------------------------------- text for a program


def text_problem(text: str) -> str | None:
    """Why `text` cannot be handed to a program, as the rest of a sentence; None if it can.

    A NUL cannot pass `execve`; a lone surrogate (Python's stand-in for a byte that is not
    UTF-8, as in ``os.environ`` under a non-UTF-8 locale) cannot be encoded for the wire.
    """
    if text.isascii() and "\x00" not in text:
        return None  # the common case, decided in C
    nul = text.find("\x00")
    if nul >= 0:
        return f"contains a NUL byte (character {nul + 1}), which no program can be given"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"is not valid UTF-8 (character {e.start + 1} is the lone surrogate "
            f"{text[e.start]!a}, which is how Python holds a byte that is not UTF-8)"
        )
    return None


def validate_text(text: str, what: str) -> str:
    """`text` unchanged if a program can be given it, else a SpecError naming `what`."""
    problem = text_problem(text)
    if problem is not None:
        raise SpecError(f"{what} {problem}")
    return text


_RTX = re.compile(r"\b(RTX|GTX)\s?(\d{4})")
_MODEL = re.compile(r"\b([A-Z]{1,2}\d{1,4}[A-Z]?)\b")


def normalize_gpu_type(name: str | None) -> str | None:
    """A short GPU type from a name or a user's --gpu-type, for matching both ways:
    "NVIDIA A100-SXM4-80GB" and "a100" -> "A100", "NVIDIA GeForce RTX 3060" -> "RTX3060",
    "Fake GPU (simulated A100)" -> "A100".  A name with no model number is kept whole."""
    if not name:
        return None
    upper = name.upper().strip()
    m = _RTX.search(upper)
    if m:
        return m.group(1) + m.group(2)
    m = _MODEL.search(upper)
    return m.group(1) if m else upper
