"""The job options of sbatch, salloc and srun: Slurm's names, where each comes from
(`#SBATCH` lines < `SBATCH_*` variables < the command line), and what they ask of mgpu:
the `submit` fields, the `slurm` block (the README, "Your Slurm scripts, unchanged"), and
warnings for the rest."""

from __future__ import annotations

import os

from mgpu.gpurequest import lay_over
from mgpu.slurm import begintime, optable, opts, output
from mgpu.slurm import resources as slurm_resources
from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

JOB_OPTIONS = optable.options("sbatch")
"""sbatch's options (and `#SBATCH` lines'); `optable.options(PROG)` another command's."""
GPU_OPTIONS = tuple(sorted(optable.names("sbatch", "gpu")))
"""One GPU request, however it is spelt: a layer that names one replaces the one below
(mgpu.gpurequest)."""


class Merged(dict[str, str]):
    """Every option's value, and which of them an input variable (`SBATCH_MEM_PER_NODE`
    ...) gave: Slurm's memory options obey a rule of their own about those."""

    def __init__(self) -> None:
        super().__init__()
        self.from_env: set[str] = set()


def layer(into: dict[str, str], found: list[tuple[str, str]]) -> None:
    """Options of one source over those below it (`--requeue` and `--no-requeue` undo each
    other; a GPU request replaces the one below whole)."""
    lay_over(into, {n: v for n, v in found if n in GPU_OPTIONS}, GPU_OPTIONS)
    for name, value in found:
        if name in GPU_OPTIONS:
            continue
        if name in ("requeue", "no-requeue"):
            into.pop("no-requeue" if name == "requeue" else "requeue", None)
        into[name] = value


def directive_options(prog: str, text: str) -> list[tuple[str, str]]:
    """The options of a script's leading `#SBATCH` lines, in order."""
    from mgpu.client import directives

    found = directives.scan(text)
    if found.error is not None:
        raise fail(prog, f"batch script {found.error}")
    out: list[tuple[str, str]] = []
    for d in found.directives:
        if d.source != directives.SBATCH:
            continue
        options, stray = opts.parse(prog, d.words, JOB_OPTIONS)
        if stray:
            raise fail(prog, f"Invalid directive found in batch script: {d.text}")
        out += options
    return out


def merged(
    prog: str,
    script: str | None,
    command_line: list[tuple[str, str]],
    environ: Mapping[str, str],
) -> dict[str, str]:
    """Every option's value with Slurm's precedence: the command line over the SBATCH_*
    variables over the script's `#SBATCH` lines, a later line over an earlier one."""
    values = Merged()
    if script is not None:
        for name, value in directive_options(prog, script):
            layer(values, [(name, value)])
    from_env = optable.env_options(prog, environ)
    layer(values, from_env)
    values.from_env = {name for name, _ in from_env}
    layer(values, command_line)
    values.from_env -= {name for name, _ in command_line}
    return values


# ---- what the options ask of mgpu ---------------------------------------------------


def _count(prog: str, option: str, text: str) -> tuple[str | None, int]:
    """`[TYPE:]N` of --gpus and --gpus-per-*: (type, N)."""
    kind, _, count = text.rpartition(":")
    if not count.isdigit():
        raise fail(prog, f"Invalid --{option} specification: {text}")
    return kind or None, int(count)


def _gres(
    prog: str, text: str, ignored: list[str], out: dict[str, Any]
) -> tuple[str | None, int | None]:
    """`--gres=gpu[:TYPE][:N][,other...]`: the GPUs per node; `mps:N` (N of one GPU's
    100) mgpu's `gpu_share` N/100, set in `out`; other resources ignored."""
    kind, count = None, None
    for item in text.split(","):
        parts = item.strip().split(":")
        if parts == ["none"] or parts == [""]:
            continue
        if parts[0] == "mps" and len(parts) == 2 and parts[1].isdigit() and 0 < int(parts[1]) < 100:
            out["gpu_share"], count = int(parts[1]) / 100, 1
            continue
        if parts[0] != "gpu":
            ignored.append(f"--gres={item}")
            continue
        if len(parts) > 3 or (len(parts) == 3 and not parts[2].isdigit()):
            raise fail(prog, f"Invalid generic resource (gres) specification: {text}")
        if len(parts) >= 2 and parts[-1].isdigit():
            count = int(parts[-1])
            kind = parts[1] if len(parts) == 3 else None
        else:
            count, kind = 1, parts[1] if len(parts) == 2 else None
    return kind, count


def _int(prog: str, option: str, text: str | None, low: int = 1) -> int | None:
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < low:
        raise fail(prog, f'Invalid numeric value "{text}" for --{option}.')
    return int(text)


def _nodes(prog: str, text: str | None) -> int | None:
    """`-N 2` or Slurm's `-N 2-4` (min-max): mgpu allocates exactly the minimum."""
    if text is None:
        return None
    low = text.partition("-")[0].partition(":")[0]
    if not low.isdigit() or int(low) < 1:
        raise fail(prog, f'"{text}" is not a valid node count')
    return int(low)


def gpu_request(prog: str, values: dict[str, str], ignored: list[str]) -> dict[str, Any]:
    """mgpu's GPU fields from --gres/--gpus/--gpus-per-node/--gpus-per-task and -N/-n:
    `gpus` on one node, `nodes` and `gpus_per_node` on several; no GPU option, no GPU."""
    nodes = _nodes(prog, values.get("nodes")) or 1
    ntasks = _int(prog, "ntasks", values.get("ntasks"))
    per_node_tasks = _int(prog, "ntasks-per-node", values.get("ntasks-per-node"))
    kind = None
    per_node: int | None = None
    total: int | None = None
    out: dict[str, Any] = {}
    if values.get("gpus-per-task") is not None:
        kind, per_task = _count(prog, "gpus-per-task", values["gpus-per-task"] or "")
        tasks = ntasks or nodes * (per_node_tasks or 1)
        total = per_task * tasks
        per_node = per_task * (per_node_tasks or -(-tasks // nodes))
    elif values.get("gpus-per-node") is not None:
        kind, per_node = _count(prog, "gpus-per-node", values["gpus-per-node"] or "")
    elif values.get("gres") is not None:
        kind, per_node = _gres(prog, values["gres"] or "", ignored, out)
    elif values.get("gpus") is not None:
        kind, total = _count(prog, "gpus", values["gpus"] or "")
        if nodes > 1 and total % nodes:
            raise fail(
                prog,
                f"--gpus={total} cannot be shared evenly by {nodes} nodes: mgpu gives "
                "every node of a job the same GPUs (use --gpus-per-node)",
            )
        per_node = total // nodes
    out["gpu_type"] = kind
    if nodes > 1:
        out.update(nodes=nodes, gpus_per_node=per_node or 0)
    else:
        out["gpus"] = per_node if per_node is not None else (total or 0)
    return out


def export_env(prog: str, text: str | None, environ: Mapping[str, str]) -> dict[str, str] | None:
    """`--export`: None for ALL (the client sends this environment), else the variables:
    NONE = none of them, `ALL,X=1` = all and these, `X,Y=2` = only these."""
    if text is None or text.strip().upper() == "ALL":
        return None
    items = [i for i in text.split(",") if i]
    base: dict[str, str] = {}
    extra: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if name.upper() == "ALL" and not eq:
            base = dict(environ)
        elif name.upper() == "NONE" and not eq:
            continue
        elif eq:
            extra[name] = value
        elif name in environ:
            extra[name] = environ[name]
    env = {**base, **extra}
    if base:
        from mgpu.client.submitenv import portable_environment

        env = portable_environment(env)[0]
    return env


def dependency(prog: str, text: str | None, singleton: list[str]) -> str | None:
    """mgpu's dependency from Slurm's: afterok/afterany/afternotok as they are, and
    `singleton` as afterany on the ids given (this user's active jobs of the same name)."""
    if text is None or not text.strip():
        return None
    if "?" in text:
        raise fail(
            prog, "Batch job submission failed: Job dependency problem ('?' is not supported)"
        )
    parts: list[str] = []
    for item in text.split(","):
        kind, _, ids = item.strip().partition(":")
        kind = kind.lower()
        if kind == "singleton":
            if singleton:
                parts.append("afterany:" + ":".join(singleton))
            continue
        if kind not in ("afterok", "afterany", "afternotok") or not ids or "+" in ids:
            raise fail(prog, f"Batch job submission failed: Job dependency problem ({item})")
        parts.append(f"{kind}:{ids}")
    return ",".join(parts) or None


def begin(prog: str, text: str | None) -> float | None:
    """`--begin`'s epoch time (sbatch only: mgpu's srun and alloc start at once, and a
    begin time they dropped would change when the job runs)."""
    if text is None:
        return None
    if prog != "sbatch":
        raise fail(prog, f"--begin is not supported by mgpu's {prog}; use sbatch --begin")
    try:
        return begintime.parse_begin(text, begintime.now())
    except ValueError as e:
        raise fail(prog, f"Invalid time specification (--begin={text}): {e}") from None


def submit_fields(
    prog: str,
    values: dict[str, str],
    environ: Mapping[str, str],
    cwd: str,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(the submit fields mgpu has, the `slurm` block, warnings) of the options (the block
    goes with the job, or becomes `mgpu srun`'s own options: `resources.own_words`)."""
    for name in sorted(optable.names(prog, "refuse") & values.keys()):
        raise fail(prog, optable.REFUSED[name])
    ignored: list[str] = []
    fields = gpu_request(prog, values, ignored)
    for option, field in optable.fields(prog).items():
        fields[field] = values.get(option)
    fields["hold"] = True if "hold" in values else None
    fields["begin"] = begin(prog, values.get("begin"))
    if values.get("priority") is not None:
        fields["priority"] = _int(prog, "priority", values["priority"], low=0)
    if "no-requeue" in values:
        fields["retries"] = 0
    if values.get("chdir"):
        fields["cwd"] = os.path.normpath(
            os.path.join(cwd, os.path.expanduser(values["chdir"] or ""))
        )
    fields["env"] = export_env(prog, values.get("export"), environ)
    exported = values.get("export")
    if exported is not None and exported.strip().upper() == "ALL":
        exported = None  # srun's default: not passed on (as sbatch's SLURM_EXPORT_ENV)
    bind = values.get("gpu-bind")
    if bind is not None:
        from mgpu import gpubind  # (only when given: the CLI starts fast)

        try:
            gpubind.parse(bind)
        except ValueError as e:
            raise fail(prog, str(e)) from None
    kill = values.get("kill-on-invalid-dep")
    if kill is not None and kill.lower() not in ("yes", "no"):
        raise fail(prog, "Invalid --kill-on-invalid-dep specification")
    mode = values.get("open-mode")
    if mode is not None and mode not in ("append", "truncate"):
        raise fail(prog, "Invalid --open-mode specification")
    block = {
        "ntasks": _int(prog, "ntasks", values.get("ntasks")),
        "ntasks_per_node": _int(prog, "ntasks-per-node", values.get("ntasks-per-node")),
        "cpus_per_task": _int(prog, "cpus-per-task", values.get("cpus-per-task")),
        "gpus_per_task": (
            _count(prog, "gpus-per-task", values["gpus-per-task"] or "")[1]
            if values.get("gpus-per-task") is not None
            else None
        ),
        "partition": values.get("partition"),
        "output": values.get("output"),
        "error": values.get("error"),
        "open_mode": mode or "truncate",
    }
    block.update(_cpus_memory(prog, values, ignored))
    # Only when given: a master of an older mgpu refuses keys it does not know.
    for option, key in (("gpus", "gpus"), ("gpus-per-node", "gpus_per_node")):
        if values.get(option) is not None:  # SLURM_GPUS, SLURM_GPUS_PER_NODE
            block[key] = _count(prog, option, values[option] or "")[1]
    if bind is not None:
        block["gpu_bind"] = bind
    if kill is not None and kill.lower() == "yes":
        block["kill_invalid_dep"] = True
    if exported:
        block["export_env"] = environ.get("SLURM_EXPORT_ENV", exported)
    warnings = []
    warned = optable.names(prog, "warn")
    ignored += [f"--{n}" for n in values if n in warned]
    if ignored:
        warnings.append(f"ignored: {' '.join(ignored)}")
    return {k: v for k, v in fields.items() if v is not None}, block, warnings


def _cpus_memory(prog: str, values: Mapping[str, str], ignored: list[str]) -> dict[str, Any]:
    """The slurm block's CPU and memory keys (mgpu.slurm.resources: Slurm's checks); the
    newer ones only when given, for a master of an older mgpu."""
    per_gpu = _int(prog, "cpus-per-gpu", values.get("cpus-per-gpu"))
    if per_gpu is not None and values.get("cpus-per-task") is not None:
        raise fail(prog, slurm_resources.CPUS_EXCLUSIVE)
    from_env = values.from_env if isinstance(values, Merged) else set()
    memory = slurm_resources.memory_option(prog, values, from_env)
    out: dict[str, Any] = {"mem_per_node_mb": None, "mem_per_cpu_mb": None}
    if memory is not None:
        key = {"mem": "mem_per_node_mb", "mem-per-cpu": "mem_per_cpu_mb"}
        out[key.get(memory, "mem_per_gpu_mb")] = slurm_resources.memory_mb(
            prog, memory, values[memory]
        )
    whole, note = slurm_resources.exclusive(prog, values.get("exclusive"))
    if note is not None:
        ignored.append(note)
    if per_gpu is not None:
        out["cpus_per_gpu"] = per_gpu
    if whole:
        out["exclusive"] = True
    return out


_WORDS = {
    "gpus": "--gpus",
    "nodes": "--nodes",
    "gpus_per_node": "--gpus-per-node",
    "gpu_type": "--gpu-type",
    "name": "--name",
    "time": "--time",
    "nodelist": "--nodelist",
    "exclude": "--exclude",
    "reservation": "--reservation",
    "priority": "--priority",
    "dependency": "--dependency",
    "signal": "--signal",
    "retries": "--retries",
}


def mgpu_words(fields: dict[str, Any]) -> list[str]:
    """The submit fields as `mgpu srun`/`mgpu alloc` options (those they have)."""
    words: list[str] = []
    for key, flag in _WORDS.items():
        if fields.get(key) is not None:
            words += [flag, str(fields[key])]
    if fields.get("hold"):
        words.append("--hold")
    return words


def exec_mgpu(words: list[str]) -> int:
    """Become `mgpu WORDS...` (this Python, this mgpu: also from the bin dir's copy)."""
    import sys

    lib = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from mgpu.client.cli import main; main()"
    )
    output.flush()
    os.execv(sys.executable, [sys.executable, "-I", "-c", code, lib, *words])
    return 127  # not reached
