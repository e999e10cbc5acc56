"""Followers of a queued job cost nothing while nothing changes (issue 25 item 7).

A real master with one GPU taken and 20,000 tasks queued, and FOLLOWERS real `mgpu logs -f`
clients of a job queued behind them.  Each follower used to count the queue ahead of its
job every second; now one count a few seconds serves them all and a follower wakes on its
job's own changes.  Over a window of several ticks the master's event loop answers
`/healthz` promptly and the master uses a small part of a core (generous bounds for a
loaded 2-core machine); the position a follower is shown is right.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import BIN, LocalCluster, kill_group, wait_for
from mgpu.testing import LoopProbe

TASKS = 20_000
FOLLOWERS = 40
WINDOW = 12.0
"""Seconds measured: more than two ticks (follow.TICK) and counts (positions.MAX_AGE)."""
GAP = 1.0
"""Seconds /healthz may take while the followers follow."""
CPU = 0.07
"""Share of one core the followers may add to the master's use (the same window without
them, with the same /healthz probe, is the baseline; 30 followers polling took 95 %)."""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_share(pid: int, seconds: float) -> float:
    """The share of one core `pid` used over the next `seconds`."""
    t0, cpu0 = time.monotonic(), cpu_seconds(pid)
    time.sleep(seconds)  # the measured window itself, not a synchronisation
    return (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)


def test_followers_of_a_job_queued_behind_a_long_queue_cost_nothing(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    followers: list[subprocess.Popen[bytes]] = []
    probe = None
    try:
        master = cluster.start_master()
        cluster.start_agent("node001", gpus=1)
        client = cluster.client()
        blocker = client.submit("sleep 600", gpus=1).id
        wait_for(lambda: client.show(blocker)["state"] == "running", what="the blocker runs")
        req = {"command": "true", "gpus": 1, "array": f"0-{TASKS - 1}", "env": {}}
        client._request("POST", "/api/jobs", req, timeout=300)
        waiting = client.submit("echo done", gpus=1).id

        # The position a follower is told: behind every task (the blocker runs).
        position = None
        for rec in client.stream(waiting, follow=True, read_timeout=60):
            if "position" in rec:
                position = rec["position"]
                break
        assert position == TASKS + 1

        probe = LoopProbe(cluster.address, master.pid, tmp_path / "probe.txt")
        probe.settle(quiet=1.0, slow=0.3)
        baseline = core_share(master.pid, WINDOW)
        for _ in range(FOLLOWERS):
            followers.append(
                subprocess.Popen(
                    [str(BIN / "mgpu"), "logs", "-f", waiting],
                    env=cluster.env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        probe.settle(quiet=1.0, slow=0.3)
        assert all(f.poll() is None for f in followers), "a follower ended"

        t0 = time.monotonic()
        share = core_share(master.pid, WINDOW)
        t1 = time.monotonic()
        wait_for(lambda: any(s > t1 for s, _, _ in probe.samples()), what="a sample")
        gaps, _ = probe.window(t0, t1)
        assert gaps and max(gaps) < GAP, f"/healthz took {max(gaps):.2f} s"
        added = share - baseline
        assert added < CPU, f"the followers cost the master {added:.0%} of a core"

        # And the followers still follow: the job's end reaches them at once.
        client.cancel(blocker)
        client.cancel(waiting)
        for f in followers:
            f.wait(timeout=60)
    finally:
        for f in followers:
            if f.poll() is None:
                kill_group(f, signal.SIGKILL)
        if probe is not None:
            probe.stop()
        cluster.stop()
