"""A big array never stalls the master, and is stored whole or not at all (issue 11 item 8,
issue 15 item 2).

A real master with one agent: 20,000 tasks are submitted, listed a page at a time,
summarised, and cancelled while a `/healthz` poller in another process sees no gap over
GAP seconds (a correctness bound for a loaded 2-core machine; bench/abuse.py has the
figures, with 100,000 tasks).  A master killed with -9 in the middle of a big submit
comes back with every task of it or none.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import LocalCluster, wait_for
from mgpu.client.api import MgpuError
from mgpu.testing import LoopProbe

GAP = 0.5
"""Seconds the master may take to answer /healthz while a big array is handled."""
TASKS = 20_000
BUILDING = 32 << 20
"""Bytes the master grows by while it builds 100,000 tasks, well before it is done (it grows
by ~160 MB in all: bench/results/abuse.json)."""


@pytest.fixture
def probed(tmp_path: Path) -> Iterator[tuple[LocalCluster, LoopProbe]]:
    cluster = LocalCluster(tmp_path)
    probe = None
    try:
        cluster.start_master()
        cluster.start_agent("node001", gpus=2)
        assert cluster.master is not None
        probe = LoopProbe(cluster.address, cluster.master.pid, tmp_path / "probe.txt")
        yield cluster, probe
    finally:
        if probe is not None:
            probe.stop()
        cluster.stop()


def _longest_gap(probe: LoopProbe, t0: float) -> float:
    t1 = time.monotonic()
    # The probe asks one at a time: once a sample sent after t1 is in, the one in flight
    # at t1 (however long it hangs) is in too.
    wait_for(lambda: any(s > t1 for s, _, _ in probe.samples()), what="the sample after")
    gaps, _ = probe.window(t0, t1)
    assert gaps, "the poller took no sample"
    return max(gaps)


def _submit(cluster: LocalCluster, tasks: int) -> dict[str, Any]:
    req = {"command": "sleep 600", "gpus": 1, "array": f"0-{tasks - 1}%2", "env": {}}
    out: dict[str, Any] = cluster.client()._request("POST", "/api/jobs", req, timeout=300)
    return out


def test_a_big_array_is_submitted_paged_summarised_and_cancelled_without_a_stall(
    probed: tuple[LocalCluster, LoopProbe],
) -> None:
    cluster, probe = probed
    client = cluster.client()
    probe.settle(quiet=0.3, slow=0.2)
    t0 = time.monotonic()
    array = _submit(cluster, TASKS)
    assert _longest_gap(probe, t0) < GAP
    array_id, ids = array["job_id"], array["task_ids"]
    assert ids == [f"{array_id}_{i}" for i in range(TASKS)]
    wait_for(lambda: client.show(ids[1])["state"] == "running", what="two tasks run")

    # Pages of the queue, in submit order, with filters; without a limit, every job.
    probe.settle(quiet=0.3, slow=0.2)
    t0 = time.monotonic()
    first = client._request("GET", "/api/jobs?limit=100&state=queued")
    assert [j["id"] for j in first["jobs"]] == ids[2:102]
    second = client._request("GET", f"/api/jobs?limit=100&state=queued&after={first['next']}")
    assert [j["id"] for j in second["jobs"]] == ids[102:202]
    running = client._request("GET", "/api/jobs?state=running")
    assert [j["id"] for j in running["jobs"]] == ids[:2] and "next" not in running
    assert client._request("GET", "/api/jobs?user=nobody&limit=5") == {
        "jobs": [],
        "nodes": first["nodes"],
    }
    everything = client.queue()
    assert [j["id"] for j in everything["jobs"]] == ids and set(everything) == {"jobs", "nodes"}
    # `mgpu queue` gets the array's queued tasks folded into one line by the master.
    folded = client.queue(fold=True)["jobs"]
    assert [(j["id"], j.get("array_tasks")) for j in folded] == [
        (ids[0], None),
        (ids[1], None),
        (ids[2], f"2-{TASKS - 1}"),
    ]
    table = cluster.cli("queue", check=True).stdout
    assert f"{array_id}_[2-{TASKS - 1}]" in table
    # `show ARRAY_ID`: counts by state and the first tasks, unless every one is asked for.
    shown = client.show(array_id)
    assert shown["counts"] == {"queued": TASKS - 2, "running": 2}
    assert len(shown["tasks"]) == 1000 and shown["more"] == TASKS - 1000
    text = cluster.cli("show", array_id, check=True).stdout
    assert f"Array {array_id}: {TASKS} tasks (" in text
    assert f"... and {TASKS - 1000} more tasks (mgpu show {array_id} --all)" in text
    assert len(client.show(array_id, all=True)["tasks"]) == TASKS
    assert _longest_gap(probe, t0) < GAP

    probe.settle(quiet=0.3, slow=0.2)
    t0 = time.monotonic()
    out = client.cancel(array_id)
    assert out == {"cancelled": ids, "already_ended": []}
    assert _longest_gap(probe, t0) < GAP
    events = [e for e in client.audit() if e["kind"] == "cancel"]
    assert [e["target"] for e in events] == [array_id]
    wait_for(lambda: not client.queue()["jobs"], timeout=60, what="the running tasks ended")
    shown = client.show(array_id, all=True)
    assert shown["counts"] == {"cancelled": TASKS}
    assert [t["id"] for t in shown["tasks"]] == ids
    assert client.show(ids[-1])["state"] == "cancelled"


def test_bad_filters_get_one_sentence(probed: tuple[LocalCluster, LoopProbe]) -> None:
    client = probed[0].client()
    with pytest.raises(MgpuError, match="state 'bogus' is not one of cancelled, completed"):
        client._request("GET", "/api/jobs?state=queued,bogus")
    with pytest.raises(MgpuError, match="limit"):
        client._request("GET", "/api/jobs?limit=-1")


def test_a_master_killed_during_a_big_submit_keeps_all_of_it_or_nothing(
    probed: tuple[LocalCluster, LoopProbe],
) -> None:
    """The submit is killed while the master builds the tasks (before the one write) or
    right after; either way the restarted master knows every task of the array or none,
    and a task that ran before the restart keeps its place."""
    cluster, probe = probed
    client = cluster.client()
    kept = _submit(cluster, 50)  # stored whole: comes back whole after the kill
    wait_for(lambda: client.show(kept["task_ids"][0])["state"] == "running", what="a task")
    answers: list[Any] = []

    def submit() -> None:
        try:
            answers.append(_submit(cluster, 100_000))
        except Exception as e:  # the master died under the request
            answers.append(e)

    before = wait_for(lambda: probe.samples()[-1][2], what="the master's memory")
    thread = threading.Thread(target=submit)
    thread.start()
    # The request is in, and the tasks are being built (or, on a fast machine, just
    # written), once the master has grown by a fraction of what 100,000 tasks take.
    wait_for(
        lambda: any(rss > before + BUILDING for _, _, rss in probe.samples()),
        timeout=120,
        what="the master building the tasks",
    )
    assert cluster.master is not None
    cluster.master.send_signal(signal.SIGKILL)
    cluster.master.wait(timeout=10)
    thread.join(timeout=60)
    cluster.start_master()
    client = cluster.client()
    page = client._request("GET", "/api/jobs?limit=60")["jobs"]
    mine = page[:50]
    assert [j["id"] for j in mine] == kept["task_ids"]
    assert mine[0]["state"] == "running"  # stored when it started
    others = page[50:]
    total = 0
    if others:
        total = sum(client.show(others[0]["array_job_id"])["counts"].values())
    assert total in (0, 100_000), total
    if isinstance(answers[0], dict):  # answered before the kill: it must be there
        assert total == 100_000
