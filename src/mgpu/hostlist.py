"""Slurm's host lists: `node[001-004,007],login1` <-> a list of host names.

`SLURM_JOB_NODELIST`, `squeue`'s NODELIST and `scontrol show hostnames` speak this form.
As Slurm does, a range keeps the zero padding of its bounds, hosts are compressed when
they share a prefix and their numbers the same padding (`node[9-10]`, `node[08-10]`), and
the order of first appearance is kept (Slurm sorts only when asked to).
"""

from __future__ import annotations

import re

_SUFFIX = re.compile(r"^(.*?)(\d+)$")
MAX_EXPANDED = 65_536
"""More hosts than any cluster has: a range past it is refused, not expanded."""


class HostlistError(ValueError):
    pass


def expand(text: str) -> list[str]:
    """`node[01-03,07],gpu1` -> ["node01", "node02", "node03", "node07", "gpu1"]."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        hosts.extend(_expand_item(item))
        if len(hosts) > MAX_EXPANDED:
            raise HostlistError(f"host list {text!r} names more than {MAX_EXPANDED} hosts")
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


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in host list {text!r}")
    items.append("".join(current))
    return [i for i in (s.strip() for s in items) if i]


def _expand_item(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    tails = _expand_item(rest) if rest else [""]
    out: list[str] = []
    for part in body.split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise HostlistError(f"bad range {part!r} in host list {item!r}")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo:
            raise HostlistError(f"bad range {part!r} in host list {item!r}")
        if hi - lo >= MAX_EXPANDED:
            raise HostlistError(f"host list {item!r} names more than {MAX_EXPANDED} hosts")
        width = len(first) if first.startswith("0") else 0
        out.extend(f"{prefix}{n:0{width}d}{tail}" for n in range(lo, hi + 1) for tail in tails)
    return out
