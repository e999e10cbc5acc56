"""`srun`: inside a job (`$MGPU_JOB_ID`), a step on the job's allocation (helper module
mgpu.client.steps); outside any job, `mgpu srun` (a new job, its output here)."""

from __future__ import annotations

import os
import shutil

from mgpu.slurm import common, jobopts, optable, opts
from mgpu.slurm.common import fail

PROG = "srun"
OPTIONS = optable.options(PROG)


STEP_ONLY = optable.names(PROG, "step")
"""srun's options for its tasks' output and life, not the job's: no warning for them."""


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise fail(PROG, f'Invalid numeric value "{text}"')
    return int(text)


def in_job(values: dict[str, str], argv: list[str]) -> int:
    """A step of the current job, through helper "steps"' client (mgpu.client.steps)."""
    try:
        from mgpu.client import steps  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # not merged yet: the step path `mgpu srun` has (mgpu alloc's)
        return jobopts.exec_mgpu(["srun", "--", *argv])
    per_task = values.get("gpus-per-task")
    # Read from the environment as Slurm's srun reads them: the job's sbatch sets both.
    bind = values.get("gpu-bind") or os.environ.get("SLURM_GPU_BIND") or None
    if bind is not None:
        from mgpu import gpubind

        try:
            gpubind.parse(bind)
        except ValueError as e:
            raise fail(PROG, str(e)) from None
    export = values.get("export")
    if export is None:
        export = os.environ.get("SRUN_EXPORT_ENV") or os.environ.get("SLURM_EXPORT_ENV")
    options = steps.StepOptions(
        nodes=_int((values.get("nodes") or "").partition("-")[0] or None),
        ntasks=_int(values.get("ntasks")),
        ntasks_per_node=_int(values.get("ntasks-per-node")),
        nodelist=values.get("nodelist"),
        gpus_per_task=_int(per_task.rpartition(":")[2]) if per_task else None,
        label="label" in values,
        kill_on_bad_exit="kill-on-bad-exit" in values and values["kill-on-bad-exit"] != "0",
        pty="pty" in values,
        cwd=values.get("chdir"),
        job_id=values.get("jobid"),
        gpu_bind=bind,
        export=export,
    )
    return int(steps.run_step(argv, options))


def resolve(program: str, chdir: str | None) -> str:
    """Slurm's srun finds a bare program name on PATH, then in the working directory
    (`search_path`, cwd last): `srun launch.sh` runs the submit directory's launch.sh.
    A name found on PATH, or nowhere, stays as given for the node's own PATH."""
    if "/" in program or not program or shutil.which(program):
        return program
    here = os.path.join(os.getcwd(), chdir or "", program)
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return os.path.abspath(here)
    return program


def main(argv: list[str]) -> int:
    values, command = opts.command_line(
        PROG, argv, OPTIONS, "[OPTIONS(0)...] executable(0) [args(0)...]", in_order=True
    )
    if not command:
        raise fail(PROG, "No command given to execute.")
    for name in sorted(optable.names(PROG, "refuse") & values.keys()):  # in a job too
        raise fail(PROG, optable.REFUSED[name])
    command = [resolve(command[0], values.get("chdir")), *command[1:]]
    if os.environ.get("MGPU_JOB_ID") or values.get("jobid"):
        return in_job(values, command)
    job_values = {k: v for k, v in values.items() if k not in STEP_ONLY}
    fields, _, warnings = jobopts.submit_fields(PROG, job_values, {}, os.getcwd(), block_sent=False)
    for warning in warnings:
        common.warn(PROG, warning)
    words = ["srun", *jobopts.mgpu_words(fields)]
    if "pty" in values:
        words.append("--pty")
    return jobopts.exec_mgpu([*words, "--", *command])
