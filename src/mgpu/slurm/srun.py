"""`srun`: inside a job (`$MGPU_JOB_ID`), a step on the job's allocation (helper module
mgpu.client.steps); outside any job, `mgpu srun` (a new job, its output here)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

from mgpu.slurm import common, jobopts, optable, opts, pyxis
from mgpu.slurm import resources as slurm_resources
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


def _cpus_per_task(text: str | None) -> int | None:
    """`srun -c N` in a job: the step's CPUs per task (Slurm's parse_int sentence)."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise fail(PROG, f'Invalid numeric value "{text}" for --cpus-per-task.')
    return int(text)


def in_job(
    values: dict[str, str],
    argv: list[str],
    image: str | None = None,
    container: dict[str, Any] | None = None,
) -> int:
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
    nodes, ntasks, per_node = step_shape(values, os.environ)
    options = steps.StepOptions(
        nodes=nodes,
        ntasks=ntasks,
        ntasks_per_node=per_node,
        nodelist=values.get("nodelist"),
        gpus_per_task=_int(per_task.rpartition(":")[2]) if per_task else None,
        cpus_per_task=_cpus_per_task(values.get("cpus-per-task")),
        label="label" in values,
        kill_on_bad_exit="kill-on-bad-exit" in values and values["kill-on-bad-exit"] != "0",
        pty="pty" in values,
        cwd=values.get("chdir"),
        job_id=values.get("jobid"),
        gpu_bind=bind,
        export=export,
        image=image,
        container=container,
    )
    return int(steps.run_step(argv, options))


def step_shape(
    values: dict[str, str], environ: Mapping[str, str]
) -> tuple[int | None, int | None, int | None]:
    """(nodes, tasks, tasks per node) of a step, as Slurm's srun reads them in a job: a
    task count not given is the job's SLURM_NTASKS (srun's input variable); a tasks-per-
    node that does not fit the tasks on the nodes is dropped, with Slurm's warning."""
    nodes = _int((values.get("nodes") or "").partition("-")[0] or None)
    given = values.get("ntasks")
    if given is None:
        given = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS")
    ntasks = _int(given)
    per_node = _int(values.get("ntasks-per-node"))
    on_nodes = nodes or _int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES"))
    if ntasks and per_node and on_nodes and per_node * on_nodes != ntasks:
        common.warn(
            PROG,
            f"can't honor --ntasks-per-node set to {per_node} which doesn't match the "
            f"requested tasks {ntasks} with the number of requested nodes {on_nodes}. "
            "Ignoring --ntasks-per-node.",
        )
        per_node = None
    return nodes, ntasks, per_node


def with_inherited(values: dict[str, str], environ: dict[str, str] | Any) -> dict[str, str]:
    """srun's options over the pyxis options its sbatch/salloc handed down (a pair's
    other half given here drops the inherited one: `--container-writable` over
    an inherited `--container-readonly`)."""
    below = dict(pyxis.inherited(environ))
    if not below:
        return values
    for first, second in pyxis.PAIRS:
        if first in values or second in values:
            below.pop(first, None)
            below.pop(second, None)
    return {**below, **values}


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
    values = with_inherited(values, os.environ)
    image, container = None, None
    if pyxis.given(values):
        here = os.path.join(os.getcwd(), values.get("chdir") or "")
        image, container, notes = pyxis.request(PROG, values, here)
        for note in notes:
            common.warn(PROG, note)
    if image is None:  # a program in the image is the image's: not looked for here
        command = [resolve(command[0], values.get("chdir")), *command[1:]]
    if os.environ.get("MGPU_JOB_ID") or values.get("jobid"):
        return in_job(values, command, image, container)
    job_values = {k: v for k, v in values.items() if k not in STEP_ONLY}
    fields, block, warnings = jobopts.submit_fields(PROG, job_values, {}, os.getcwd())
    for warning in warnings:
        common.warn(PROG, warning)
    nodes = fields.get("nodes") or 1
    per_node = fields.get("gpus_per_node") if nodes > 1 else fields.get("gpus")
    words = ["srun", *jobopts.mgpu_words(fields)]
    words += slurm_resources.own_words(block, per_node or 0, nodes)
    if "pty" in values:
        words.append("--pty")
    if image is not None:
        words += ["--image", image, "--container-options", json.dumps(container)]
    return jobopts.exec_mgpu([*words, "--", *command])
