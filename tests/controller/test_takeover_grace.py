"""A new leader's grace (master/ha): the nodes it loaded are not declared lost, nor their
jobs requeued, while their agents find it and report what they run."""

from __future__ import annotations

from harness import Harness

from mgpu.master.control.nodes import LET_GO_AFTER
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
    n1 = h.cl.nodes["n1"]
    assert n1.state == NodeState.ONLINE and not n1.connected  # not lost: as it was
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


def test_a_master_without_the_lease_judges_no_node_and_gives_the_grace_again(
    h: Harness,
) -> None:
    """A leader cut off from the database loses its lease and refuses its agents: their
    silence is not theirs, so no node is lost meanwhile; once it holds the lease again
    the agents get the grace anew to find it (then silence counts again)."""
    a, b = h.agent("n1", gpus=2), h.agent("n2", gpus=2)
    job = h.start("sleep 600", agent=a)
    a.started(job)
    h.settle()
    held = [True]
    h.cl.node_admin.holds_lease = lambda: held[0]
    h.cl.node_admin.grace(45.0)
    h.advance(50.0)  # the takeover grace is over
    a.heartbeat()
    b.heartbeat()
    h.tick()
    held[0] = False  # the lease ran out: the agents are refused, silent for minutes
    for _ in range(20):
        h.advance(10.0)
        h.tick()
    assert h.cl.nodes["n1"].state == NodeState.ONLINE
    assert h.cl.nodes["n2"].state == NodeState.ONLINE
    assert h.job(job).state == JobState.RUNNING
    held[0] = True  # the lease is held again (renewed: no other master took it)
    h.advance(0.5)
    h.tick()
    h.advance(40.0)  # within the grace given again
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.ONLINE
    assert h.job(job).state == JobState.RUNNING
    a.heartbeat()  # n1's agent found it again; n2's never does
    h.advance(10.0)
    h.tick()
    assert h.cl.nodes["n1"].state == NodeState.ONLINE
    assert h.job(job).state == JobState.RUNNING
    assert h.cl.nodes["n2"].state != NodeState.ONLINE  # judged again after the grace


def test_a_master_whose_lease_stays_out_lets_its_agents_go(h: Harness) -> None:
    """A leader cut off from the database keeps its agents' links (they answer pings):
    a standby that took over never hears from them and would lose their nodes after its
    timeout, running their jobs a second time.  Out of the lease for LET_GO_AFTER, the
    master closes their links, so each says hello to the master that leads; a lease out
    for a moment only (a missed renewal) keeps them."""
    a = h.agent("n1", gpus=2)
    job = h.start("sleep 600", agent=a)
    a.started(job)
    h.settle()
    held = [True]
    h.cl.node_admin.holds_lease = lambda: held[0]
    h.cl.node_admin.grace(45.0)
    h.advance(50.0)
    a.heartbeat()
    h.tick()
    held[0] = False
    h.advance(1.0)
    h.tick()
    held[0] = True  # renewed in time: a blip
    h.advance(1.0)
    h.tick()
    assert not a.link.closed
    held[0] = False  # out for good (another master leads)
    h.advance(0.5)
    h.tick()
    assert not a.link.closed  # not yet: within LET_GO_AFTER
    h.advance(LET_GO_AFTER)
    h.tick()
    assert a.link.closed  # let go: its agent looks for the leader
    assert h.job(job).state == JobState.RUNNING  # nothing judged meanwhile
    assert h.cl.nodes["n1"].state == NodeState.ONLINE


def test_an_agent_that_watches_for_the_leader_is_kept_out_of_the_lease(h: Harness) -> None:
    """An agent that knows several masters asks the others whether one leads and leaves by
    itself (Hello.watches_leader): the master out of its lease keeps it, so through a
    paused database, when no master leads, its node stays connected; the others go."""
    a, b = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    a.link.watches_leader = True
    h.settle()
    h.cl.node_admin.holds_lease = lambda: False
    h.advance(0.5)
    h.tick()
    h.advance(LET_GO_AFTER)
    h.tick()
    assert not a.link.closed and b.link.closed
    assert h.cl.nodes["n1"].connected
