"""`mgpu submit FILE` of a script with `#SBATCH` lines: a Slurm batch job, as `sbatch FILE`
submits it (sbatch's options, the `slurm` block, no GPU unless asked, the script's name
as the job's), with mgpu's own options (its `#MGPU` lines, then the command line) over
sbatch's; the GPU request is one thing however it is spelt (mgpu.gpurequest).  The
`mgpu` command line (mgpu.client.cli) hands such a script here: the Slurm layer sits
above the client's (mgpu.client.cmd_jobctl reads the script and mgpu's own options)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from mgpu.client import cmd_jobctl, directives
from mgpu.client.api import MgpuError
from mgpu.client.options import JOB_FIELDS, UsageError, job_options, make_client
from mgpu.client.submitting import submitted
from mgpu.gpurequest import MGPU_REQUEST as GPU_REQUEST
from mgpu.gpurequest import lay_over
from mgpu.slurm import sbatch
from mgpu.slurm.common import SlurmError
from mgpu.slurm.jobopts import GPU_OPTIONS

__all__ = ["slurm_batch", "submit_batch"]


def slurm_batch(
    path: str, text: str, script_args: list[str], given: dict[str, Any]
) -> tuple[Any, dict[str, str]]:
    """`mgpu submit [given] path` of a script with `#SBATCH` lines: sbatch's batch job
    (mgpu.slurm.sbatch.Batch; the CLI imports this module only for such a script) with mgpu's own
    options (`#MGPU` lines, the command line) over sbatch's; and where each came from."""
    mgpu_opts, sources, _ = cmd_jobctl.script_options(path, text, given)
    try:
        batch = sbatch.Batch.of_script(
            path, text, script_args, os.environ, cmd_jobctl.working_dir()
        )
    except SlurmError as e:
        why = str(e).removeprefix("sbatch: ").removeprefix("error: ")
        raise UsageError(f"{path}: {why}") from None
    fields = dict(batch.fields)
    lay_over(fields, mgpu_opts, GPU_REQUEST, goes_with=("gpu_type",))  # mgpu's over sbatch's
    asked = (set(fields) - set(mgpu_opts)) & set(JOB_FIELDS)  # what sbatch's lines gave
    if not set(GPU_OPTIONS) & batch.values.keys():
        asked -= set(GPU_REQUEST) | {"gpu_type"}  # no GPU: sbatch's default, not an option
    if "dependency" in mgpu_opts:
        batch.values.pop("dependency", None)
    if "notify" in mgpu_opts:
        batch.mail = None
    batch.fields = fields
    return batch, {**dict.fromkeys(sorted(asked), directives.SBATCH), **sources}


def submit_batch(args: argparse.Namespace, path: str, text: str, script_args: list[str]) -> int:
    """A script with `#SBATCH` lines, queued as sbatch queues it (its refusals in sbatch's
    words), then said as `mgpu submit` says it."""
    given = job_options(args)
    if args.interactive:
        given["interactive"] = True
    batch, sources = slurm_batch(path, text, script_args, given)
    batch.fields["option_sources"] = sources
    client = make_client(args)
    try:
        job, warnings = sbatch.submit(client, batch)
    except SlurmError as e:
        raise MgpuError(str(e).removeprefix("sbatch: error: ")) from None
    job.warnings = warnings
    return submitted(client, job, args)
