"""The options a job script carries: its leading `#MGPU` and `#SBATCH` lines.

Pure (no I/O) and standard library only.  `scan(text)` reads the script's leading comment
block as sbatch does: lines are read from the top, a line that starts with `#MGPU` or
`#SBATCH` (nothing before it, not even a space) is a directive, any other comment or blank
line is skipped, and the first other line ends the block (the `#!` line is a comment).  A
directive's words are split as a shell would, a `#` after a space starting a comment.

`#MGPU` lines take mgpu's own job options (`mgpu submit`); `#SBATCH` lines make the
script a Slurm batch job, read by `mgpu.slurm.jobopts` with sbatch's own options.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

__all__ = [
    "MGPU",
    "SBATCH",
    "Directive",
    "Scan",
    "scan",
]

MGPU = "#MGPU"
SBATCH = "#SBATCH"


@dataclass(frozen=True, slots=True)
class Directive:
    source: str
    """MGPU or SBATCH."""
    line: int
    """1-based line number in the script."""
    text: str
    """The line as written (for messages)."""
    words: list[str]


@dataclass(slots=True)
class Scan:
    directives: list[Directive] = field(default_factory=list)
    error: str | None = None
    """A directive that cannot be split into words (an unclosed quote)."""


def scan(text: str) -> Scan:
    """The leading `#MGPU` / `#SBATCH` directives of a script (see the module docstring)."""
    out = Scan()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break
        for prefix in (MGPU, SBATCH):
            rest = raw[len(prefix) :]
            if raw.startswith(prefix) and (not rest or rest[0] in " \t"):
                try:
                    words = shlex.split(rest, comments=True)
                except ValueError as e:
                    out.error = f"line {number}: {raw.strip()}: {e}"
                    return out
                out.directives.append(Directive(prefix, number, raw.strip(), words))
    return out
