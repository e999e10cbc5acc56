"""The simulator and the master preempt the same job in the same situation.

Two preemptible jobs hold a 2 x 2-GPU cluster when an urgent job arrives:

* A (user a) started at t=0, when nobody had used anything: a high priority then;
* B (user b) started at t=800, when a had used more than b: a lower priority then;
* by t=1500, a has run 2 GPUs for 1500 s and b much less (400 GPU-s of an earlier job, and
  B's 700 s), so A's priority *now* is the lower one.

The victim must be A, both in the master (its controller, driven through the harness: the
scheduling loop's own inputs, plan and apply) and in the simulator's replay of the same
events.  With the priorities the jobs had when they started, B would be chosen instead
(checked below): that is what the simulator did while only the master refreshed the
victims' priorities.
"""

from __future__ import annotations

from dataclasses import replace

from harness import Harness

from mgpu.master.state.snapshot import assemble
from mgpu.model import DesiredState
from mgpu.scheduler import FreePool, Snapshot, running_priorities
from mgpu.scheduler.preemption import plan_preemption
from mgpu.sim import ClusterShape, SimConfig, TraceJob, simulate

URGENT_AT = 1500.0


def trace() -> list[TraceJob]:
    return [
        TraceJob("H", 0.0, 200.0, 2, "b"),  # b's earlier usage: 400 GPU-s, ended at 200
        TraceJob("A", 0.0, 10_000.0, 2, "a", preemptible=True),
        TraceJob("B", 800.0, 10_000.0, 2, "b", preemptible=True),
        TraceJob("U", URGENT_AT, 10.0, 2, "c", priority=1000),
    ]


# --------------------------------------------------------------------------- the master


def until(h: Harness, t0: float, t: float) -> None:
    """The clock at `t` seconds after `t0`; the agents heard from (not lost)."""
    h.advance(t0 + t - h.clock.now)
    for agent in h.agents.values():
        agent.heartbeat()


def start(h: Harness, *job_ids: str) -> None:
    """A pass starts `job_ids`, and their agents report them started."""
    h.tick()
    for job_id in job_ids:
        (slot,) = h.job(job_id).allocation
        h.agents[slot.node_id].started(job_id)


def master_situation(h: Harness) -> tuple[Snapshot, dict[str, float], list[str]]:
    """The trace's events in the master: the snapshot of the pass at t=1500, each running
    job's priority at its start, and the jobs that pass asks to stop."""
    t0 = h.clock.now
    for node_id in ("node001", "node002"):
        h.agent(node_id, gpus=2)
    loop = h.cl.loop
    hid = h.submit("sleep 200", user="b", gpus=2)
    a = h.submit("sleep 10000", user="a", gpus=2, preemptible=True)
    start(h, hid, a)
    stale_a = loop.priorities[a]
    until(h, t0, 200.0)  # H ends: its GPU-seconds are charged to b
    (slot,) = h.job(hid).allocation
    h.agents[slot.node_id].exited(hid)
    h.settle()
    until(h, t0, 800.0)
    b = h.submit("sleep 10000", user="b", gpus=2, preemptible=True)
    start(h, b)
    stale_b = loop.priorities[b]
    until(h, t0, URGENT_AT)
    h.submit("sleep 10", user="c", gpus=2, priority=1000)
    now = h.clock.now
    # The snapshot the loop's pass is made of, from the inputs every pass gathers.
    snapshot = assemble(loop.inputs(now, loop.queued_requests(now, h.cl.jobs.values()))).snapshot
    assert snapshot is not None
    h.tick()  # the pass itself: plan and apply
    stopping = [j.id for j in h.cl.jobs.values() if j.desired is DesiredState.PREEMPT]
    return snapshot, {a: stale_a, b: stale_b}, stopping


# --------------------------------------------------------------------------- the test


def test_simulator_and_master_preempt_the_same_job(h: Harness) -> None:
    snap, stale, stopping = master_situation(h)
    a_id, b_id = list(stale)
    assert h.job(a_id).user == "a" and h.job(b_id).user == "b"
    assert stopping == [a_id]

    half_life = h.config.scheduling.fairshare_half_life_hours * 3600
    result = simulate(trace(), SimConfig(ClusterShape(2, 2), "backfill", half_life=half_life))
    by_name = {j.job_id: j for j in result.jobs}
    assert result.preemptions == 1
    assert by_name["A"].requeues == 1 and by_name["B"].requeues == 0
    assert by_name["U"].start == URGENT_AT

    # The two ran the same scheduler settings.
    sim_config = replace(SimConfig(ClusterShape(2, 2)).scheduler, queue_policy="backfill")
    assert replace(snap.config, cluster_gpus=0) == sim_config

    # The stale priorities order the two the other way round, and would pick B.
    fresh = running_priorities(snap, snap.running)
    assert fresh[a_id] < fresh[b_id] and stale[a_id] > stale[b_id]
    urgent = snap.pending[0]
    priority = h.cl.loop.priorities[urgent.job_id]  # the pass's
    pool = FreePool(snap.nodes)
    plan = plan_preemption(urgent, priority, pool, snap.running, "fill_first", stale)
    assert plan is not None and plan.victims == (b_id,)
    plan = plan_preemption(urgent, priority, pool, snap.running, "fill_first", fresh)
    assert plan is not None and plan.victims == (a_id,)
