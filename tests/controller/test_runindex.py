"""The running jobs the scheduler sees are kept by the jobs' changes (master/state/runindex.py):
after any sequence of transitions they are exactly what a walk over every job gives (a
launching job's start up to LAUNCHING_RECOUNT), and a pass over the kept set decides as
one over a list made afresh."""

from __future__ import annotations

from dataclasses import replace

from harness import Harness, _run

from mgpu.master.control.jobctl import Actor, JobControl
from mgpu.master.control.loop import decide
from mgpu.master.state.runindex import LAUNCHING_RECOUNT
from mgpu.master.state.snapshot import collect, running_job
from mgpu.model import EndReason, JobState
from mgpu.scheduler import RunningJob
from mgpu.scheduler.running import running_usage

ADMIN = Actor("root", admin=True)


def walked(h: Harness) -> tuple[dict[str, RunningJob], dict[str, int]]:
    """The running jobs and arrays' running tasks, found by a walk over every job."""
    now = h.clock.now
    _, running, arrays = collect(now, h.cl.state.jobs.values())
    return {r.job_id: r for r in running}, arrays


def check(h: Harness) -> None:
    loop = h.cl.loop
    kept = loop.running.refresh(h.clock.now)
    jobs, arrays = walked(h)
    assert {r.job_id: r for r in kept} == jobs
    assert loop.running.arrays == arrays
    assert kept.usage(h.clock.now) == running_usage(h.clock.now, jobs.values())


def test_the_kept_running_jobs_are_those_a_walk_finds_through_every_transition(
    h: Harness,
) -> None:
    a, b = h.agent("n1", gpus=4), h.agent("n2", gpus=4)
    check(h)  # built at the first look (jobs loaded at start-up are not touched)
    first = h.start("sleep", gpus=2, time="10", preemptible=True)
    launching = h.submit("sleep", gpus=1, user="bob")
    h.tick()  # started, but no agent has said so yet: counts from now
    check(h)
    h.advance(30)
    check(h)
    h.agents[h.job(launching).allocation[0].node_id].started(launching)
    check(h)
    array = h.submit("sleep", array="0-3", gpus=1, user="carol", time="1:00:00")
    h.tick()
    check(h)
    update = JobControl.parse_update(time="20", priority=None, gpus=None, name=None)
    _run(h.cl.jobctl.update(h.job(first), update, ADMIN))  # a running job's new limit
    check(h)
    h.cl.jobctl.requeue(h.job(f"{array}_1"), ADMIN)  # asked: killed, then requeued
    node = h.job(f"{array}_1").allocation[0].node_id
    h.agents[node].exited(f"{array}_1", code=None)
    check(h)
    h.cl.life.request_stop(h.job(first), EndReason.PREEMPTED)
    check(h)  # still running until its processes exit
    h.agents[h.job(first).allocation[0].node_id].exited(first, code=None)
    check(h)
    assert h.job(first).state is JobState.QUEUED
    h.tick()  # started again, perhaps elsewhere
    check(h)
    assert h.cl.cancel(h.job(f"{array}_0"), actor="carol")  # killed: ends at its exit
    check(h)
    h.agents[h.job(f"{array}_0").allocation[0].node_id].exited(f"{array}_0", code=None)
    assert f"{array}_0" not in h.cl.state.jobs
    check(h)
    # An allocation starts at once (no process): counted from its grant.
    alloc = h.submit("bash", allocation=True, gpus=1)
    h.tick()
    assert h.job(alloc).state is JobState.RUNNING
    check(h)
    on_b = [j.id for j in h.cl.state.jobs.values() if "n2" in {s.node_id for s in j.allocation}]
    b.disconnect()  # its jobs are lost with it once it is silent
    h.advance(h.config.networking.timeout + 1)
    a.heartbeat()
    h.tick()
    assert on_b and all(
        h.job(j).state is not JobState.RUNNING
        or "n2" not in {s.node_id for s in h.job(j).allocation}
        for j in on_b
    )
    check(h)
    h.crash()  # a new master on the same store: built again from what was loaded
    check(h)


def test_a_running_jobs_view_is_made_again_only_when_what_it_is_made_of_changes(
    h: Harness,
) -> None:
    h.agent("n1", gpus=2)
    job_id = h.start("sleep", gpus=1, time="10")
    index = h.cl.loop.running
    first = index.refresh(h.clock.now).get(job_id)
    assert first is not None and first.time_limit == 600
    h.advance(5)
    h.job(job_id).reason = "shown"  # not what a view is made of (and not persisted)
    assert index.refresh(h.clock.now).get(job_id) is first
    update = JobControl.parse_update(time="20", priority=None, gpus=None, name=None)
    _run(h.cl.jobctl.update(h.job(job_id), update, ADMIN))
    second = index.refresh(h.clock.now).get(job_id)
    assert second is not None and second is not first and second.time_limit == 1200


def test_a_launching_job_counts_from_now_again_once_a_recount_has_passed(h: Harness) -> None:
    h.agent("n1", gpus=2)
    job_id = h.submit("sleep", gpus=1, time="10")
    h.tick()  # sent to its node, not started yet
    index = h.cl.loop.running
    first = index.refresh(h.clock.now).get(job_id)
    assert first is not None and first.start_time == h.clock.now
    h.advance(LAUNCHING_RECOUNT / 2)  # passes meanwhile: the same view
    assert index.refresh(h.clock.now).get(job_id) is first
    h.advance(LAUNCHING_RECOUNT)
    again = index.refresh(h.clock.now).get(job_id)
    assert again is not None and again.start_time == h.clock.now
    h.agents["n1"].started(job_id)  # its start is known: counted from it from now on
    h.advance(LAUNCHING_RECOUNT * 3)
    started = index.refresh(h.clock.now).get(job_id)
    assert started is not None and started.start_time == h.job(job_id).start_time


def test_a_pass_over_the_kept_set_decides_as_one_over_a_list_made_afresh(h: Harness) -> None:
    """Backfill behind a blocked head, and a preemption: the same decisions, reasons,
    estimates and priorities from the kept set as from `running_job` over every job."""
    for n in ("n1", "n2", "n3"):
        h.agent(n, gpus=4)
    for k in range(9):
        h.start("sleep", gpus=1 + k % 3, time=f"{10 + k}:00", user=f"u{k % 3}", preemptible=k % 2)
        h.advance(13)
        for agent in h.agents.values():
            agent.heartbeat()
    for k in range(6):
        h.submit("sleep", gpus=2 + k % 3, time=f"{5 + k}:00", user=f"u{k % 2}", priority=k * 300)
    loop, now = h.cl.loop, h.clock.now
    queued = loop.queued_requests(now, h.cl.state.jobs.values())
    kept = loop.inputs(now, queued)
    kept = replace(kept, config=replace(kept.config, plan_seconds=None))
    fresh = [running_job(h.job(r.job_id), now) for r in kept.running]  # the same, in its order
    usage = loop.usage.snapshot(now)
    for user, used in running_usage(now, fresh).items():
        usage[user] = usage.get(user, 0.0) + used
    a = decide(kept)
    b = decide(replace(kept, running=fresh, array_running=walked(h)[1], usage=usage, pool=None))
    assert a.decisions is not None and b.decisions is not None
    assert a.decisions.preempt and a.decisions.expected_start  # the cases looked at
    assert a.decisions == b.decisions
    assert a.eligibility == b.eligibility
