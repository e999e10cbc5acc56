"""`mgpu pod-init -- COMMAND...`: the job's first process in a Pod that runs a pod agent
(a partition with `kubernetes.steps`), as `tini` is for many images.

Kubernetes reports a container killed by signal N as exit code 128+N, the same as a
program that exits with 128+N: a batch script killed by SIGKILL read as `137:0`, where
Slurm (and mgpu's own nodes) say `0:9`.  This process runs the job's command as its child,
with the signals at their defaults; sends on each signal it is sent itself (the kubelet's
SIGTERM of a cancel) to the child, or under the -o/-e runner to the batch script (`top`);
and writes how the child ended to the container's termination message (`-9`: killed by
signal 9; else its exit code), which the master reads beside the exit code
(mgpu.master.kube.runs.container_end).  It then exits as a shell would, 128+N.  Its
environment marks it (`POD_INIT_MARK`) so that the pod agent never signals it (its child
is the job's top process); the child's environment does not carry the mark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from mgpu.exits import POD_INIT_MARK
from mgpu.podagent import jobsignal

__all__ = ["MESSAGE_PATH", "main"]

MESSAGE_PATH = "/dev/termination-log"
"""The container's termination message: the kubelet's default `terminationMessagePath`,
a file it makes writable by any user."""
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGCONT,
    signal.SIGWINCH,
)


def main(argv: list[str]) -> int:
    """Run `argv` (after an optional `--`) to its end; the shell's status of it."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("mgpu pod-init: no command\n")
        return 2
    name = POD_INIT_MARK.partition("=")[0]
    env = {k: v for k, v in os.environ.items() if k != name}
    try:
        child = subprocess.Popen(argv, env=env, close_fds=False)
    except OSError as e:
        sys.stderr.write(f"{argv[0]}: {e.strerror}\n")
        code = 127 if isinstance(e, FileNotFoundError) else 126
        _tell(str(code))
        return code

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(top(child.pid), signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = child.wait()
    _tell(str(code))
    return 128 - code if code < 0 else code


def top(child: int, root: str = "/proc") -> int:
    """Where a signal to the job goes: the batch script the -o/-e runner started (marked,
    mgpu.master.kube.podoutput: the runner and its copies of the output go on to its
    end), else the child: what the kubelet's signal reached before there was pod-init."""
    procs = {p.pid: p for p in jobsignal.read_procs(root)}
    for p in sorted(procs.values(), key=lambda p: p.pid):
        parent = procs.get(p.ppid)
        top_marked = p.marked and not (parent is not None and parent.marked)
        if top_marked and child in jobsignal.ancestors(p.pid, procs):
            return p.pid
    return child


def _tell(text: str) -> None:
    """The child's end as the termination message (none where the file is not there:
    a container with another `terminationMessagePath`)."""
    try:
        with open(MESSAGE_PATH, "w") as f:
            f.write(text + "\n")
    except OSError:
        pass
