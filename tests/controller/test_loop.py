"""The scheduling loop: a plan re-checked against fresh state before it is applied, the
verdicts of eligibility applied, jobs queued before any node judged once nodes join."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import Harness

from mgpu.master.control.passplan import Plan
from mgpu.model import EndReason, JobState, NodeEvent
from mgpu.protocol import Launch

# What happens between the plan and its application: (case, change, start dropped?)
CHANGES: list[tuple[str, Callable[[Harness], None], bool]] = [
    ("nothing", lambda h: None, False),
    ("the node was removed", lambda h: _remove(h, "n1"), True),
    ("the node's agent disconnected", lambda h: h.agents["n1"].disconnect(), True),
    ("the node was drained", lambda h: _move(h, "n1", NodeEvent.DRAIN), True),
    ("the node was lost", lambda h: _move(h, "n1", NodeEvent.LOST), True),
    ("its GPU went to another job", lambda h: _take_gpu(h, "n1", 0), True),
    ("its GPU is used outside mgpu", lambda h: _block_gpu(h, "n1", 0), True),
    ("another GPU of the node was taken", lambda h: _take_gpu(h, "n1", 1), False),
]


def _remove(h: Harness, node_id: str) -> None:
    h.agents[node_id].disconnect()
    h.cl.remove_node(node_id)


def _move(h: Harness, node_id: str, event: NodeEvent) -> None:
    if event == NodeEvent.DRAIN:
        h.cl.drain(node_id, "maintenance")
    else:
        h.node(node_id).move(event)


def _take_gpu(h: Harness, node_id: str, gpu: int) -> None:
    h.node(node_id).busy[gpu] = "other001"


def _block_gpu(h: Harness, node_id: str, gpu: int) -> None:
    h.node(node_id).foreign_blocked = frozenset({gpu})


@pytest.mark.parametrize(
    ("change", "dropped"), [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES]
)
def test_a_start_is_rechecked_against_fresh_state(
    h: Harness, change: Callable[[Harness], None], dropped: bool
) -> None:
    a = h.agent("n1", gpus=2)
    job_id = h.submit(gpu_ids=[0])
    plan = h.cl.loop.plan()
    assert plan.decisions is not None and [s.job_id for s in plan.decisions.starts] == [job_id]
    change(h)
    h.cl.loop.apply(plan)
    h.settle()
    job = h.job(job_id)
    if dropped:  # whole: nothing taken, nothing sent, planned again next pass
        assert (job.state, job.epoch, job.allocation) == (JobState.QUEUED, 0, [])
        assert all(job_id not in n.busy.values() for n in h.cl.nodes.values())
        assert [m for m in a.link.sent if isinstance(m, Launch)] == []
        assert h.stored(job_id).state == JobState.QUEUED
    else:
        assert job.state == JobState.RUNNING and h.node("n1").busy[0] == job_id
        assert [m.job_id for m in a.launches()] == [job_id]


def test_a_gang_start_is_dropped_whole_when_one_node_vanished(h: Harness) -> None:
    n1 = h.agent("n1", gpus=1)
    h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1)
    plan = h.cl.loop.plan()
    _remove(h, "n2")
    h.cl.loop.apply(plan)
    h.settle()
    assert h.job(job_id).state == JobState.QUEUED
    assert h.node("n1").busy == {} and n1.port_requests() == []


def test_a_preemption_of_a_job_that_ended_meanwhile_is_dropped(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    low = h.start(preemptible=True)
    high = h.submit(priority=1000)
    plan = h.cl.loop.plan()
    assert plan.decisions is not None and plan.decisions.preempt == [low]
    a.exited(low, 0)  # it ended by itself
    a.link.take()
    h.cl.loop.apply(plan)
    h.settle()
    assert a.kills() == [] and h.job(low).state == JobState.COMPLETED
    h.tick()
    assert h.job(high).state == JobState.RUNNING


def test_an_empty_plan_still_counts_as_a_pass(h: Harness) -> None:
    h.advance(5)
    plan = h.cl.loop.plan()
    assert plan == Plan(h.clock.now, plan.eligibility, None, plan.seconds)
    h.cl.loop.apply(plan)
    assert h.cl.loop.last_pass_time == h.clock.now


def test_a_dependency_that_can_never_be_satisfied_cancels_the_job(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    first = h.start()
    after = h.submit(dependency=f"afterok:{first}")
    h.tick()
    assert h.job(after).reason == f"waiting for dependency {first}"
    a.exited(first, 1)
    h.tick()
    job = h.job(after)
    assert job.state == JobState.CANCELLED
    assert job.reason == f"dependency afterok:{first} can never be satisfied ({first} ended failed)"
    assert h.stored(after).state == JobState.CANCELLED


def test_jobs_queued_before_any_node_are_judged_when_nodes_join(h: Harness) -> None:
    fits = h.submit(gpus=2)
    never = h.submit(gpus=8)
    assert h.job(never).state == JobState.QUEUED  # nothing to judge it against yet
    h.agent("n1", gpus=4)
    h.advance(h.config.networking.heartbeat_interval - 0.1)
    assert h.job(never).state == JobState.QUEUED  # other agents get a heartbeat to join
    h.advance(0.1)
    job = h.job(never)
    assert job.state == JobState.FAILED
    assert job.reason is not None and "8 GPUs" in job.reason
    assert h.job(fits).state == JobState.QUEUED


def test_the_loop_replans_on_its_own_every_few_seconds(h: Harness) -> None:
    h.agent("n1", gpus=1)
    h.cl.loop.tick(woken=False)
    first = h.cl.loop.last_pass_time
    h.advance(1)
    h.cl.loop.tick(woken=False)
    assert h.cl.loop.last_pass_time == first  # nothing changed, nothing due
    h.advance(5)
    h.cl.loop.tick(woken=False)
    assert h.cl.loop.last_pass_time == h.clock.now


def test_a_job_being_stopped_is_not_preempted(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    low = h.start(preemptible=True)
    h.cl.life.request_stop(h.job(low), EndReason.CANCELLED)
    h.settle()
    assert [k.reason for k in a.kills()] == ["cancelled"]
    h.submit(priority=1000)
    h.tick()
    assert a.kills() == []  # already being stopped
    assert h.job(low).stop_reason == EndReason.CANCELLED
