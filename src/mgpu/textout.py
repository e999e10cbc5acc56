"""The one way a Slurm command (and srun's step client, mgpu.client.steps) writes its
text: `out` (stdout) and `err` (stderr).  Slurm's commands reach it as mgpu.slurm.output.

What the commands print comes partly from other users (a job's name, command, working
directory, a node's reason, the master's refusals quoting them), and an admin reads
everyone's.  On a terminal every control character but newline and tab is written as its
escape (`\\x1b`, mgpu.safetext), so an OSC 52 clipboard write, a title or a screen clear in
someone's job is seen, not obeyed, whichever command shows it; piped, the text is written as
it is.  The values of the tables (squeue, sacct, sinfo) and of `scontrol show` are escaped
where they are made too, on a terminal or not: a pipe into `less` or `grep` ends on a
terminal all the same.  No module of mgpu.slurm writes to sys.stdout or sys.stderr but
through this one (tests/unit/test_slurm_output.py walks them).

Standard library only (the commands start at a floor).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

__all__ = ["err", "flush", "out", "shown", "stdout_gone"]


def shown(text: str, terminal: bool) -> str:
    """`text` as it may be written: on a `terminal`, each control character but newline and
    tab escaped; elsewhere as it is."""
    if not terminal or text.isprintable():
        return text
    from mgpu.safetext import escape_controls

    return "\n".join("\t".join(map(escape_controls, ln.split("\t"))) for ln in text.split("\n"))


def _write(stream: TextIO, text: str, end: str, flush: bool) -> None:
    stream.write(shown(text + end, stream.isatty()))
    if flush:
        stream.flush()


def out(text: str = "", end: str = "\n", flush: bool = False) -> None:
    """`text` and `end` to stdout (looked up at each call: a test may have replaced it)."""
    _write(sys.stdout, text, end, flush)


def err(text: str, end: str = "\n") -> None:
    """`text` and `end` to stderr, at once (a warning comes before what follows it)."""
    _write(sys.stderr, text, end, flush=True)


def flush() -> None:
    """Both streams written out (before an exec, or at exit)."""
    sys.stdout.flush()
    sys.stderr.flush()


def stdout_gone() -> None:
    """The reader of stdout left (`squeue | head`): later writes go nowhere, not to an
    error at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
