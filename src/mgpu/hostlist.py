"""Slurm's host lists: `node[001-004,007],login1` <-> a list of host names.

`SLURM_JOB_NODELIST`, `squeue`'s NODELIST and `scontrol show hostnames` speak this form.
As Slurm does, a range keeps the zero padding of its bounds, hosts are compressed when
they share a prefix and their numbers the same padding (`node[9-10]`, `node[08-10]`), and
the order of first appearance is kept (Slurm sorts only when asked to).
"""

from __future__ import annotations

import re
from itertools import product

_SUFFIX = re.compile(r"^(.*?)(\d+)$")
MAX_HOSTS = 10000
"""More hosts than any cluster has: a list past it is refused, not expanded."""


class HostlistError(ValueError):
    pass


def expand(text: str) -> list[str]:
    """`node[01-03,07],gpu1` -> ["node01", "node02", "node03", "node07", "gpu1"]."""
    hosts: list[str] = []
    for item in split_top_level(text.strip()):
        if item.strip():
            hosts.extend(expand_expr(item.strip()))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"host list {_q(text)} names too many hosts (most {MAX_HOSTS})")
    return hosts


def compress(hosts: list[str]) -> str:
    """["node01", "node02", "node04"] -> "node[01-02,04]" (duplicates dropped)."""
    groups: dict[tuple[str, int, str], list[int]] = {}
    order: list[tuple[str, int, str] | str] = []
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            continue
        seen.add(host)
        m = _SUFFIX.match(host)
        if not m:
            order.append(host)
            continue
        digits = m.group(2)
        padded = len(digits) > 1 and digits.startswith("0")
        key = (m.group(1), len(digits), "")
        if not padded and key not in groups:
            key = (m.group(1), 0, "")  # unpadded numbers share one range: node[9-10]
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(2)))
    parts: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width, _ = entry
        numbers = groups[entry]
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        parts.append(f"{prefix}[{_ranges(sorted(set(numbers)), width)}]")
    return ",".join(parts)


def _ranges(numbers: list[int], width: int) -> str:
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
        if n is not None:
            start = prev = n
    return ",".join(out)


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``[...]``."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"node list {_q(text)} has nested '[' brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"node list {_q(text)} has a ']' without a matching '['")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise HostlistError(f"node list {_q(text)} has a '[' without a matching ']'")
    parts.append("".join(current))
    return parts


_BRACKET_RE = re.compile(r"\[([^\[\]]*)\]")


def _expand_bracket(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for raw in body.split(","):
        item = raw.strip()
        m = re.fullmatch(r"([0-9]{1,9})(?:-([0-9]{1,9}))?", item)
        if m is None:
            raise HostlistError(
                f"node range {_q(item)} in {_q(expr)} is not understood; "
                "write it like node[001-003,007]"
            )
        low_s, high_s = m.group(1), m.group(2)
        if high_s is None:
            out.append(low_s)
            continue
        low, high = int(low_s), int(high_s)
        if high < low:
            raise HostlistError(f"node range {_q(item)} in {_q(expr)} runs backwards")
        if high - low + 1 > MAX_HOSTS:
            raise HostlistError(f"node range {_q(item)} is too long; at most {MAX_HOSTS} nodes")
        width = len(low_s) if low_s.startswith("0") else 0
        out.extend(f"{i:0{width}d}" for i in range(low, high + 1))
    return out


def expand_expr(expr: str) -> list[str]:
    pieces = _BRACKET_RE.split(expr)
    # pieces alternates literal, bracket body, literal, ...
    literals = pieces[0::2]
    choices = [_expand_bracket(body, expr) for body in pieces[1::2]]
    total = 1
    for c in choices:
        total *= len(c)
    if total > MAX_HOSTS:
        raise HostlistError(f"node list {_q(expr)} expands to too many nodes (most {MAX_HOSTS})")
    names: list[str] = []
    for combo in product(*choices):
        name = literals[0]
        for number, literal in zip(combo, literals[1:], strict=True):
            name += number + literal
        names.append(name)
    return names


def _q(text: str, limit: int = 60) -> str:
    """Quote a user value for a message, shortened."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
