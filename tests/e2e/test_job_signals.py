"""Jobs start with every signal at its default, whatever the agent was started with.

An agent started in the background by a script ignores SIGINT and SIGQUIT; one started by
`nohup` ignores SIGHUP.  An ignored signal stays ignored across fork and exec (and a job's
shell cannot trap one ignored on entry), so its jobs could never be stopped by ^C,
`mgpu cancel --signal INT` or a hang-up.  The agent keeps ignoring them itself."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from helpers import LocalCluster, wait_for
from mgpu import Client

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root agent")
IGNORED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
GLIBC_INTERNAL = {32, 33}  # SIGCANCEL, SIGSETXID: below SIGRTMIN
# The agent started as `nohup mgpu node ... &` from a script would be.
NOHUP_IN_BACKGROUND = ["/bin/sh", "-c", 'trap "" HUP INT QUIT; exec "$@"', "sh"]


def ignored_by(pid: int) -> set[int]:
    """The signals process `pid` ignores (SigIgn in /proc/PID/status)."""
    return mask_signals(Path(f"/proc/{pid}/status").read_text())


def mask_signals(status: str) -> set[int]:
    line = next(x for x in status.splitlines() if x.startswith("SigIgn:"))
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


@ROOT_ONLY
def test_jobs_of_an_agent_that_ignores_signals_start_with_the_defaults(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    try:
        cluster.start_master()
        agent = cluster.start_agent("node001", gpus=1, prefix=NOHUP_IN_BACKGROUND)
        # The agent itself still does not die of them (they were asked to be ignored).
        os.kill(agent.pid, signal.SIGHUP)
        os.kill(agent.pid, signal.SIGINT)
        admin = cluster.client()
        for client in (admin, Client(cluster.address, token=admin.create_token("nobody")["token"])):
            # The job's own process (exec'd by the shim) reports its dispositions.
            job = client.submit("exec cat /proc/self/status", gpus=0, cwd="/")
            done = client.wait(job.id, timeout=30)
            assert done["state"] == "completed", (done, cluster.log("node001"))
            # None at all: Python's own ignores (SIGPIPE, SIGXFSZ) are undone too.  (Not
            # glibc's two internal ones, 32 and 33, which its posix_spawn leaves ignored
            # and every glibc program sets up again at its start.)
            assert mask_signals(client.logs(job.id)) - GLIBC_INTERNAL == set()
            # Nothing of the agent's is open in it: stdio and the exit file only (and the
            # listing's own directory).
            job = client.submit("exec ls -l /proc/self/fd", gpus=0, cwd="/")
            assert client.wait(job.id, timeout=30)["state"] == "completed"
            targets = [line.split(" -> ", 1)[1] for line in client.logs(job.id).splitlines()[1:]]
            others = [t for t in targets[3:] if not t.startswith("/proc/")]
            assert len(targets) == 5 and len(others) == 1, targets
            assert others[0].startswith(str(tmp_path)) and os.path.isfile(others[0]), targets
        assert agent.poll() is None
        assert set(IGNORED) <= ignored_by(agent.pid) | handled_quietly(agent.pid)
        wait_for(lambda: cluster.wait_node("node001", "online"), what="the agent online")
    finally:
        cluster.stop()


def handled_quietly(pid: int) -> set[int]:
    """Signals with a handler (SigCgt): the agent's no-op stands in for an ignore."""
    line = next(
        x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigCgt:")
    )
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}
