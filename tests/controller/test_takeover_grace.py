"""A new leader's grace (master/ha): the nodes it loaded are not declared lost, nor their
jobs requeued, while their agents find it and report what they run."""

from __future__ import annotations

from harness import Harness

from mgpu.model import JobState, NodeState


def test_no_node_is_lost_during_the_grace_and_its_jobs_go_on(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    job = h.start("sleep 600", agent=a)
    a.started(job)
    h.settle()
    h.crash()  # the leader died; a standby opens the cluster from the database
    h.cl.node_admin.grace(45.0)
    h.advance(40.0)  # past the 30 s timeout, within the grace
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.OFFLINE  # not lost
    assert h.job(job).state == JobState.RUNNING
    a.hello(running=[a.running(job)])  # the agent found the new leader
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.ONLINE
    assert h.job(job).state == JobState.RUNNING
    assert a.kills() == [] and a.launches() == []
    h.advance(10.0)  # the grace is over; the agent heartbeats on
    a.heartbeat()
    h.tick()
    assert h.job(job).state == JobState.RUNNING


def test_a_node_that_does_not_come_back_is_lost_after_the_grace(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    job = h.start("sleep 600", agent=a)
    a.started(job)
    h.settle()
    h.crash()
    h.cl.node_admin.grace(45.0)
    h.advance(40.0)
    h.tick()
    assert h.job(job).state == JobState.RUNNING
    h.advance(10.0)
    h.tick()
    assert h.cl.nodes["n1"].state != NodeState.ONLINE
    assert h.job(job).state == JobState.QUEUED  # requeued: its node is lost
