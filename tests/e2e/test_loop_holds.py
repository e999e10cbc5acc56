"""A long queue never holds the master's event loop (issue 11 item 8, issue 15 item 1).

A real master with one agent and 20,000 one-GPU tasks queued: quick passes look at the
head of the queue, full passes run off the loop.  The master's own monitor
(master/runtime/looplag.py, in /metrics) must see no hold in which the loop's own thread ran
for HOLD seconds or more: its CPU time, which a loaded 2-core machine (CI) does not stretch
as it stretches the wall clock (bench/abuse.py has the wall-clock figures, with 100,000
tasks); every queued task is judged by a full pass within seconds, and a task that can
start does so promptly.
"""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import LocalCluster, wait_for

HOLD = 0.5
"""CPU seconds the loop's thread may run in one hold (the target is 0.1 of wall time; a
full pass of 20,000 tasks on the loop, as before issue 11, ran well over this)."""
TASKS = 20_000


def metric(cluster: LocalCluster, name: str) -> float:
    with urllib.request.urlopen(f"http://{cluster.address}/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert found is not None, name
    return float(found.group(1))


def test_a_long_queue_is_scheduled_without_holding_the_loop(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    try:
        cluster.start_master()
        cluster.start_agent("node001", gpus=4)
        client = cluster.client()
        req = {"command": "sleep 600", "gpus": 1, "array": f"0-{TASKS - 1}", "env": {}}
        out = client._request("POST", "/api/jobs", req, timeout=300)
        ids = out["task_ids"]
        wait_for(lambda: client.show(ids[3])["state"] == "running", what="four tasks run")

        # A full pass judges every task, the last one included, within seconds.
        last = ids[-1]
        wait_for(
            lambda: client.show(last)["reason"] not in (None, "waiting to be scheduled"),
            timeout=60,
            what="the last task judged",
        )
        assert client.show(last)["reason"] == "waiting for 1 GPU"
        # Timed once its last slice of reasons is written (a moment after the test saw it).
        wait_for(lambda: metric(cluster, "mgpu_scheduler_full_pass_seconds") > 0, timeout=30)

        # A task that can start does: the quick pass, on the event, from the head.
        client.cancel(ids[0])
        wait_for(lambda: client.show(ids[4])["state"] == "running", timeout=30, what="the next")

        # The quick pass's wall time, bounded for a loaded machine (2-4 ms when idle).
        assert metric(cluster, "mgpu_scheduler_pass_seconds") < 4 * HOLD
        assert metric(cluster, "mgpu_event_loop_hold_running_max_seconds") < HOLD
        client.cancel(out["job_id"])
    finally:
        cluster.stop()
