"""Slurm's output formats: squeue's and sinfo's `%[.][size]X` strings, and sacct's
`Field[%size]` lists (fixed-width columns, or `|`-separated with -p/-P)."""

from __future__ import annotations

from mgpu.safetext import escape_controls
from mgpu.slurm import output
from mgpu.slurm.common import fail


def warn_error(prog: str, message: str) -> None:
    output.err(f"{prog}: error: {message}")


TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Getter = Callable[[Any], str]


def columns(
    table: list[tuple[str, str, str, Getter]],
) -> tuple[dict[str, tuple[str, Getter]], dict[str, str]]:
    """A table of (letter, names, title, getter) rows as `parse_percent`'s letters and
    `parse_long`'s names (lower case) of those letters."""
    known = {letter: (title, getter) for letter, _, title, getter in table}
    names = {n.lower(): letter for letter, words, _, _ in table for n in words.split()}
    return known, names


def parse_percent(
    prog: str, fmt: str, known: dict[str, tuple[str, Getter]], what: str = "job"
) -> list[Any]:
    """`%.18i %9P literal`: literals as strings, fields as (letter, width, right-justified);
    width 0 = as wide as the value.  A letter it does not know is Slurm's error line on
    stderr, then printed as it is written (Slurm goes on, exit status 0)."""
    items: list[Any] = []
    literal: list[str] = []
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        i += 1
        if ch != "%":
            literal.append(ch)
            continue
        if i < len(fmt) and fmt[i] == "%":
            literal.append("%")
            i += 1
            continue
        right = i < len(fmt) and fmt[i] == "."
        i += right
        digits = ""
        while i < len(fmt) and fmt[i].isdigit():
            digits += fmt[i]
            i += 1
        if i == len(fmt) or fmt[i] not in known:
            # As Slurm's print.c: one error line, the spec printed as it is, and on.
            shown = fmt[i] if i < len(fmt) else ""
            warn_error(prog, f"Invalid {what} format specification: {shown}")
            literal.append("%" + ("." if right else "") + digits + shown)
            i += 1
            continue
        if literal:
            items.append("".join(literal))
            literal = []
        items.append((fmt[i], int(digits or 0), right))
        i += 1
    if literal:
        items.append("".join(literal))
    return items


def parse_long(
    prog: str,
    spec: str,
    known: dict[str, tuple[str, Getter]],
    names: dict[str, str],
    what: str = "job",
) -> list[Any]:
    """squeue -O: `jobid,name:30,state:.10`, each field exactly its width (default 20: a
    longer value is cut, and nothing separates the columns, as in Slurm)."""
    items: list[Any] = []
    for raw in spec.split(","):
        name, colon, size = raw.strip().partition(":")
        letter = names.get(name.lower())
        right = size.startswith(".")
        size = size.lstrip(".")
        digits = size[: len(size) - len(size.lstrip("0123456789"))]
        if letter is None or letter not in known:  # Slurm: an error line, and on
            warn_error(prog, f"Invalid {what} format specification: {name}")
        else:
            items.append((letter, int(digits) if digits else 0 if colon else 20, right))
        if size[len(digits) :]:  # `name:10|`: printed after the field, as a separator
            items.append(size[len(digits) :])
    return items


def _cell(text: str, width: int, right: bool) -> str:
    if not width:
        return text
    text = text[:width]
    return text.rjust(width) if right else text.ljust(width)


def render_percent(
    items: list[Any], known: dict[str, tuple[str, Getter]], rows: list[Any], header: bool
) -> list[str]:
    """The lines: a header of the fields' titles (unless not `header`), then one a row."""
    lines: list[str] = []
    if header:
        lines.append(
            "".join(i if isinstance(i, str) else _cell(known[i[0]][0], i[1], i[2]) for i in items)
        )
    for row in rows:
        parts = []
        for item in items:
            if isinstance(item, str):
                parts.append(item)
                continue
            letter, width, right = item
            parts.append(_cell(escape_controls(known[letter][1](row)), width, right))
        lines.append("".join(parts))
    return lines


def parse_fields(
    prog: str, spec: str, known: dict[str, tuple[int, Getter]]
) -> list[tuple[str, int, Getter]]:
    """sacct --format: `JobID,JobName%30,state` as (title, width, getter); a name is the
    first field in `known`'s order it is a prefix of, in any case (`time` is Timelimit),
    as sacct's options.c matches them (`ALL`, or a prefix of it, is every field); a
    negative width is left-justified."""
    out = []
    for raw in spec.replace(" ", ",").split(","):
        if not raw:
            continue
        name, _, size = raw.partition("%")
        if size and not size.lstrip("-").isdigit():
            raise fail(prog, f'Invalid field requested: "{raw}"')
        low = name.lower()
        if "all".startswith(low):
            titles = list(known)
        else:
            titles = [t for t in known if t.lower().startswith(low)][:1]
        if not titles or not low:
            raise fail(prog, f'Invalid field requested: "{name}"')
        for title in titles:
            width, getter = known[title]
            if size:
                width = int(size) if width > 0 else -int(size)
            out.append((title, width, getter))
    return out


def render_fields(
    fields: list[tuple[str, int, Getter]],
    rows: list[Any],
    header: bool,
    parsable: str | None,
    delimiter: str = "|",
) -> list[str]:
    """sacct's table: columns `width` wide (a longer value cut, ending in `+`), each
    followed by a space, a line of dashes under the titles; or with `parsable` ("p": a
    trailing delimiter, "P": none) the values joined by the delimiter."""
    lines: list[str] = []
    if parsable is not None:
        tail = delimiter if parsable == "p" else ""
        if header:
            lines.append(delimiter.join(f[0] for f in fields) + tail)
        for row in rows:
            values = [escape_controls(getter(row)) for _, _, getter in fields]
            lines.append(delimiter.join(values) + tail)
        return lines

    def cell(text: str, width: int) -> str:
        size = abs(width)
        if len(text) > size:
            text = text[: size - 1] + "+"
        return (text.rjust(size) if width > 0 else text.ljust(size)) + " "

    if header:
        lines.append("".join(cell(title, width) for title, width, _ in fields))
        lines.append("".join("-" * abs(width) + " " for _, width, _ in fields))
    for row in rows:
        lines.append("".join(cell(escape_controls(g(row)), w) for _, w, g in fields))
    return lines
