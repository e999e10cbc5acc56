"""The options a job script carries: its leading `#MGPU` and `#SBATCH` lines.

Pure (no I/O) and standard library only.  `scan(text)` reads the script's leading comment
block as sbatch does: lines are read from the top, a line that starts with `#MGPU` or
`#SBATCH` (nothing before it, not even a space) is a directive, any other comment or blank
line is skipped, and the first other line ends the block (the `#!` line is a comment).  A
directive's words are split as a shell would, a `#` after a space starting a comment.

`#MGPU` lines take mgpu's own job options.  `#SBATCH` lines take them too, plus Slurm's
names for what mgpu has (`-J/--job-name`, `-t`, `-N`, `-w`, `-x`, `-d`, `-a`, `-H`, `-G`,
`--gres=gpu[:TYPE]:N`, `--gres=mps:N`, `--gpus=[TYPE:]N`, `--mail-user`); a Slurm option mgpu lacks
(`--mem`, `--ntasks`, `--output`, ...) is collected in `ignored`, for one warning line.
`--gres=gpu:N` is Slurm's count per node: it is `gres_per_node`, which the caller turns
into `--gpus-per-node` when the job spans nodes and `--gpus` when it does not.
`--gres=mps:N` is N % of one GPU's MPS (Slurm's usual 100 per GPU): `--gpu-share N/100`.
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
    "translate_sbatch",
]

MGPU = "#MGPU"
SBATCH = "#SBATCH"

_SLURM_NAMES = {
    "-J": "--name",
    "--job-name": "--name",
    "-t": "--time",
    "-N": "--nodes",
    "-w": "--nodelist",
    "-x": "--exclude",
    "-d": "--dependency",
    "-a": "--array",
    "-H": "--hold",
    "-G": "--gpus",
}
"""Slurm's spellings of options mgpu has under another (or the same) name."""

_SLURM_FLAGS = frozenset(
    {
        "--exclusive",
        "--requeue",
        "--no-requeue",
        "--overcommit",
        "-O",
        "--contiguous",
        "--test-only",
        "--wait",
        "-W",
        "--parsable",
        "--verbose",
        "-v",
        "--quiet",
        "-Q",
        "--spread-job",
        "--use-min-nodes",
        "--no-kill",
        "-k",
        "--oversubscribe",
        "-s",
        "--reboot",
        "--ignore-pbs",
        "--get-user-env",
        "--disable-status",
    }
)
"""Slurm options that take no value (any other unknown one takes the next word)."""

OUTPUT_OPTIONS = frozenset({"-o", "--output", "-e", "--error", "-i", "--input", "--open-mode"})
"""Where Slurm writes a batch job's output: mgpu keeps it on the master instead."""


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


@dataclass(slots=True)
class Translated:
    """An `#SBATCH` line in mgpu's words."""

    words: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Slurm options mgpu lacks, as written (`--mem`), in order, without their values."""
    gres_per_node: int | None = None
    """`--gres=gpu[:TYPE]:N`: N GPUs on each node."""
    no_mail: bool = False
    """`--mail-type=NONE`."""


def _gpu_count(value: str) -> tuple[str | None, str]:
    """`[TYPE:]N` of Slurm's --gpus and --gpus-per-node: (type, count)."""
    kind, _, count = value.rpartition(":")
    return (kind or None), count


def translate_sbatch(words: list[str], known: dict[str, bool]) -> Translated:
    """One `#SBATCH` line's words as mgpu options.  `known`: mgpu's own options (every
    spelling, short ones included) and whether each takes a value."""
    out = Translated()
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            out.ignored.append(word)  # a stray value: Slurm would refuse it
            continue
        name, value = word, None
        if word.startswith("--") and "=" in word:
            name, _, value = word.partition("=")
        elif not word.startswith("--") and len(word) > 2:
            name, value = word[:2], word[2:]  # -N2, -Jtrain
        mapped = _SLURM_NAMES.get(name, name)
        if name == "--gres":
            value = value if value is not None else (words[i] if i < len(words) else "")
            i += 0 if "=" in word else 1
            _gres(value, out)
            continue
        if mapped in ("--gpus", "--gpus-per-node") and name in ("-G", "--gpus", "--gpus-per-node"):
            if value is None and i < len(words):
                value, i = words[i], i + 1
            kind, count = _gpu_count(value or "")
            if kind:
                out.words += ["--gpu-type", kind]
            out.words += [mapped, count]
            continue
        if name == "--mail-user":
            if value is None and i < len(words):
                value, i = words[i], i + 1
            out.words += ["--notify", f"mailto:{value or ''}"]
            continue
        if name == "--mail-type":
            if value is None and i < len(words):
                value, i = words[i], i + 1
            out.no_mail = (value or "").upper() == "NONE"
            continue
        takes = known.get(mapped)
        if takes is None:  # Slurm's, mgpu lacks it: skip it and its value
            out.ignored.append(name)
            flag = name in _SLURM_FLAGS
            if value is None and not flag and i < len(words) and not words[i].startswith("-"):
                i += 1
            continue
        if not takes:
            out.words.append(mapped)
            continue
        if value is None and i < len(words):
            value, i = words[i], i + 1
        out.words += [mapped] + ([value] if value is not None else [])
    return out


def _gres(value: str, out: Translated) -> None:
    """`--gres=gpu[:TYPE][:N][,other...]`: the GPU part; other resources are ignored."""
    for item in value.split(","):
        parts = item.split(":")
        if parts[0] == "mps" and len(parts) == 2 and parts[1].isdigit() and 0 < int(parts[1]) < 100:
            out.words += ["--gpu-share", f"{int(parts[1]) / 100:g}"]
            continue
        if parts[0] != "gpu":
            out.ignored.append(f"--gres={item}")
            continue
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        kind = parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else None
        if kind:
            out.words += ["--gpu-type", kind]
        out.gres_per_node = int(count)
