"""Scheduling policy through a real master: dependencies, arrays, preemption, limits, priority."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import LocalCluster, local_cluster, wait_for

POLICY_CONFIG = """
scheduling:
  policy: backfill
  kill_grace: 1
  max_running_jobs_per_user: 6
"""


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[LocalCluster]:
    """One agent with 2 GPUs: easy to fill, so policy decides what runs."""
    with local_cluster(tmp_path, agents=1, gpus=2, config=POLICY_CONFIG) as c:
        yield c


def test_dependencies(one_node: LocalCluster) -> None:
    c = one_node.client()
    gate = one_node.root / "gate"
    first = c.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 1", gpus=0)
    ok_dep = c.submit("echo ran", gpus=0, dependency=f"afterok:{first.id}")
    not_ok_dep = c.submit("echo handled", gpus=0, dependency=f"afternotok:{first.id}")
    any_dep = c.submit("echo any", gpus=0, dependency=f"afterany:{first.id}")
    wait_for(lambda: "dependency" in (c.show(ok_dep.id)["reason"] or ""), what="dep reason")
    assert c.show(ok_dep.id)["state"] == "queued"
    gate.touch()
    assert c.wait(first.id, timeout=30)["state"] == "failed"
    never = c.wait(ok_dep.id, timeout=30)
    assert never["state"] == "cancelled"
    assert "can never be satisfied" in never["reason"]
    assert c.wait(not_ok_dep.id, timeout=30)["state"] == "completed"
    assert c.logs(not_ok_dep.id) == "handled\n"
    assert c.wait(any_dep.id, timeout=30)["state"] == "completed"


def test_job_array_with_throttle(one_node: LocalCluster) -> None:
    res = one_node.cli(
        "submit", "--json", "--gpus", "0", "--array", "0-5%2",
        "echo task $MGPU_ARRAY_TASK_ID of $MGPU_ARRAY_JOB_ID",
        check=True,
    )  # fmt: skip
    out = json.loads(res.stdout)
    array_id = out["job_id"]
    assert out["task_ids"] == [f"{array_id}_{i}" for i in range(6)]
    c = one_node.client()
    done = c.wait_all(out["task_ids"], timeout=60)
    assert all(j["state"] == "completed" for j in done)
    for i, task in enumerate(out["task_ids"]):
        assert c.logs(task) == f"task {i} of {array_id}\n"
    # The %2 cap: never more than two tasks running at once.
    spans = sorted((j["start_time"], j["end_time"]) for j in done)
    for start, _ in spans:
        running = sum(1 for s, e in spans if s <= start < e)
        assert running <= 2


def test_array_folds_in_queue_and_cancels_whole(one_node: LocalCluster) -> None:
    c = one_node.client()
    blocker = c.submit("sleep 300", gpus=2)
    wait_for(lambda: c.show(blocker.id)["state"] == "running", what="blocker")
    job = c.submit("true", gpus=1, array="0-9")
    table = one_node.cli("queue", check=True).stdout
    assert f"{job.id}_[0-9]" in table
    assert table.count(f"{job.id}_") == 1
    res = one_node.cli("cancel", job.id, check=True)
    assert res.stdout.count("cancelled") == 10
    shown = c.show(job.id)  # an array id shows every task
    assert [t["id"] for t in shown["tasks"]] == [f"{job.id}_{i}" for i in range(10)]
    assert f"{job.id}_9" in one_node.cli("show", job.id, check=True).stdout
    one_task = c.submit("true", gpus=1, array="0-2")
    one_node.cli("cancel", f"{one_task.id}_1", check=True)
    assert c.show(f"{one_task.id}_1")["state"] == "cancelled"
    assert c.show(f"{one_task.id}_0")["state"] == "queued"
    c.cancel(blocker.id)
    c.cancel(one_task.id)


def test_preemption_requeues_without_spending_retries(one_node: LocalCluster) -> None:
    c = one_node.client()
    low = c.submit("echo start; sleep 300", gpus=2, preemptible=True, priority=0)
    wait_for(lambda: c.show(low.id)["state"] == "running", what="low running")
    # Let the low job run a while: its own usage now counts against its user, which the
    # comparison must see for both jobs alike (not only for the waiting one).
    wait_for(lambda: c.show(low.id)["start_time"], what="low started")
    time.sleep(1.0)
    high = c.submit("echo urgent", gpus=2, priority=1000)
    done = c.wait(high.id, timeout=60)
    assert done["state"] == "completed", (done, c.show(low.id))
    job = c.show(low.id)
    assert job["retries"] == 0
    assert "preempt" in job["attempts"][0]["end_reason"]
    # It keeps its place: it runs again as soon as the GPUs are back (the next pass: a few
    # ms after the high job's end, so waited for), as a new attempt.
    wait_for(lambda: c.show(low.id)["state"] == "running", what="low back")
    job = c.show(low.id)
    assert len(job["attempts"]) >= 2 and job["retries"] == 0
    c.cancel(low.id)


def test_priority_and_reason_are_shown(one_node: LocalCluster) -> None:
    c = one_node.client()
    blocker = c.submit("sleep 300", gpus=2, time="10")
    wait_for(lambda: c.show(blocker.id)["state"] == "running", what="blocker")
    waiting = c.submit("true", gpus=2, priority=5)
    job = wait_for(
        lambda: (j := c.show(waiting.id))["priority_value"] is not None and j, what="priority"
    )
    assert job["priority_factors"]
    assert job["reason"]
    assert job["expected_start"] is not None  # backfill reserves a start for the head job
    shown = one_node.cli("show", waiting.id, check=True).stdout
    assert "priority:" in shown and "expected start" in shown
    c.cancel(blocker.id)
    c.cancel(waiting.id)


def test_per_user_running_job_limit(one_node: LocalCluster) -> None:
    c = one_node.client()
    jobs = [c.submit("sleep 300", gpus=0) for _ in range(8)]
    wait_for(lambda: sum(c.show(j.id)["state"] == "running" for j in jobs) == 6, what="6 running")
    queued = [c.show(j.id) for j in jobs if c.show(j.id)["state"] == "queued"]
    assert len(queued) == 2
    assert any("limit" in (j["reason"] or "") for j in queued)
    for j in jobs:
        c.cancel(j.id)
