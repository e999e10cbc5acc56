"""Nodes through a failover (issue 32, item 6): a new leader (or a restarted master) shows
each node its agent has not said hello to yet as the last leader had it, not connected:
online, draining or drained; offline only a node that was down, or one silent for its
timeout after the take-over."""

from __future__ import annotations

from harness import Harness

from mgpu.model import JobState, NodeState


def test_a_new_leader_shows_each_node_as_it_was_until_its_agent_says_hello(h: Harness) -> None:
    up, busy, drained, gone = (h.agent(n, gpus=2) for n in ("up", "busy", "drained", "gone"))
    job = h.start("sleep 600", agent=busy)
    busy.started(job)
    h.cl.drain("busy", "maintenance")  # draining: it holds a job
    h.cl.drain("drained", "maintenance")
    h.settle()
    gone.disconnect()
    h.advance(31.0)  # `gone` is silent past the 30 s timeout: lost; the others heartbeat
    for agent in (up, busy, drained):
        agent.heartbeat()
    h.tick()
    assert h.cl.nodes["gone"].state == NodeState.OFFLINE
    h.crash()  # the leader died; a standby opens the cluster from the database
    h.cl.node_admin.grace(45.0)
    h.tick()

    shown = {n["node_id"]: (n["state"], n["connected"]) for n in h.cl.nodes_public()}
    assert shown == {
        "up": ("online", False),
        "busy": ("draining", False),
        "drained": ("drained", False),
        "gone": ("offline", False),
    }
    assert h.job(job).state == JobState.RUNNING
    up.hello()
    h.tick()
    assert h.cl.nodes["up"].state == NodeState.ONLINE and h.cl.nodes["up"].connected


def test_a_node_silent_past_its_timeout_after_the_take_over_is_lost_and_stays_so(
    h: Harness,
) -> None:
    h.agent("n1", gpus=2)
    h.settle()
    h.crash()
    h.cl.node_admin.grace(45.0)
    h.advance(40.0)  # within the grace: as it was
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.ONLINE
    h.advance(10.0)  # past the grace, and past its own 30 s since the take-over
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.OFFLINE
    h.crash()  # the next leader loads it down
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.OFFLINE
