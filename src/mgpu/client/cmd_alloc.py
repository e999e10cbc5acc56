"""`mgpu alloc` (Slurm's salloc) and `mgpu srun` inside it: steps, not new jobs.

`mgpu alloc [options] [-- ARGV]` submits a job of kind `allocation`, waits until it is
granted, then runs ARGV (default `$SHELL`) here, on this machine, with `MGPU_JOB_ID`,
`MGPU_NODELIST`, `MGPU_NNODES` and `MGPU_GPU_IDS` (or `MGPU_NODE_GPU_IDS` on several
nodes) set.  `mgpu srun` in ARGV sees `MGPU_JOB_ID` and, that job being an allocation,
runs a step on its nodes and GPUs (master/control/allocations.py).  Meanwhile a thread holds the
allocation's attach WebSocket, saying it is alive every heartbeat: a client that dies
lets the master end the allocation after the node timeout (master/control/sessions.py).  When
ARGV ends the client tells the master its exit code, and the allocation ends completed
(or failed) with it; if the allocation ends first (its time limit, a cancel), ARGV is
told with one line on stderr and keeps running, as with salloc.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from mgpu import exits
from mgpu.client import jsonlite as json
from mgpu.client.api import Client, ConnectError, MgpuError, NoAnswer, RequestError
from mgpu.client.options import UsageError, add_job_options, job_options, make_client

STEP_IGNORES = (
    "gpus",
    "gpu_ids",
    "node_gpu_ids",
    "nodes",
    "gpus_per_node",
    "exclude",
    "gpu_type",
    "policy",
    "distributed",
    "mpi",
    "time",
    "priority",
    "retries",
    "dependency",
    "array",
    "preemptible",
    "image",
)
"""Job options that do not apply to a step: it runs on the allocation's GPUs, as it is."""


def add_alloc_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `alloc` subcommand to an argparse subparsers object."""
    text = "allocate GPUs, then run a command here (default $SHELL); mgpu srun in it runs steps"
    p: argparse.ArgumentParser = sub.add_parser("alloc", help=text, description=text)
    p.set_defaults(fn=cmd_alloc)
    add_job_options(p)
    # salloc's `slurm` block (mgpu.slurm.salloc), as JSON: not a user's option.
    p.add_argument("--slurm-block", help=argparse.SUPPRESS)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="[-- ARGV...] (default $SHELL)")
    return p


def _say(text: str) -> None:
    # One write of the whole line: the allocation's command and its steps share this
    # stderr, and with PYTHONUNBUFFERED print() writes the newline apart.
    sys.stderr.write(f"mgpu: {text}\n")
    sys.stderr.flush()


# ---- mgpu alloc ---------------------------------------------------------------------


class Holder:
    """Holds the allocation from a thread: its attach WebSocket (no output, only states),
    a heartbeat every interval, and reconnects while the master is away."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.job_id = job_id
        self.granted = threading.Event()
        self.ended = threading.Event()
        self.allocation: list[dict[str, Any]] = []
        self.end: dict[str, Any] = {}
        self.error: MgpuError | None = None
        self._queued_said = False
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._hold, name="mgpu-alloc", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)

    def _hold(self) -> None:
        failures = 0
        while not self.ended.is_set():
            try:
                ws = self.client.attach(self.job_id, output=False)
            except RequestError as e:  # refused (the job is gone, not ours): nothing to hold
                self.error = e
                self.ended.set()
                return
            except MgpuError:
                failures += 1
                if self._stopped(min(2.0, 0.2 * failures)):
                    return
                continue
            failures = 0
            try:
                if self._converse(ws):
                    return
            except OSError:
                pass
            finally:
                ws.close()
            if self._stopped(0.2):
                return

    def _stopped(self, wait: float) -> bool:
        ready, _, _ = select.select([self._stop_r], [], [], wait)
        return bool(ready)

    def _converse(self, ws: Any) -> bool:
        """Until the allocation ends or we are stopped (True), or the connection breaks."""
        heartbeat = 5.0
        last = time.monotonic()
        while True:
            wait = 0.0 if ws.buffered() else max(0.0, last + heartbeat / 2 - time.monotonic())
            ready, _, _ = select.select([ws, self._stop_r], [], [], wait)
            if self._stop_r in ready:
                return True
            if time.monotonic() - last >= heartbeat / 2:
                ws.send_text('{"hb":1}')
                last = time.monotonic()
            if ws not in ready and not ws.buffered():
                continue
            for _, payload in ws.feed():
                for line in payload.split(b"\n"):
                    if not line.strip():
                        continue
                    rec = json.loads(line)
                    if "attached" in rec:
                        heartbeat = float(rec.get("heartbeat") or 5.0)
                    elif self._record(rec):
                        return True
            if ws.closed:
                return False

    def _record(self, rec: dict[str, Any]) -> bool:
        if rec.get("started") and not self.granted.is_set():
            self.allocation = list(rec.get("allocation") or [])
            self.granted.set()
        elif rec.get("status") == "queued" and not self._queued_said:
            self._queued_said = True
            _say(f"job {self.job_id} queued and waiting for resources")
        elif rec.get("end"):
            self.end = rec
            if self.granted.is_set() and not self.ended.is_set():
                why = f": {rec['reason']}" if rec.get("reason") else ""
                _say(
                    f"job allocation {self.job_id} has ended ({rec.get('state')}{why}); "
                    "its steps were stopped"
                )
            self.ended.set()
            return True
        return False


def _granted_text(job_id: str, allocation: list[dict[str, Any]]) -> str:
    places = []
    for slot in allocation:
        ids = slot.get("gpu_ids") or []
        gpus = f"GPUs {','.join(map(str, ids))}" if ids else "no GPUs"
        places.append(f"{slot.get('node_id')} ({gpus})")
    return f"allocation {job_id} granted on {', '.join(places)}"


def allocation_env(job_id: str, allocation: list[dict[str, Any]]) -> dict[str, str]:
    """What ARGV gets besides this environment (no CUDA_VISIBLE_DEVICES: this machine is
    not the GPU node; steps get it there)."""
    env = {
        "MGPU_JOB_ID": job_id,
        "MGPU_NODELIST": ",".join(str(s["node_id"]) for s in allocation),
        "MGPU_NNODES": str(len(allocation)),
    }
    if len(allocation) == 1:
        env["MGPU_GPU_IDS"] = ",".join(map(str, allocation[0].get("gpu_ids") or []))
    else:
        env["MGPU_NODE_GPU_IDS"] = ";".join(
            f"{s['node_id']}:{','.join(map(str, s.get('gpu_ids') or []))}" for s in allocation
        )
    return env


def cmd_alloc(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and not argv[0].strip():
        raise UsageError("the command after -- is empty")
    argv = argv or [os.environ.get("SHELL") or "/bin/sh"]
    client = make_client(args)
    opts = job_options(args)
    if getattr(args, "slurm_block", None):
        opts["slurm"] = _slurm_block(args.slurm_block)
    job = client.submit(argv, allocation=True, **opts)
    for warning in job.warnings:
        _say(f"warning: {warning}")
    holder = Holder(client, job.id)
    holder.start()
    try:
        while not (holder.granted.wait(0.2) or holder.ended.is_set()):
            pass
    except KeyboardInterrupt:
        holder.stop()
        try:
            client.cancel(job.id)
            _say(f"job allocation {job.id} has been revoked")
        except MgpuError:
            _say(f"could not cancel job {job.id}")
        return 130
    if not holder.granted.is_set():
        holder.stop()
        if holder.error is not None:
            raise holder.error
        end = holder.end
        why = f": {end['reason']}" if end.get("reason") else ""
        raise MgpuError(
            f"job allocation {job.id} ended before it started ({end.get('state')}{why})"
        )
    _say(_granted_text(job.id, holder.allocation))
    code = _run_here(argv, {**os.environ, **allocation_env(job.id, holder.allocation)})
    ended_first = holder.ended.is_set()
    holder.stop()
    if not ended_first:
        _release(client, job.id, code)
    return code


def _slurm_block(text: str) -> dict[str, Any]:
    try:
        block = json.loads(text)
    except ValueError:
        block = None
    if not isinstance(block, dict):
        raise UsageError("--slurm-block must be a JSON object (salloc's options)")
    return block


def _run_here(argv: list[str], env: dict[str, str]) -> int:
    """ARGV in the foreground, as salloc runs it: Ctrl-C and Ctrl-\\ are its (no-op
    handlers here, which its exec resets); a hangup or SIGTERM is passed on to it."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as e:
        _say(f"error: cannot run {argv[0]}: {e.strerror}")
        return 127 if isinstance(e, FileNotFoundError) else 126

    def forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    handled = {
        signal.SIGINT: lambda s, f: None,
        signal.SIGQUIT: lambda s, f: None,
        signal.SIGTERM: forward,
        signal.SIGHUP: forward,
    }
    old = {s: signal.signal(s, h) for s, h in handled.items()}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return exits.shell_code(rc)


def _release(client: Client, job_id: str, code: int) -> None:
    """Tell the master ARGV ended (retried a little while it is unreachable)."""
    for attempt in range(5):
        try:
            client.end_allocation(job_id, code)
            _say(f"relinquishing job allocation {job_id}")
            return
        except ConnectError:
            time.sleep(0.5 * (attempt + 1))
        except MgpuError as e:
            _say(f"could not end job allocation {job_id}: {e}")
            return
    _say(f"could not reach the master: job allocation {job_id} ends once it misses this client")


# ---- mgpu srun --pty, and inside an allocation ---------------------------------------


def srun_special(client: Client, args: argparse.Namespace, argv: list[str]) -> int | None:
    """`srun --pty`, or `srun` inside an allocation (a step): the exit code; None for a
    plain srun (a new job, its output streamed)."""
    if args.pty and not sys.stdin.isatty():
        _say("warning: not using a pseudo-terminal, stdin is not a terminal")
        args.pty = False  # as srun: it goes on without one
    code = srun_in_allocation(client, args, argv)
    if code is not None or not args.pty:
        return code
    from mgpu.client.terminal import run_terminal, terminal_size

    opts = job_options(args)
    opts.update(interactive=True, pty=True, pty_size=terminal_size(sys.stdin.fileno()))
    job = client.submit(argv, **opts)
    for warning in job.warnings:
        _say(f"warning: {warning}")
    return run_terminal(client, job.id, verbose=bool(args.verbose))


def srun_in_allocation(client: Client, args: argparse.Namespace, argv: list[str]) -> int | None:
    """`mgpu srun` inside `mgpu alloc` (`$MGPU_JOB_ID` names an allocation) or a Slurm batch
    job: run a step there and return its exit code; None when not inside one (a new job)."""
    job_id = os.environ.get("MGPU_JOB_ID")
    if not job_id:
        return None
    try:
        job = client.show(job_id)
    except RequestError as e:
        if e.status == 404:
            return None
        raise
    batch = bool((job.get("slurm") or {}).get("batch"))  # sbatch's script: srun is a step
    if job.get("kind") != "allocation" and not batch:
        return None
    if job.get("state") != "running":
        raise MgpuError(
            f"job allocation {job_id} is {job.get('state')}: it runs no more steps "
            "(leave its shell, or unset MGPU_JOB_ID for a new job)"
        )
    # (0 counts as not given: --priority defaults to it.)
    given = ["--" + k.replace("_", "-") for k in STEP_IGNORES if getattr(args, k, None)]
    if given:
        _say(
            f"warning: a step runs on allocation {job_id}'s GPUs as they are; "
            f"ignored: {', '.join(given)}"
        )
    pty = bool(getattr(args, "pty", False))
    if batch:
        from mgpu.client.steps import StepOptions, run_step

        return run_step(argv, StepOptions(nodelist=args.nodelist, pty=pty, job_id=job_id), client)
    from mgpu.client.terminal import terminal_size

    res = client.start_alloc_step(
        job_id,
        argv,
        nodelist=args.nodelist,
        pty=pty or None,
        pty_size=terminal_size(sys.stdin.fileno()) if pty else None,
    )
    step_id, nodes = str(res["step_id"]), list(res.get("nodes") or [])
    if pty:
        from mgpu.client.terminal import run_terminal

        return run_terminal(client, step_id, step=True)
    return follow_step(client, step_id, multi=len(nodes) > 1)


def follow_step(client: Client, step_id: str, multi: bool) -> int:
    """A step's output as srun's (stdout and stderr apart, `[node] ` when on several
    nodes); Ctrl-C kills the step.  Its exit code.  A connection that breaks (the master
    restarted, another took over) is opened again from the start, what was shown dropped
    by its offsets (`Resume.from_start`): none lost, none twice."""
    from mgpu.client.reopen import Reopens
    from mgpu.client.resume import Resume
    from mgpu.client.stream import LinePrefixer

    prefixer = LinePrefixer()
    prefixer.multi = multi
    resume = Resume()
    reopens = Reopens(client.failover_wait)
    try:
        while True:
            try:
                for rec in client.step_stream(step_id, since=resume.since()):
                    if "d" in rec:
                        reopens.flowed()
                        text = resume.take(rec)
                        if text is None:
                            continue
                        out = sys.stdout if rec.get("s") == "o" else sys.stderr
                        out.write(prefixer.render(rec.get("n", ""), rec["s"], text))
                        out.flush()
                    elif rec.get("end"):
                        if rec.get("error"):
                            _say(f"step {step_id}: {rec['error']}")
                        code = rec.get("exit_code")
                        return code if isinstance(code, int) and 0 <= code < 256 else 255
                error: MgpuError = ConnectError("the master ended the step's stream")
            except (ConnectError, NoAnswer) as e:  # broke, or went quiet (another leads now)
                error = e
            resume.from_start()
            if not reopens.again():
                _say(f"lost step {step_id}: {error}")
                return 255
    except KeyboardInterrupt:
        try:
            client.cancel_step(step_id)
            _say(f"cancelled step {step_id}")
        except MgpuError:
            _say(f"could not cancel step {step_id}")
        return 130
