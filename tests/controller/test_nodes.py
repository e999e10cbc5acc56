"""Node states and who moves them: the table, drain and resume, failures, node loss by
heartbeat timeout, node removal."""

from __future__ import annotations

import pytest
from harness import Harness

from mgpu.master.control.nodes import Conflict
from mgpu.master.state.registry import NodeRecord
from mgpu.model import NODE_MOVES, JobState, NodeEvent, NodeState

ON, OFF, DRAINING, DRAINED = (
    NodeState.ONLINE,
    NodeState.OFFLINE,
    NodeState.DRAINING,
    NodeState.DRAINED,
)

# (from, event, drain requested, has jobs, to)
MOVES = [
    (OFF, NodeEvent.JOINED, False, False, ON),
    (OFF, NodeEvent.JOINED, True, True, DRAINING),  # its drain was kept while away
    (OFF, NodeEvent.JOINED, True, False, DRAINED),
    (ON, NodeEvent.LOST, False, True, OFF),
    (DRAINING, NodeEvent.LOST, True, True, OFF),
    (ON, NodeEvent.DRAIN, True, True, DRAINING),
    (ON, NodeEvent.DRAIN, True, False, DRAINED),
    (OFF, NodeEvent.DRAIN, True, False, OFF),  # an offline node stays offline
    (DRAINING, NodeEvent.EMPTIED, True, False, DRAINED),
    (ON, NodeEvent.EMPTIED, False, False, ON),
    (DRAINING, NodeEvent.RESUME, False, True, ON),
    (DRAINED, NodeEvent.RESUME, False, False, ON),
    (OFF, NodeEvent.RESUME, False, False, OFF),
]


@pytest.mark.parametrize(("start", "event", "drain", "jobs", "end"), MOVES)
def test_node_moves(
    start: NodeState, event: NodeEvent, drain: bool, jobs: bool, end: NodeState
) -> None:
    node = NodeRecord("n1", state=start, drain_requested=drain, jobs={"j"} if jobs else set())
    assert node.move(event) == end


def test_the_table_names_only_real_moves() -> None:
    for (start, event), end in NODE_MOVES.items():
        assert isinstance(start, NodeState) and isinstance(event, NodeEvent)
        assert isinstance(end, NodeState)


def test_drain_with_a_job_then_resume(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    job_id = h.start()
    node = h.cl.drain("n1", "maintenance", actor="admin")
    assert (node.state, node.reason) == (NodeState.DRAINING, "maintenance")
    waiting = h.submit()
    h.tick()
    assert h.job(waiting).state == JobState.QUEUED  # nothing new on a draining node
    a.exited(job_id, 0)
    assert h.node("n1").state == NodeState.DRAINED  # its last job left
    h.cl.resume("n1", actor="admin")
    assert (h.node("n1").state, h.node("n1").reason) == (NodeState.ONLINE, None)
    h.tick()
    assert h.job(waiting).state == JobState.RUNNING
    assert [(e["kind"], e["actor"]) for e in h.events("drain") + h.events("resume")] == [
        ("drain", "admin"),
        ("resume", "admin"),
    ]
    assert h.store.load_nodes()["n1"]["drain_requested"] is False


def test_consecutive_launch_failures_drain_the_node(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    h.agent("n2", gpus=1)
    job_id = h.submit(nodelist=["n1"], retries=10)
    for failure in (1, 2, 3):
        h.advance(h.config.scheduling.retry_backoff_max)
        a.heartbeat()
        h.agents["n2"].heartbeat()
        h.tick()
        a.exited(job_id, None, launch_error="cannot exec")
        assert h.node("n1").failures == failure
        assert h.job(job_id).retries == failure
    node = h.node("n1")
    assert node.state == NodeState.DRAINED and node.drain_requested
    assert node.reason == "3 consecutive failures, last: n1 could not launch the job: cannot exec"


def test_a_clean_exit_resets_the_failure_count_and_a_prolog_failure_costs_no_retry(
    h: Harness,
) -> None:
    a = h.agent("n1", gpus=1)
    job_id = h.submit()
    h.tick()
    a.exited(job_id, None, launch_error="prolog failed", requeue_free=True)
    job = h.job(job_id)
    assert (job.state, job.retries, h.node("n1").failures) == (JobState.QUEUED, 0, 1)
    h.tick()
    a.started(job_id)
    a.exited(job_id, 0)
    assert h.job(job_id).state == JobState.COMPLETED and h.node("n1").failures == 0


def test_an_epilog_error_drains_the_node_and_the_job_result_stands(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start()
    a.exited(job_id, 0, epilog_error="epilog exited 1")
    assert h.job(job_id).state == JobState.COMPLETED
    assert (h.node("n1").state, h.node("n1").reason) == (NodeState.DRAINED, "epilog exited 1")


def test_a_silent_node_is_lost_and_its_jobs_requeued(h: Harness) -> None:
    a, b = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.start(nodelist=["n1"])
    timeout = h.config.networking.timeout
    h.advance(timeout)
    b.heartbeat()
    h.tick()
    assert h.node("n1").state == NodeState.ONLINE  # not past the timeout yet
    h.advance(1)
    b.heartbeat()
    h.tick()
    node = h.node("n1")
    assert (node.state, node.link, node.busy, node.jobs) == (NodeState.OFFLINE, None, {}, set())
    assert a.link.closed
    job = h.job(job_id)
    assert (job.state, job.retries) == (JobState.QUEUED, 1)
    assert job.attempts[-1].end_reason == "node n1 lost"
    assert job.reason is not None and job.reason.startswith("retry backoff until")
    assert h.node("n2").state == NodeState.ONLINE
    a.hello()  # back: online again, its old run killed as stale
    assert h.node("n1").state == NodeState.ONLINE


def test_remove_a_node_requeues_its_jobs_unless_connected(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    job_id = h.start()
    with pytest.raises(Conflict, match="is connected and runs 1 job"):
        h.cl.remove_node("n1", actor="admin")
    a.disconnect()
    assert h.cl.remove_node("n1", actor="admin") == [job_id]
    assert "n1" not in h.cl.nodes
    job = h.job(job_id)
    assert (job.state, job.reason) == (JobState.QUEUED, "requeued: node n1 removed (retry 1/5)")
    assert h.events("node_remove")[0]["detail"] == f"requeued {job_id}"
