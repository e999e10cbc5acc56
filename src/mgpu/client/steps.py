"""`srun` inside a job: a step on the job's allocation, never a new job.

`run_step(argv, options)` is what Slurm's `srun` runs inside a job (a batch job, an
allocation: `$MGPU_JOB_ID` names it): it asks the master for a step of tasks on the job's
nodes (master/control/srun.py), prints their output as srun does (stdout and stderr apart,
`-l`: each line after its task's id, `0: `), says which tasks failed
(`srun: error: node1: task 1: Exited with exit code 3`) and returns the highest task exit
code.  Ctrl-C or SIGTERM kill the step.  A step the job cannot hold is refused with srun's
sentence (`srun: error: Unable to create step for job 12: More processors requested than
permitted`), exit code 1.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from mgpu.client.api import Client, ConnectError, MgpuError, NoAnswer, _quote
from mgpu.client.render import _ranges
from mgpu.client.reopen import Reopens
from mgpu.client.resume import Resume
from mgpu.client.stream import LinePrefixer
from mgpu.client.submitenv import portable_environment, step_environment

__all__ = ["StepOptions", "current_job", "run_step"]


class StepOptions:
    """srun's options that shape a step (None: srun's default inside a job).  A plain
    class: importing dataclasses costs the CLI's start-up."""

    __slots__ = (
        "container",
        "cpus_per_task",
        "cwd",
        "export",
        "gpu_bind",
        "gpus_per_task",
        "image",
        "job_id",
        "kill_on_bad_exit",
        "label",
        "nodelist",
        "nodes",
        "ntasks",
        "ntasks_per_node",
        "pty",
    )

    def __init__(
        self,
        *,
        nodes: int | None = None,
        ntasks: int | None = None,
        ntasks_per_node: int | None = None,
        nodelist: str | None = None,
        gpus_per_task: int | None = None,
        cpus_per_task: int | None = None,
        label: bool = False,
        kill_on_bad_exit: bool = False,
        pty: bool = False,
        cwd: str | None = None,
        job_id: str | None = None,
        gpu_bind: str | None = None,
        export: str | None = None,
        image: str | None = None,
        container: dict[str, Any] | None = None,
    ) -> None:
        self.nodes = nodes  # -N/--nodes
        self.ntasks = ntasks  # -n/--ntasks
        self.ntasks_per_node = ntasks_per_node
        self.nodelist = nodelist  # -w/--nodelist: a,b or node[1-2]
        self.gpus_per_task = gpus_per_task
        self.cpus_per_task = cpus_per_task  # -c/--cpus-per-task
        self.label = label  # -l/--label
        self.kill_on_bad_exit = kill_on_bad_exit  # -K/--kill-on-bad-exit
        self.pty = pty
        self.cwd = cwd  # -D/--chdir; None: this directory
        self.job_id = job_id  # --jobid; None: $MGPU_JOB_ID
        self.gpu_bind = gpu_bind  # --gpu-bind; None: the job's (mgpu.gpubind)
        self.export = export  # --export; None: ALL (`submitenv.step_environment`)
        self.image = image  # pyxis's --container-image, as the runtime names it
        self.container = container  # its other options (mgpu.containeropts)


def current_job() -> str | None:
    """The job this process runs in (its steps' home), or None outside any job."""
    return os.environ.get("MGPU_JOB_ID") or None


def _say(text: str) -> None:
    """srun's own line (its words may quote the master's, which quote users'): written
    as every Slurm command's are (mgpu.textout)."""
    from mgpu import textout

    textout.err(f"srun: {text}")


def run_step(argv: list[str], options: StepOptions, client: Client | None = None) -> int:
    """Run `argv` as a step of the current job (see the module docstring): its exit code."""
    job_id = options.job_id or current_job()
    if not job_id:
        _say("error: not inside a job ($MGPU_JOB_ID is not set)")
        return 1
    try:
        client = client or Client()
    except MgpuError as e:  # $MGPU_MASTER unreadable
        _say(f"error: {e}")
        return 1
    pty = options.pty and sys.stdin.isatty()
    if options.pty and not pty:
        _say("warning: not using a pseudo-terminal, stdin is not a terminal")
    body: dict[str, Any] = {
        "argv": list(argv),
        "env": portable_environment(step_environment(os.environ, options.export))[0],
        "cwd": options.cwd or os.getcwd(),
        "nodes": options.nodes,
        "ntasks": options.ntasks,
        "ntasks_per_node": options.ntasks_per_node,
        "nodelist": options.nodelist,
        "gpus_per_task": options.gpus_per_task,
        "cpus_per_task": options.cpus_per_task,
        "gpu_bind": options.gpu_bind,
        "kill_on_bad_exit": options.kill_on_bad_exit or None,
        "pty": pty or None,
        "image": options.image,
        "container": options.container,
    }
    if pty:
        from mgpu.client.terminal import terminal_size

        body["pty_size"] = terminal_size(sys.stdin.fileno())
    body = {k: v for k, v in body.items() if v is not None}
    try:
        started = client._request("POST", f"/api/jobs/{_quote(job_id)}/srun", body)
    except MgpuError as e:  # refused (srun's sentence), or no master
        _say(f"error: {e}")
        return 1
    for warning in started.get("warnings") or []:
        _say(f"Warning: {warning}")
    for task in started.get("tasks") or []:  # --gpu-bind=verbose,: each task's binding
        if task.get("gpu_bind"):
            prefix = f"{task['task']}: " if options.label else ""
            sys.stderr.write(f"{prefix}{task['gpu_bind']}\n")
    sys.stderr.flush()
    if pty:
        from mgpu.client.terminal import run_terminal

        return run_terminal(client, str(started["tasks"][0]["run_id"]), step=True)
    tasks = [int(t["task"]) for t in started["tasks"]]
    return follow(client, str(started["step_id"]), tasks, options.label)


class Labeller(LinePrefixer):
    """`-l`: each line after its task's id (`0: `, padded to the widest id, as srun)."""

    def __init__(self, ntasks: int, on: bool) -> None:
        super().__init__()
        self.multi = on
        self.width = len(str(max(0, ntasks - 1)))

    def label(self, node: str) -> str:
        return f"{node:>{self.width}}: "


def follow(client: Client, step_id: str, tasks: list[int] | int, label: bool) -> int:
    """Print the step's output until it ends: its exit code (130 if interrupted).  A
    connection that breaks (the master restarted, another took over) is opened again
    from the start, what each task already printed dropped by its offsets
    (`Resume.from_start`): none lost, none twice, however the new master cut them; it is
    opened again through a failover or a single master's restart (`Reopens`)."""
    numbers = list(range(tasks)) if isinstance(tasks, int) else list(tasks)
    labeller = Labeller(max(numbers, default=0) + 1, label)
    shown = {t: Resume() for t in numbers}
    base = f"/api/sruns/{_quote(step_id)}/output"
    old = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    reopens = Reopens(client.failover_wait)
    try:
        while True:
            counts = [shown[t].since() if t in shown else 0 for t in numbers]
            path = base + (f"?since={','.join(map(str, counts))}" if any(counts) else "")
            try:
                for rec in client._stream_path(path, read_timeout=3600 * 24):
                    if "d" in rec:
                        task = int(rec.get("t", 0))
                        text = shown.setdefault(task, Resume()).take(rec)
                        reopens.flowed()
                        if text is None:
                            continue
                        out = sys.stdout if rec.get("s") == "o" else sys.stderr
                        out.write(labeller.render(str(task), rec["s"], text))
                        out.flush()
                    elif rec.get("end"):
                        return _ended(step_id, rec)
                error: MgpuError = ConnectError("the master ended its stream")
            except (ConnectError, NoAnswer) as e:  # broke, or went quiet (another leads now)
                error = e
            for resume in shown.values():
                resume.from_start()
            if not reopens.again():
                _say(f"error: lost step {step_id}: {error}")
                return 1
    except KeyboardInterrupt:
        try:
            client._request("POST", f"/api/sruns/{_quote(step_id)}/cancel")
            _say("Job step aborted")
        except MgpuError:
            _say(f"error: could not cancel step {step_id}")
        return 130
    except MgpuError as e:  # the master forgot the step (a new one that never knew it)
        _say(f"error: lost step {step_id}: {e}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, old)


def _ended(step_id: str, rec: dict[str, Any]) -> int:
    """srun's lines about the step's end: its exit code."""
    lines = failures(rec.get("tasks") or [])
    for line in lines:
        _say(f"error: {line}")
    if rec.get("error") and not lines:
        _say(f"error: step {step_id}: {rec['error']}")
    if any(t.get("out_of_memory") for t in rec.get("tasks") or []):
        return 1  # as Slurm's srun after a task's "Out Of Memory"
    code = rec.get("exit_code")
    return code if isinstance(code, int) and 0 <= code < 256 else 1


def failures(tasks: list[dict[str, Any]]) -> list[str]:
    """srun's lines for the tasks that failed, those of one node and outcome together:
    `node1: tasks 0-1: Exited with exit code 3`, `node2: task 2: Killed`."""
    groups: dict[tuple[str, str], list[int]] = {}
    for t in tasks:
        code = t.get("exit_code")
        if t.get("out_of_memory"):
            what = "Out Of Memory"
        elif code == 0:
            continue
        elif code is None:  # never ran, or lost: why, as the master knows it
            what = str(t.get("error") or "Unknown exit code")
        elif code > 128:
            what = signal.strsignal(code - 128) or f"Signal {code - 128}"
        else:
            what = f"Exited with exit code {code}"
        groups.setdefault((str(t.get("host")), what), []).append(int(t["task"]))
    lines = []
    for (host, what), ids in groups.items():
        word = "task" if len(ids) == 1 else "tasks"
        lines.append(f"{host}: {word} {_ranges(ids)}: {what}")
    return lines
