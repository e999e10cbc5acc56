"""Printing a job's output: `mgpu logs [-f]`, `srun` and `submit --interactive`.

Records carry the stream ("o"/"e") and the node.  A job that spans several nodes
gets a `[node001] ` prefix at the start of each line, per node, so lines from
different nodes never run together.

`mgpu logs` shows a record of any job, often another user's to an admin: on a terminal its
control characters are written as escapes (`\x1b`, as the tables do: mgpu.safetext), so an
OSC 52 clipboard write, a new title or a screen clear in it is seen, not obeyed; newlines
and tabs are kept.  Piped, or with `--raw`, it is written as it is (as `kubectl logs` and
`cat` of a Slurm output file do).  `srun` and `submit --interactive` stream the caller's
own job, just submitted, raw: it is their own program talking to their own terminal.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, TextIO

from mgpu import exits
from mgpu.client.api import Client, ConnectError, MgpuError, NoAnswer
from mgpu.client.reopen import Reopens
from mgpu.client.resume import Resume, Rewind


class LinePrefixer:
    """Adds `[node] ` at the start of each line, remembering per (node, stream) where lines end."""

    def __init__(self) -> None:
        self.at_line_start: dict[tuple[str, str], bool] = {}
        self.multi = False

    def label(self, node: str) -> str:
        return f"[{node}] "

    def render(self, node: str, stream: str, text: str) -> str:
        if not self.multi:
            return text
        key = (node, stream)
        start = self.at_line_start.get(key, True)
        prefix = self.label(node)
        out = []
        for piece in text.splitlines(keepends=True):
            out.append((prefix if start else "") + piece)
            start = piece.endswith("\n")
        self.at_line_start[key] = start
        return "".join(out)


def _write(f: TextIO, text: str) -> None:
    f.write(text)
    f.flush()


def escape_output(text: str) -> str:
    """Output made safe for a terminal: each control character escaped but newlines and
    tabs (mgpu.safetext)."""
    if text.isprintable():
        return text
    from mgpu.safetext import escape_controls

    return "\n".join("\t".join(map(escape_controls, line.split("\t"))) for line in text.split("\n"))


def print_logs(client: Client, job_id: str, follow: bool, raw: bool = False) -> int:
    """Both streams to stdout, in the order they came; escaped on a terminal unless `raw`.
    A connection that breaks or goes quiet (the master restarted or stopped, another took
    over) is opened again from the records already printed: none lost, none twice."""
    job = client.show(job_id)
    prefixer = LinePrefixer()
    prefixer.multi = len(job.get("allocation") or []) > 1 or bool(job.get("nodes", 0) or 0) > 1
    escape = not raw and sys.stdout.isatty()
    resume = Resume()  # what was printed: a reconnect asks for what comes after it
    reopens = Reopens(client.failover_wait)
    while True:
        try:
            for rec in client.stream(job_id, follow=follow, since=resume.since(), marks=True):
                reopens.flowed()  # a master answers (a database paused: its memory's)
                if "d" in rec:
                    text = resume.take(rec)
                    if text is None:
                        continue
                    text = escape_output(text) if escape else text
                    _write(sys.stdout, prefixer.render(rec.get("n", ""), rec["s"], text))
                elif "stored" in rec:
                    resume.mark(rec["stored"])
                elif rec.get("end"):
                    return 0
            if not follow or client.show(job_id).get("state") not in ("queued", "running"):
                return 0
            error: MgpuError = ConnectError("the master ended the stream early")
        except Rewind:
            continue
        except (ConnectError, NoAnswer) as e:  # broke midway, or went quiet (a stopped master)
            error = e
        resume.reopen()
        if not reopens.again():
            raise MgpuError(f"{error} (job {job_id} may still be running)") from None


def follow(
    client: Client,
    job_id: str,
    session_timeout: float | None = None,
    max_wait_time: float = 60.0,
    max_consecutive_timeouts: int = 3,
    verbose: bool = False,
) -> int:
    """Stream until the job ends; stdout to stdout, stderr to stderr.  Ctrl-C cancels.

    While the job waits, its queue position and reason are shown: on a terminal as one
    status line rewritten in place; otherwise (stderr is compared by scripts) only with
    `verbose`, as plain lines."""
    status = StatusLine(sys.stderr.isatty(), verbose)
    prefixer = LinePrefixer()
    deadline = None if session_timeout is None else time.monotonic() + session_timeout
    silent = 0
    resume = Resume()  # what was printed, so a reconnect neither repeats nor loses a line
    old_handler = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        while True:
            try:
                records = client.stream(
                    job_id,
                    follow=True,
                    read_timeout=max_wait_time,
                    since=resume.since(),
                    marks=True,
                )
                for rec in records:
                    silent = 0
                    if deadline is not None and time.monotonic() > deadline:
                        print(
                            f"mgpu: session timeout reached; job {job_id} keeps running "
                            f"(mgpu logs -f {job_id})",
                            file=sys.stderr,
                        )
                        return 124
                    if "d" in rec:
                        text = resume.take(rec)
                        if text is None:
                            continue
                        status.clear()
                        if not prefixer.multi and rec.get("n"):
                            prefixer.multi = _is_multi_node(client, job_id)
                        out = sys.stdout if rec["s"] == "o" else sys.stderr
                        _write(out, prefixer.render(rec.get("n", ""), rec["s"], text))
                    elif "stored" in rec:
                        resume.mark(rec["stored"])
                    elif rec.get("end"):
                        status.clear()
                        return _exit_code(rec, job_id)
                    elif "status" in rec:
                        status.update(job_id, rec)
                status.clear()
                job = client.show(job_id)
                if job.get("state") in ("queued", "running"):  # ended early: the master went
                    raise ConnectError("the master ended the stream early")
                return _exit_code(job, job_id)
            except Rewind:
                continue
            except MgpuError as e:
                resume.reopen()
                silent += 1
                if silent >= max_consecutive_timeouts:
                    raise MgpuError(f"{e} (job {job_id} may still be running)") from None
                if isinstance(e, ConnectError):
                    time.sleep(min(2.0, 0.2 * 2**silent))
    except KeyboardInterrupt:
        status.clear()
        try:
            client.cancel(job_id)
            print(f"\nmgpu: cancelled job {job_id}", file=sys.stderr)
        except MgpuError:
            print(f"\nmgpu: could not cancel job {job_id}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_handler)


_multi_cache: dict[str, bool] = {}


def _is_multi_node(client: Client, job_id: str) -> bool:
    if job_id not in _multi_cache:
        job = client.show(job_id)
        _multi_cache[job_id] = len(job.get("allocation") or []) > 1
    return _multi_cache[job_id]


def _status_text(job_id: str, rec: dict[str, Any]) -> str:
    state = rec.get("status")
    reason = rec.get("reason") or ""
    pos = rec.get("position")
    where = f" (position {pos})" if pos else ""
    return f"mgpu: job {job_id} {state}{where}: {reason}".rstrip(": ")


def _status_line(job_id: str, rec: dict[str, Any]) -> None:
    print(_status_text(job_id, rec), file=sys.stderr)


class StatusLine:
    """The waiting job's state on stderr: on a terminal one line rewritten in place (and
    erased once the job runs or prints), else plain lines only when verbose."""

    def __init__(self, tty: bool, verbose: bool) -> None:
        self.tty = tty
        self.verbose = verbose
        self.shown = False

    def update(self, job_id: str, rec: dict[str, Any]) -> None:
        if not self.tty:
            if self.verbose:
                _status_line(job_id, rec)
            return
        if rec.get("status") != "queued":
            self.clear()
            return
        import shutil

        width = shutil.get_terminal_size((80, 24)).columns - 1
        _write(sys.stderr, "\r\x1b[K" + _status_text(job_id, rec)[: max(20, width)])
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            _write(sys.stderr, "\r\x1b[K")
            self.shown = False


def _exit_code(rec: dict[str, Any], job_id: str) -> int:
    state = rec.get("state")
    code = rec.get("exit_code")
    if state == "completed":
        return 0
    reason = rec.get("reason")
    if state != "failed" or code is None:
        print(f"mgpu: job {job_id} {state}" + (f": {reason}" if reason else ""), file=sys.stderr)
    return exits.shell_status(code) if isinstance(code, int) else 1


def run_step(client: Client, job_id: str, host: str, argv: list[str]) -> int:
    """Run a step on `host` inside the job, relay its output, return its exit code."""
    step_id = client.start_step(job_id, host, argv)
    for rec in client.step_stream(step_id):
        if "d" in rec:
            _write(sys.stdout if rec["s"] == "o" else sys.stderr, rec["d"])
        elif rec.get("end"):
            if rec.get("error"):
                print(f"mgpu rsh: {rec['error']}", file=sys.stderr)
            code = rec.get("exit_code")
            return code if isinstance(code, int) and 0 <= code < 256 else 255
    return 255
