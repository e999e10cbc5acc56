"""`salloc [OPTIONS] [COMMAND [ARGS...]]`: `mgpu alloc` with Slurm's options (GPUs only
when asked for, as Slurm)."""

from __future__ import annotations

import os

from mgpu.slurm import common, jobopts, opts

PROG = "salloc"


def main(argv: list[str]) -> int:
    values, command = opts.command_line(
        PROG, argv, jobopts.JOB_OPTIONS, "[OPTIONS(0)...] [command(0) [args(0)...]]", in_order=True
    )
    fields, _, warnings = jobopts.submit_fields(PROG, values, {}, os.getcwd(), block_sent=False)
    for warning in warnings:
        common.warn(PROG, warning)
    words = ["alloc", *jobopts.mgpu_words(fields)]
    return jobopts.exec_mgpu([*words, *(["--", *command] if command else [])])
