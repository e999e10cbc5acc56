"""`mgpu submit FILE` (a job script and its directives), `mgpu hold|release|requeue|update`
and `mgpu cancel --signal`.

Kept apart from `cli.py` (which registers these with `add_jobctl_parsers` and hands a
submit whose first word is an existing script to `submit_script`, or to
mgpu.slurm.mgpusubmit when it has `#SBATCH` lines).

A script with `#SBATCH` lines is a Slurm batch job, as `sbatch FILE` submits it (Slurm's
options, the `slurm` block, no GPU unless asked, the script's name as the job's); a
script with only `#MGPU` lines, or none, is mgpu's own.  Either way mgpu's options lie
over it, lowest first: its `#MGPU` lines, then the command line; a
later line beats an earlier one of the same kind.  The GPU request is one thing, however
it is spelt (`--gpus`, `--gpus-per-node`, `--gpu-ids`, `--node-gpu-ids`, sbatch's
`--gres`/`--gpus*`): a higher layer's replaces the one below whole (mgpu.gpurequest), so
`mgpu submit --gpus 4 job.sh` never clashes with the script's `--gres=gpu:2`.  Where each
option came from is sent with the job (`option_sources`, shown by `mgpu show`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mgpu.client import directives, jsonlite
from mgpu.client.api import Client, RequestError
from mgpu.client.console import print_error, warn
from mgpu.client.options import JOB_FIELDS, UsageError, add_job_options, job_options, make_client
from mgpu.client.submitting import submitted
from mgpu.gpurequest import MGPU_REQUEST as GPU_REQUEST
from mgpu.gpurequest import lay_over

__all__ = [
    "add_jobctl_parsers",
    "is_slurm_script",
    "read_script",
    "script_options",
    "submit_script",
]

MAX_SCRIPT_BYTES = 1 << 20
"""As the master's limit (mgpu.master.control.submit.MAX_SCRIPT_BYTES)."""
COMMAND_LINE = "command line"
SUMMARY_OVER = 10
"""An array's tasks are listed one a line up to this many, else summed up."""


# ---- job scripts ------------------------------------------------------------------


def read_script(path: str) -> str | None:
    """A job script's text; None for a program (an executable file that is not text),
    which is run as a command, as before."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read the job script {path}: {e.strerror}") from None
    if data.startswith(b"\x7fELF") or b"\0" in data[:8192]:
        return None
    if len(data) > MAX_SCRIPT_BYTES:
        raise UsageError(
            f"the job script {path} is over 1 MiB; a script is sent with its job, so keep "
            "data in files the script reads"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"the job script {path} is not UTF-8 text (byte {e.start + 1}); save it as UTF-8"
        ) from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def _directive_parser() -> argparse.ArgumentParser:
    """The job options, nothing set unless given."""
    p = _Parser(prog="directive", add_help=False, argument_default=argparse.SUPPRESS)
    add_job_options(p)
    return p


def script_options(
    path: str, text: str, given: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The job options of `mgpu submit [given] path` from its `#MGPU` lines and the
    command line: (options, where each came from, warnings).  `#SBATCH` lines are
    sbatch's (`slurm_batch`).  A directive that is not understood is a UsageError naming
    its line."""
    found = directives.scan(text)
    if found.error is not None:
        raise UsageError(f"{path} {found.error}")
    parser = _directive_parser()
    layer: dict[str, Any] = {}
    for d in found.directives:
        if d.source != directives.MGPU:
            continue
        try:
            values = vars(parser.parse_args(d.words))
        except UsageError as e:
            raise UsageError(f"{path} line {d.line}: {d.text}: {e}") from None
        lay_over(layer, {k: v for k, v in values.items() if k in JOB_FIELDS}, GPU_REQUEST)
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, values in ((directives.MGPU, layer), (COMMAND_LINE, given)):
        lay_over(merged, values, GPU_REQUEST)
        for key in GPU_REQUEST:
            if key not in merged:
                sources.pop(key, None)
        sources.update(dict.fromkeys(values, source))
    return merged, sources, []


def working_dir() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory no longer exists") from None


def is_slurm_script(text: str) -> bool:
    """Whether a script has `#SBATCH` lines: a Slurm batch job (mgpu.slurm.mgpusubmit)."""
    return any(d.source == directives.SBATCH for d in directives.scan(text).directives)


def submit_script(args: argparse.Namespace, text: str) -> int:
    """`mgpu submit [options] FILE [ARGS...]` of a job script FILE (`text`) without
    `#SBATCH` lines: the script is sent with the job."""
    path, script_args = args.command[0], list(args.command[1:])
    opts, sources, warnings = script_options(path, text, job_options(args))
    warn(warnings)
    if args.interactive:
        opts["interactive"] = True
    client = make_client(args)
    job = client.submit(
        script_args,
        script=text,
        script_name=os.path.basename(path),
        option_sources=sources,
        **opts,
    )
    return submitted(client, job, args)


# ---- hold, release, requeue, update -----------------------------------------------


def _report(rows: list[dict[str, Any]], verb: str, job_id: str) -> None:
    changed = [r for r in rows if r["changed"]]
    same = [r for r in rows if not r["changed"]]
    if len(rows) > SUMMARY_OVER:
        print(f"{verb} {len(changed)} of the {len(rows)} active tasks of {job_id}")
        if same:
            print(f"{len(same)} left as they were: {same[0]['message']}", file=sys.stderr)
        return
    for r in changed:
        print(r["message"])
    for r in same:
        print(r["message"], file=sys.stderr)


def _each(args: argparse.Namespace, verb: str, call: Any) -> int:
    status = 0
    for job_id in args.jobs:
        try:
            out = call(job_id)
        except RequestError as e:
            print_error(str(e))
            status = 1
            continue
        if args.json:
            print(jsonlite.dumps(out))
        else:
            _report(out["jobs"], verb, job_id)
    return status


def cmd_hold(args: argparse.Namespace) -> int:
    return _each(args, "held", make_client(args).hold)


def cmd_release(args: argparse.Namespace) -> int:
    return _each(args, "released", make_client(args).release)


def cmd_requeue(args: argparse.Namespace) -> int:
    return _each(args, "requeueing", make_client(args).requeue)


def cmd_signal(args: argparse.Namespace) -> int:
    """`mgpu cancel --signal SIG JOB...`: SIG to every process of each running job now."""
    client = make_client(args)
    args.json = False
    return _each(args, "signalled", lambda job_id: client.signal(job_id, args.signal, full=True))


def cmd_update(args: argparse.Namespace) -> int:
    client: Client = make_client(args)
    changes = {k: getattr(args, k) for k in ("time", "priority", "gpus", "name")}
    if all(v is None for v in changes.values()):
        raise UsageError("nothing to change: give --time, --priority, --gpus or --name")
    args.jobs = [args.job]
    return _each(args, "updated", lambda job_id: client.update(job_id, **changes))


def add_jobctl_parsers(add: Any) -> None:
    """Register the commands; `add(name, fn, help)` is cli.build_parser's."""
    for name, fn, text in (
        ("hold", cmd_hold, "keep queued jobs from starting (an array id: all its tasks)"),
        ("release", cmd_release, "let held jobs start"),
        ("requeue", cmd_requeue, "stop running jobs and queue them again (no retry counted)"),
    ):
        s = add(name, fn, text)
        s.add_argument("jobs", nargs="+", metavar="JOB")
        s.add_argument("--json", action="store_true")
    s = add("update", cmd_update, "change a queued job (a running one: --time, --name)")
    s.add_argument("job", metavar="JOB")
    s.add_argument("--time", "-t", help="new time limit (a running job's: only an admin raises)")
    s.add_argument("--priority", type=int, help="new user priority (queued jobs)")
    s.add_argument("--gpus", type=int, help="new GPU count (queued jobs)")
    s.add_argument("--name", "-J", help="new name")
    s.add_argument("--json", action="store_true")
