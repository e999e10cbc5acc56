"""Slurm's option syntax (getopt_long's): `-n4`, `-n 4`, `--ntasks=4`, `--ntasks 4`, a unique
prefix of a long name (`--ntask=4`), and `--` ending the options.

`parse(prog, argv, table)` returns the options given, by their long name with their values
("" for a flag), and the words left over.
`in_order` stops at the first word that is not an option (sbatch's and srun's `+`: what
follows is the script or the command and its own arguments); otherwise options may come
anywhere (squeue, scancel, sacct).  A mistake is Slurm's sentence, as a SlurmError.
"""

from __future__ import annotations

from mgpu.slurm import output
from mgpu.slurm.common import SlurmError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


class Option:
    """One option: its long name (its value is kept under it), its short letter (or ""),
    whether it takes a value (`"yes"`, `"no"` or `"optional"`: only as `--name=value`),
    and the spelling it is given as (another name of the same option: `--cpu_bind` of
    `--cpu-bind`; by default its long name)."""

    __slots__ = ("arg", "long", "short", "spelling")

    def __init__(self, long: str, short: str = "", arg: str = "yes", spelling: str = "") -> None:
        self.long, self.short, self.arg = long, short, arg
        self.spelling = spelling or long


def table(spec: str) -> list[Option]:
    """Options from a compact spec, one per word: `name`, `name=` (takes a value),
    `name?` (an optional value), each optionally `/x` for the short letter:
    `"ntasks=/n wait/W export="`."""
    out = []
    for word in spec.split():
        name, _, short = word.partition("/")
        arg = {"=": "yes", "?": "optional"}.get(name[-1], "no")
        out.append(Option(name.rstrip("=?"), short, arg))
    return out


def parse(
    prog: str, argv: Sequence[str], options: list[Option], in_order: bool = False
) -> tuple[list[tuple[str, str]], list[str]]:
    """The options given, in order, as (long name, value or ""); and the other words."""
    by_long = {o.spelling: o for o in options}
    by_short = {o.short: o for o in options if o.short}
    found: list[tuple[str, str]] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            rest += argv[i:]
            break
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            opt = _long(prog, name, by_long)
            if opt.arg == "no" and eq:
                raise SlurmError(f"{prog}: option '--{opt.spelling}' doesn't allow an argument")
            if opt.arg == "yes" and not eq:
                if i == len(argv):
                    raise SlurmError(f"{prog}: option '--{opt.spelling}' requires an argument")
                value, i = argv[i], i + 1
            found.append((opt.long, value))
            continue
        if word.startswith("-") and len(word) > 1:
            j = 1
            while j < len(word):
                short = by_short.get(word[j])
                if short is None:
                    raise SlurmError(f"{prog}: invalid option -- '{word[j]}'")
                opt = short
                j += 1
                if opt.arg == "no":
                    found.append((opt.long, ""))
                    continue
                if j < len(word):
                    found.append((opt.long, word[j:]))
                elif opt.arg == "optional":
                    found.append((opt.long, ""))
                elif i == len(argv):
                    raise SlurmError(f"{prog}: option requires an argument -- '{word[j - 1]}'")
                else:
                    found.append((opt.long, argv[i]))
                    i += 1
                break
            continue
        if in_order:
            rest += argv[i - 1 :]
            break
        rest.append(word)
    return found, rest


def _long(prog: str, name: str, by_long: dict[str, Option]) -> Option:
    if name in by_long:
        return by_long[name]
    matches = [o for spelling, o in by_long.items() if spelling.startswith(name)]
    # As getopt_long: prefixes of several spellings of one option are not ambiguous.
    if name and matches and len({(o.long, o.arg) for o in matches}) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SlurmError(f"{prog}: option '--{name}' is ambiguous")
    raise SlurmError(f"{prog}: unrecognized option '--{name}'")


def command_line(
    prog: str, argv: Sequence[str], options: list[Option], usage: str, in_order: bool = False
) -> tuple[dict[str, str], list[str]]:
    """The options given (the last of each wins) and the other words; `--help`/`--usage`
    print the usage and exit, `--version` the version."""
    found, rest = parse(prog, argv, options, in_order)
    given = dict(found)
    if "help" in given or "usage" in given:
        output.out(f"Usage: {prog} {usage}")
        raise SystemExit(0)
    if "version" in given:
        output.out("slurm 22.05 (mgpu)")
        raise SystemExit(0)
    return given, rest
