"""Slurm 22.05's `--gpu-bind`: which of a step's GPUs on a node each of its tasks sees.

Pure, and as Slurm does it (src/common/tres_bind.c checks the text, src/common/gres.c
`_get_usable_gres` applies it, on a node whose gres.conf names no CPU affinity, as mgpu
knows none):

* `closest` (and, as Slurm reads it, any word that starts with `c`), `none` (any word
  starting with `n`): no binding, every task sees every GPU of the step on its node;
* `single:N`: task `localid` sees one GPU, the `(localid // N) % count`th;
* `per_task:N`: the Nth slice (what `--gpus-per-task=N` implies when no `--gpu-bind` is
  given);
* `map_gpu:A,B*2,...`: task `localid` sees the GPU its entry names (the list repeats);
* `mask_gpu:0x3,0xc*2,...`: the GPUs of its entry's bit mask;
* a `verbose,` prefix: one line about the binding on the task's stderr (`verbose_line`).

GPU ids in maps and masks are the node's GPU indices (mgpu's `CUDA_VISIBLE_DEVICES`
numbering), as Slurm's without `ConstrainDevices`.  An entry that names no GPU of the step
binds the task to the step's first GPU, as Slurm does.  Bad text: `ValueError` with
Slurm's sentence (`Invalid --gpu-bind argument: gpu:TEXT`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GpuBind", "parse", "task_gpus", "verbose_line"]

NO_BINDING = ("closest", "none", "other")


@dataclass(frozen=True, slots=True)
class GpuBind:
    """A parsed `--gpu-bind`."""

    kind: str
    """`closest`, `none`, `other` (a word Slurm accepts and binds nothing with), `single`,
    `per_task`, `map` or `mask`."""
    verbose: bool = False
    number: int = 0
    """single's tasks per GPU, per_task's GPUs per task."""
    entries: tuple[str, ...] = ()
    """map's or mask's entries as written (`0x3*2`)."""


def parse(text: str) -> GpuBind:
    """`--gpu-bind`'s value, or ValueError with Slurm's sentence."""
    bad = ValueError(f"Invalid --gpu-bind argument: gpu:{text}")
    specs = ("gpu:" + text).split(";")
    for spec in specs:  # Slurm checks every `;` part of "gpu:" + text; the first counts
        if not spec:
            continue
        kind, sep, arg = spec.partition(":")
        if not sep or kind != "gpu" or not _valid(arg):
            raise bad
    return _meaning(text)


def _valid(arg: str) -> bool:
    """tres_bind.c's `_valid_gpu_bind`."""
    if arg[:8].lower() == "verbose,":
        arg = arg[8:]
    low = arg.lower()
    if low[:1] in ("c", "n"):
        return True
    if low.startswith("map_gpu:"):
        return _valid_list(arg[8:], hexadecimal=False)
    if low.startswith("mask_gpu:"):
        return _valid_list(arg[9:], hexadecimal=True)
    if low.startswith("per_task:"):
        return _strtol(arg[9:])[0] >= 0
    if low.startswith("single:"):
        return _strtol(arg[7:])[0] >= 0
    return False


def _valid_list(text: str, hexadecimal: bool) -> bool:
    digits = "0123456789abcdefABCDEF" if hexadecimal else "0123456789"
    for token in (t for t in text.split(",") if t):
        if hexadecimal and token.startswith("0x"):
            token = token[2:]
        if any(c not in digits and c != "*" for c in token):
            return False
        value, rest = _strtol(token, 16 if hexadecimal else 10)
        if value < 0 or (rest and not rest.startswith("*")):
            return False
        if rest:
            count, tail = _strtol(rest[1:])
            if count < 0 or tail:
                return False
    return True


_NUMBER = {
    0: re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)"),
    10: re.compile(r"\s*([+-]?)([0-9]+)"),
    16: re.compile(r"\s*([+-]?)(?:0[xX])?([0-9a-fA-F]+)"),
}


def _strtol(text: str, base: int = 0) -> tuple[int, str]:
    """C's strtol: the number at the start of `text` (0 if none) and what follows it."""
    m = _NUMBER[base].match(text)
    if m is None:
        return 0, text
    sign, digits = m.groups()
    if base == 0:
        if digits[:2].lower() == "0x":
            value = int(digits[2:], 16)
        else:
            value = int(digits, 8) if digits.startswith("0") else int(digits)
    else:
        value = int(digits, base)
    return (-value if sign == "-" else value), text[m.end() :]


def _meaning(text: str) -> GpuBind:
    """gres.c's `_parse_tres_bind` (the text already valid)."""
    verbose = text[:8].lower() == "verbose,"
    arg = text[8:] if verbose else text
    low = arg.lower()
    if low.startswith("single:"):
        number = _strtol(arg[7:])[0]
        return GpuBind("single", verbose, number if number > 0 else 1)
    if low.startswith("closest"):
        return GpuBind("closest", verbose)
    if low.startswith("map_gpu:"):
        return GpuBind("map", verbose, entries=tuple(t for t in arg[8:].split(",") if t))
    if low.startswith("mask_gpu:"):
        return GpuBind("mask", verbose, entries=tuple(t for t in arg[9:].split(",") if t))
    if low.startswith("per_task:"):
        return GpuBind("per_task", verbose, max(0, _strtol(arg[9:])[0]))
    return GpuBind("none" if low.startswith("n") else "other", verbose)


def task_gpus(
    bind: GpuBind | None, step_gpus: Sequence[int], localid: int, node_size: int
) -> list[int]:
    """The GPUs task `localid` (its index on its node) sees of `step_gpus`, the step's GPUs
    on its node (node indices, ascending); `node_size`: the node's GPU count (the highest
    index a map or mask may name, plus one)."""
    step = list(step_gpus)
    if bind is None or not step or bind.kind in NO_BINDING:
        return step
    if bind.kind == "single":
        return step if len(step) == 1 else [step[(localid // bind.number) % len(step)]]
    if bind.kind == "per_task":
        if bind.number == 0:
            return step
        own = step[localid * bind.number : (localid + 1) * bind.number]
    else:
        if not bind.entries:
            return step
        own = [g for g in _entry_gpus(bind, localid, node_size) if g in step]
    return own or step[:1]  # names none of the step's: its first, as Slurm


def _entry_gpus(bind: GpuBind, localid: int, node_size: int) -> list[int]:
    """The GPUs the map's or mask's entry for `localid` names (none for a bad value)."""
    entries: list[tuple[str, int]] = []
    for token in bind.entries:
        value, _, times = token.partition("*")
        entries.append((value, max(1, _strtol(times)[0]) if times else 1))
    position = localid % sum(count for _, count in entries)
    chosen = entries[-1][0]
    for text, count in entries:
        if position < count:
            chosen = text
            break
        position -= count
    number = _strtol(chosen)[0]  # base 0, as gres.c reads it
    if bind.kind == "map":
        return [number] if 0 <= number < node_size else []
    if not 1 <= number < (1 << node_size):
        return []
    return [i for i in range(node_size) if number >> i & 1]


def _hexmask(ids: Sequence[int]) -> str:
    return f"0x{sum(1 << i for i in set(ids)):X}"


def verbose_line(usable: Sequence[int], step_gpus: Sequence[int]) -> str:
    """What Slurm's `verbose,` prints on a task's stderr about its binding."""
    listed = ",".join(map(str, usable))
    return (
        f"gpu-bind: usable_gres={_hexmask(usable)}; bit_alloc={_hexmask(step_gpus)}; "
        f"local_inx=0; global_list={listed}; local_list={listed}"
    )
