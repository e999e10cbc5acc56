"""`salloc [OPTIONS] [COMMAND [ARGS...]]`: `mgpu alloc` with Slurm's options (GPUs only
when asked for, as Slurm).  The allocation carries the `slurm` block (without `batch`: it
stays an allocation), so `srun` in it takes its `-n`, `--ntasks-per-node` and
`--gpus-per-task` as sbatch's jobs do."""

from __future__ import annotations

import os

from mgpu.slurm import common, jobopts, optable, opts, pyxis

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "salloc"
OPTIONS = optable.options(PROG)


def main(argv: list[str]) -> int:
    given, command = opts.command_line(
        PROG, argv, OPTIONS, "[OPTIONS(0)...] [command(0) [args(0)...]]", in_order=True
    )
    values = jobopts.merged(PROG, None, list(given.items()), os.environ)
    fields, block, warnings = jobopts.submit_fields(PROG, values, {}, os.getcwd())
    for warning in warnings:
        common.warn(PROG, warning)
    if pyxis.given(values):  # checked now; the allocation's steps run in the container
        pyxis.request(PROG, values, os.getcwd())
        os.environ.update(pyxis.exported(values))
    words = ["alloc", *jobopts.mgpu_words(fields), "--slurm-block", allocation_block(block)]
    return jobopts.exec_mgpu([*words, *(["--", *command] if command else [])])


def allocation_block(block: dict[str, Any]) -> str:
    """The `slurm` block of the allocation as JSON: what shapes its steps and their
    variables (an allocation writes no output files)."""
    import json

    kept = {k: v for k, v in block.items() if k not in ("output", "error", "open_mode")}
    return json.dumps({k: v for k, v in kept.items() if v is not None})
