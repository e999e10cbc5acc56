"""The simulator and the master preempt the same job in the same situation.

Two preemptible jobs hold a 2 x 2-GPU cluster when an urgent job arrives:

* A (user a) started at t=0, when nobody had used anything: a high priority then;
* B (user b) started at t=800, when a had used more than b: a lower priority then;
* by t=1500, a has run 2 GPUs for 1500 s and b much less (400 GPU-s of an earlier job, and
  B's 700 s), so A's priority *now* is the lower one.

The victim must be A, both through the master's code path (`master/snapshot.prepare` on its
jobs, nodes and usage ledger) and in the simulator's replay of the same events.  With the
priorities the jobs had when they started, B would be chosen instead (checked below): that
is what the simulator did while only the master refreshed the victims' priorities.
"""

from __future__ import annotations

from dataclasses import replace

from mgpu.config import ClusterConfig
from mgpu.master.state.registry import AgentLink, NodeRecord
from mgpu.master.state.snapshot import prepare, scheduler_config
from mgpu.model import Job, JobState, NodeState, Slot
from mgpu.protocol import GpuDesc
from mgpu.scheduler import FreePool, Snapshot, UsageLedger, running_priorities, schedule
from mgpu.scheduler.preemption import plan_preemption
from mgpu.sim import ClusterShape, SimConfig, TraceJob, simulate

CONFIG = ClusterConfig()
HALF_LIFE = CONFIG.scheduling.fairshare_half_life_hours * 3600
URGENT_AT = 1500.0


def trace() -> list[TraceJob]:
    return [
        TraceJob("H", 0.0, 200.0, 2, "b"),  # b's earlier usage: 400 GPU-s, ended at 200
        TraceJob("A", 0.0, 10_000.0, 2, "a", preemptible=True),
        TraceJob("B", 800.0, 10_000.0, 2, "b", preemptible=True),
        TraceJob("U", URGENT_AT, 10.0, 2, "c", priority=1000),
    ]


# --------------------------------------------------------------------------- the master


def node(node_id: str) -> NodeRecord:
    gpus = [GpuDesc(index=i, name="gpu", memory_mb=1000) for i in range(2)]
    rec = NodeRecord(node_id, gpus=gpus, state=NodeState.ONLINE)
    rec.link = AgentLink(node_id, ws=None)  # connected: schedulable
    return rec


def job(job_id: str, user: str, submit: float, **kw: object) -> Job:
    return Job(id=job_id, user=user, argv=["x"], command="x", gpus=2, submit_time=submit, **kw)  # type: ignore[arg-type]


def run(j: Job, rec: NodeRecord, start: float) -> Job:
    """`j` running on both GPUs of `rec` since `start`, as the master holds it."""
    j.state, j.start_time, j.epoch = JobState.RUNNING, start, 1
    j.allocation = [Slot(rec.node_id, [0, 1])]
    rec.busy = {0: j.id, 1: j.id}
    rec.jobs = {j.id}
    return j


def master_snapshot(
    now: float, jobs: list[Job], nodes: list[NodeRecord], usage: UsageLedger
) -> Snapshot:
    prepared = prepare(now, jobs, nodes, usage, scheduler_config(CONFIG.scheduling))
    assert prepared.snapshot is not None
    return prepared.snapshot


def master_situation() -> tuple[Snapshot, dict[str, float]]:
    """The snapshot of the pass at t=1500, and each running job's priority at its start."""
    n1, n2 = node("node001"), node("node002")
    usage = UsageLedger.loads(HALF_LIFE, None)
    a = job("a0000001", "a", 0.0, preemptible=True)
    b = job("b0000002", "b", 800.0, preemptible=True)
    h = job("h0000000", "b", 0.0)
    # t=0: H and A start (H on node001, as placement does on an idle cluster).
    stale_a = schedule(master_snapshot(0.0, [h, a], [n1, n2], usage)).priorities[a.id]
    run(h, n1, 0.0)
    run(a, n2, 0.0)
    # t=200: H ends; its GPU-seconds are charged to b.
    usage.add("b", 2 * 200.0, 200.0)
    n1.busy, n1.jobs = {}, set()
    # t=800: B starts on node001.
    stale_b = schedule(master_snapshot(800.0, [a, b], [n1, n2], usage)).priorities[b.id]
    run(b, n1, 800.0)
    u = job("u0000003", "c", URGENT_AT, priority=1000)
    snap = master_snapshot(URGENT_AT, [a, b, u], [n1, n2], usage)
    return snap, {a.id: stale_a, b.id: stale_b}


# --------------------------------------------------------------------------- the test


def test_simulator_and_master_preempt_the_same_job() -> None:
    snap, stale = master_situation()
    a_id, b_id = "a0000001", "b0000002"
    decisions = schedule(snap)
    assert decisions.preempt == [a_id]

    result = simulate(trace(), SimConfig(ClusterShape(2, 2), "backfill", half_life=HALF_LIFE))
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
    priority = decisions.priorities[urgent.job_id]
    pool = FreePool(snap.nodes)
    plan = plan_preemption(urgent, priority, pool, snap.running, "fill_first", stale)
    assert plan is not None and plan.victims == (b_id,)
    plan = plan_preemption(urgent, priority, pool, snap.running, "fill_first", fresh)
    assert plan is not None and plan.victims == (a_id,)
