"""`main(name, argv)`: run one Slurm command; its mistakes are one line, never a
traceback.  `python -m mgpu.slurm NAME ARGS` and the bin dir's shims come here."""

from __future__ import annotations

import os
import sys

from mgpu.slurm import COMMANDS, output
from mgpu.slurm.common import SlurmError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn


def run(name: str, argv: list[str]) -> int:
    if name == "sbatch":
        from mgpu.slurm import sbatch as command
    elif name == "squeue":
        from mgpu.slurm import squeue as command  # type: ignore[no-redef]
    elif name == "scancel":
        from mgpu.slurm import scancel as command  # type: ignore[no-redef]
    elif name == "scontrol":
        from mgpu.slurm import scontrol as command  # type: ignore[no-redef]
    elif name == "sinfo":
        from mgpu.slurm import sinfo as command  # type: ignore[no-redef]
    elif name == "sacct":
        from mgpu.slurm import sacct as command  # type: ignore[no-redef]
    elif name == "salloc":
        from mgpu.slurm import salloc as command  # type: ignore[no-redef]
    elif name == "srun":
        from mgpu.slurm import srun as command  # type: ignore[no-redef]
    elif name == "slurm-bin":
        return slurm_bin()
    else:
        raise SlurmError(f"mgpu: no Slurm command {name!r} (there are {', '.join(COMMANDS)})", 2)
    return command.main(argv)


def slurm_bin() -> int:
    """`mgpu slurm-bin`: the dir of these commands, built for this account if need be, for
    `export PATH=$(mgpu slurm-bin):$PATH` (never put on PATH unasked: a real Slurm's
    commands must not be shadowed behind the user's back)."""
    from mgpu.agent.slurmbin import ensure

    bin_dir = os.environ.get("MGPU_SLURM_BIN") or str(ensure())
    output.out(bin_dir)
    return 0


def main(
    name: str | None = None, argv: Sequence[str] | None = None, address: Sequence[str] = ()
) -> NoReturn:
    """Run the command `name` (default: this program's name) and exit with its status;
    `address`: mgpu's `--host H --port P --token T`, as `mgpu --host H squeue` gives them."""
    from mgpu.errors import MgpuError
    from mgpu.safetext import escape_controls
    from mgpu.slurm import common, output

    common.ADDRESS.update(zip(address[::2], address[1::2], strict=True))

    words = list(sys.argv[1:] if argv is None else argv)
    if name is None:
        name = os.path.basename(sys.argv[0])
        if name not in COMMANDS and words:
            name, words = words[0], words[1:]
    try:
        code = run(name, words)
    except SlurmError as e:
        # One line each (Slurm's own words are sometimes several), whatever they quote.
        output.err("".join(escape_controls(line) + "\n" for line in str(e).splitlines()), end="")
        code = e.code
    except MgpuError as e:
        output.err(f"{name}: error: {escape_controls(str(e))}")
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `squeue | head`: the reader left; that is not an error
        output.stdout_gone()
        code = 0
    output.flush()
    raise SystemExit(code)
