"""Heartbeat intervals scaled with the cluster's size (master/control/heartbeats.py): the interval
agents are told grows with the connected nodes past `max_heartbeats_per_second`, the
lost-node timeout with it, and agents already connected are told when it changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness

from mgpu.master.control.heartbeats import scaled_interval
from mgpu.model import JobState, NodeState
from mgpu.protocol import SetHeartbeat

# 1 s heartbeats, 3 s timeout, at most 2 heartbeats a second: 2 nodes keep 1 s, 10 nodes
# get 5 s (and a 3 + 4 = 7 s timeout).
SMALL = {"networking": {"heartbeat_interval": 1.0, "timeout": 3.0, "max_heartbeats_per_second": 2}}


def join(h: Harness, count: int, first: int = 0) -> None:
    for k in range(first, first + count):
        h.agent(f"n{k}", gpus=1)
    h.advance(0.5)  # the liveness check (which counts the nodes) runs twice a second
    h.tick()


def told(h: Harness, node_id: str) -> list[float]:
    return [m.heartbeat_interval for m in h.agents[node_id].link.take(SetHeartbeat)]


@pytest.mark.parametrize(
    ("base", "rate", "nodes", "interval"),
    [
        (5.0, 50.0, 1, 5.0),
        (5.0, 50.0, 250, 5.0),  # the default leaves a cluster of up to 250 nodes alone
        (5.0, 50.0, 251, 5.02),
        (5.0, 50.0, 1000, 20.0),
        (5.0, 0.0, 1000, 5.0),  # 0: never stretched
    ],
)
def test_the_interval_keeps_the_cluster_at_the_rate(
    base: float, rate: float, nodes: int, interval: float
) -> None:
    assert scaled_interval(base, rate, nodes) == pytest.approx(interval)


def test_a_small_cluster_keeps_the_configured_interval_and_timeout(h: Harness) -> None:
    join(h, 3)
    welcome = h.agent("n9", gpus=1).welcome
    assert welcome is not None and welcome.heartbeat_interval == 5.0
    for node_id in h.agents:
        h.agents[node_id].heartbeat()
        assert told(h, node_id) == []
    assert h.cl.node_admin.pace.timeout_of("n9") == h.config.networking.timeout


def test_the_interval_grows_with_the_nodes_and_connected_agents_are_told(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(SMALL)
    join(h, 2)
    assert h.agents["n0"].welcome is not None
    assert h.agents["n0"].welcome.heartbeat_interval == 1.0
    join(h, 8, first=2)  # 10 nodes: 10 / 2 a second = one each 5 s
    assert h.agent("n10", gpus=1).welcome.heartbeat_interval == 5.0  # type: ignore[union-attr]
    h.agents["n0"].heartbeat()
    assert told(h, "n0") == [5.0]  # in answer to its next heartbeat
    h.agents["n0"].heartbeat()
    assert told(h, "n0") == []  # once
    h.agents["n10"].heartbeat()
    assert told(h, "n10") == []  # told in its welcome


def test_a_change_within_a_tenth_is_not_told(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(SMALL)
    join(h, 10)  # 5 s
    h.agents["n0"].heartbeat()
    told(h, "n0")
    join(h, 1, first=10)  # 11 nodes: 5.5 s, a tenth more
    h.agents["n0"].heartbeat()
    assert told(h, "n0") == []
    join(h, 1, first=11)  # 12 nodes: 6 s
    h.agents["n0"].heartbeat()
    assert told(h, "n0") == [6.0]


def keep_alive(h: Harness, but: str) -> None:
    for node_id, agent in h.agents.items():
        if node_id != but and h.node(node_id).connected:
            agent.heartbeat()


def silent_until_lost(h: Harness, node_id: str, step: float = 0.5) -> float:
    """Seconds of silence from `node_id` (the others heartbeating) until it is lost."""
    silent = 0.0
    while h.node(node_id).state == NodeState.ONLINE:
        h.advance(step)
        silent += step
        keep_alive(h, node_id)
        h.tick()
        assert silent < 60, "never lost"
    return silent


def test_the_lost_node_timeout_grows_with_the_interval(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(SMALL)
    join(h, 10)  # 5 s: the timeout is 3 + (5 - 1) = 7 s
    h.agents["n0"].heartbeat()
    assert told(h, "n0") == [5.0]
    h.agents["n0"].heartbeat()  # now on the 5 s interval
    assert h.cl.node_admin.pace.timeout_of("n0") == 7.0
    assert silent_until_lost(h, "n0") == 7.5  # the first look past 7 s


def test_an_agent_told_a_shorter_interval_is_judged_by_its_old_one_until_it_heartbeats(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(SMALL)
    join(h, 10)  # 5 s
    a = h.agents["n0"]
    a.heartbeat()
    a.heartbeat()
    assert told(h, "n0") == [5.0]
    for k in range(2, 10):  # the cluster shrinks to 2 nodes: 1 s again
        h.agents[f"n{k}"].disconnect()
    h.advance(0.5)
    h.tick()
    a.heartbeat()  # answered with 1 s, but it sleeps its 5 s first
    assert told(h, "n0") == [1.0]
    assert h.cl.node_admin.pace.timeout_of("n0") == 7.0
    a.heartbeat()  # on 1 s from now on
    assert h.cl.node_admin.pace.timeout_of("n0") == 3.0
    assert silent_until_lost(h, "n0") == 3.5


def test_a_bad_rate_is_refused() -> None:
    from pydantic import ValidationError

    from mgpu.config import ClusterConfig

    bad: dict[str, Any] = {"networking": {"max_heartbeats_per_second": -1}}
    with pytest.raises(ValidationError):
        ClusterConfig.model_validate(bad)


def test_a_jump_of_the_wall_clock_declares_no_node_lost(h: Harness) -> None:
    """Silence is measured on the monotonic clock: the master's wall clock jumping 120 s
    ahead (an NTP step) on a quiet cluster loses no node and restarts no job; a node that
    then stays silent for its timeout is lost as before."""
    a, b = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    jobs = [h.start("sleep 600", agent=agent) for agent in (a, b)]
    for agent, job in zip((a, b), jobs, strict=True):
        agent.started(job)
    h.settle()
    h.clock.jump(120.0)
    h.advance(0.5)
    h.tick()
    assert [h.node(n).state for n in ("n1", "n2")] == [NodeState.ONLINE] * 2
    assert [h.job(j).state for j in jobs] == [JobState.RUNNING] * 2
    assert h.node("n1").last_seen < h.clock.time() - 100  # shown: the wall clock's
    timeout = h.config.networking.timeout
    h.advance(timeout - 1)
    b.heartbeat()
    h.tick()
    assert h.node("n1").state == NodeState.ONLINE
    h.advance(2.0)
    b.heartbeat()
    h.tick()
    assert h.node("n1").state != NodeState.ONLINE  # silent past its timeout: lost
    assert h.node("n2").state == NodeState.ONLINE
    assert h.job(jobs[0]).state == JobState.QUEUED and h.job(jobs[1]).state == JobState.RUNNING
