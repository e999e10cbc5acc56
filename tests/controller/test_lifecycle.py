"""A job's lifecycle in the controller: end reasons, cancel, gang failures, preemption,
requeue with backoff, records of older versions, and queries while a change is unwritten."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness, _run

from factories import master_job
from mgpu.master.http.queries import JobFilter, queue_answer
from mgpu.model import DesiredState, EndReason, Job, JobState, SlotPhase
from mgpu.protocol import Exited

# ---- end reasons ------------------------------------------------------------------

# (reason, state it leads to, spends a retry, desired state of a job stopped for it)
END_REASONS = [
    (EndReason.EXIT_OK, JobState.COMPLETED, False, DesiredState.STOP),
    (EndReason.EXIT_NONZERO, JobState.FAILED, False, DesiredState.STOP),
    (EndReason.TIMEOUT, JobState.TIMEOUT, False, DesiredState.STOP),
    (EndReason.CANCELLED, JobState.CANCELLED, False, DesiredState.STOP),
    (EndReason.IDLE, JobState.CANCELLED, False, DesiredState.STOP),
    (EndReason.DEPENDENCY_NEVER, JobState.CANCELLED, False, DesiredState.STOP),
    (EndReason.NEVER_FITS, JobState.FAILED, False, DesiredState.STOP),
    (EndReason.LAUNCH_FATAL, JobState.FAILED, False, DesiredState.STOP),
    (EndReason.RETRIES_EXHAUSTED, JobState.FAILED, False, DesiredState.STOP),
    (EndReason.NODE_LOST, JobState.QUEUED, True, DesiredState.STOP),
    (EndReason.LAUNCH_FAILED, JobState.QUEUED, True, DesiredState.STOP),
    (EndReason.PROLOG_FAILED, JobState.QUEUED, False, DesiredState.STOP),
    (EndReason.NOT_LAUNCHED, JobState.QUEUED, False, DesiredState.STOP),
    (EndReason.PREEMPTED, JobState.QUEUED, False, DesiredState.PREEMPT),
    (EndReason.REQUEUED, JobState.QUEUED, False, DesiredState.REQUEUE),
    (EndReason.OUT_OF_MEMORY, JobState.FAILED, False, DesiredState.STOP),
    (EndReason.NO_ROOM, JobState.QUEUED, False, DesiredState.STOP),
]


def test_every_end_reason_is_in_the_table() -> None:
    assert {r for r, *_ in END_REASONS} == set(EndReason)


@pytest.mark.parametrize(("reason", "state", "retry", "desired"), END_REASONS)
def test_an_end_reason_decides_the_state_and_the_retry(
    reason: EndReason, state: JobState, retry: bool, desired: DesiredState
) -> None:
    assert reason.to_state() == state
    assert reason.counts_retry is retry
    assert reason.desired == desired


# (how the run's last slot ends, the requeue cases after one retry was already spent)
REQUEUES = [
    ("node lost", EndReason.NODE_LOST, 2, "requeued: why (retry 2/5)"),
    ("launch failed", EndReason.LAUNCH_FAILED, 2, "requeued: why (retry 2/5)"),
    ("prolog failed", EndReason.PROLOG_FAILED, 1, "requeued: why"),
    ("never launched", EndReason.NOT_LAUNCHED, 1, "requeued: why"),
    ("preempted", EndReason.PREEMPTED, 1, "requeued: why"),
    ("requeued", EndReason.REQUEUED, 1, "requeued: why"),
]


@pytest.mark.parametrize(
    ("reason", "retries", "text"), [c[1:] for c in REQUEUES], ids=[c[0] for c in REQUEUES]
)
def test_a_requeue_spends_a_retry_only_when_its_reason_counts_one(
    h: Harness, reason: EndReason, retries: int, text: str
) -> None:
    h.agent("n1")
    job_id = h.start()
    job = h.job(job_id)
    job.retries = 1
    h.cl.life.requeue(job, reason, "why")
    h.settle()
    assert (job.state, job.retries, job.reason) == (JobState.QUEUED, retries, text)
    assert job.attempts[-1].end_reason == "why"
    assert all(s.phase == SlotPhase.EXITED for s in job.allocation)
    assert job.job_token_hashes == [] and h.node("n1").busy == {}
    assert h.stored(job_id).retries == retries


def test_out_of_retries_a_requeue_fails_the_job(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start(retries=0)
    a.link.take()
    h.cl.life.requeue(h.job(job_id), EndReason.NODE_LOST, "node n1 lost")
    h.settle()
    job = h.job(job_id)
    assert (job.state, job.reason, job.retries) == (JobState.FAILED, "node n1 lost", 0)
    assert len(a.kills()) == 1  # one kill, not one per path through the code


# ---- requeue with backoff -------------------------------------------------------------


def test_requeues_back_off_exponentially(make_harness: Callable[..., Harness]) -> None:
    scheduling = {"retry_backoff_base": 10, "retry_backoff_max": 25, "node_failure_threshold": 9}
    h = make_harness({"scheduling": scheduling})
    a = h.agent("n1")
    job_id = h.start(retries=5)
    for retry, backoff in ((1, 10), (2, 20), (3, 25)):  # base * 2^(n-1), capped
        a.hello([])  # the agent restarted without it: lost
        job = h.job(job_id)
        assert job.state == JobState.QUEUED and job.retries == retry
        assert job.eligible_time == h.clock.now + backoff
        h.advance(backoff - 0.5)
        h.tick()
        assert h.job(job_id).state == JobState.QUEUED
        assert h.job(job_id).reason is not None
        assert h.job(job_id).reason.startswith("retry backoff until")  # type: ignore[union-attr]
        h.advance(0.5)
        a.heartbeat()
        assert h.cl.loop.backoff_expired()
        h.tick()
        assert h.job(job_id).state == JobState.RUNNING
        a.started(job_id)
    assert [at.epoch for at in h.job(job_id).attempts] == [1, 2, 3, 4]


# ---- cancel ---------------------------------------------------------------------------


def test_cancel_a_queued_job_ends_it_at_once(h: Harness) -> None:
    job_id = h.submit()
    assert h.cl.cancel(h.job(job_id), actor="alice")
    stored = h.stored(job_id)  # written before the answer, with the audit event
    assert (stored.state, stored.reason) == (JobState.CANCELLED, "cancelled by alice")
    assert [e["target"] for e in h.events("cancel")] == [job_id]
    assert not h.cl.cancel(h.job(job_id), actor="alice")  # already ended


def test_cancel_a_running_job_kills_it_then_ends_it(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start()
    a.link.take()
    assert h.cl.cancel(h.job(job_id), actor="alice")
    job = h.job(job_id)
    assert (job.state, job.desired, job.reason) == (
        JobState.RUNNING,
        DesiredState.STOP,
        "cancelling",
    )
    assert h.stored(job_id).stop_reason == EndReason.CANCELLED  # survives a restart
    (kill,) = a.kills()
    assert (kill.job_id, kill.epoch, kill.reason) == (job_id, 1, "cancelled")
    a.exited(job_id, 143)
    job = h.job(job_id)
    assert (job.state, job.reason, job.exit_code) == (JobState.CANCELLED, "cancelled", 143)
    assert h.node("n1").busy == {}


def test_a_cancel_wins_over_a_preemption_under_way(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start(preemptible=True)
    h.cl.life.request_stop(h.job(job_id), EndReason.PREEMPTED)
    h.cl.cancel(h.job(job_id), actor="alice")
    h.cl.life.request_stop(h.job(job_id), EndReason.PREEMPTED)  # does not undo the cancel
    a.exited(job_id, 143)
    assert h.job(job_id).state == JobState.CANCELLED


def test_a_cancelled_job_whose_node_is_lost_ends_cancelled(h: Harness) -> None:
    h.agent("n1")
    job_id = h.start()
    h.cl.cancel(h.job(job_id), actor="alice")
    h.advance(h.config.networking.timeout + 1)
    h.tick()
    job = h.job(job_id)
    assert (job.state, job.retries) == (JobState.CANCELLED, 0)


# ---- gangs ----------------------------------------------------------------------------


def test_one_rank_failing_kills_the_others(h: Harness) -> None:
    """As srun --kill-on-bad-exit: the job's code is the first failing rank's."""
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1)
    h.tick()
    assert [r.job_id for r in n1.port_requests()] == [job_id]
    n1.port(job_id, 29500)
    (l1,), (l2,) = n1.launches(), n2.launches()
    assert l1.env["MASTER_PORT"] == l2.env["MASTER_PORT"] == "29500"
    assert (l1.env["NODE_RANK"], l2.env["NODE_RANK"]) == ("0", "1")
    n1.started(job_id)
    n2.started(job_id)
    n1.exited(job_id, 3)
    (kill,) = n2.kills()
    assert kill.reason == "n1 failed" and n1.kills() == []
    assert h.job(job_id).state == JobState.RUNNING  # until the last rank has gone
    n2.exited(job_id, 143)
    job = h.job(job_id)
    assert (job.state, job.exit_code, job.reason) == (JobState.FAILED, 3, "exit code 3 on n1")


def test_a_fatal_launch_error_on_one_node_ends_the_others(h: Harness) -> None:
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1)
    h.tick()
    n1.port(job_id)
    n1.started(job_id)
    n1.link.take()
    n2.exited(job_id, None, launch_error="no such user", fatal=True)
    job = h.job(job_id)
    assert (job.state, job.reason, job.retries) == (JobState.FAILED, "n2: no such user", 0)
    assert [k.job_id for k in n1.kills()] == [job_id]
    assert h.node("n1").busy == {} and h.node("n2").failures == 0


def test_a_gang_cancelled_while_its_port_is_reserved_is_never_launched(h: Harness) -> None:
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1)
    h.tick()
    h.cl.cancel(h.job(job_id), actor="alice")
    n1.port(job_id)
    assert n1.launches() == [] and n2.launches() == []
    job = h.job(job_id)
    assert (job.state, job.reason) == (JobState.CANCELLED, "cancelled")
    assert h.node("n1").busy == {} and h.node("n2").busy == {}


def test_an_mpi_jobs_other_ranks_stay_held_across_a_master_restart(h: Harness) -> None:
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1, mpi=True)
    h.tick()
    n1.port(job_id)
    assert len(n1.launches()) == 1 and n2.launches() == []
    phases = [s.phase for s in h.job(job_id).allocation]
    assert phases == [SlotPhase.SENT, SlotPhase.HELD]
    h.crash()
    assert h.node("n2").busy == {0: job_id}  # its GPU is still the job's


# ---- preemption -----------------------------------------------------------------------


def test_a_preempted_job_goes_back_to_the_queue_without_spending_a_retry(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    low = h.start(preemptible=True, priority=0)
    a.link.take()
    high = h.submit(priority=1000)
    h.tick()
    (kill,) = a.kills()
    assert (kill.job_id, kill.reason) == (low, "preempted")
    assert h.job(low).desired == DesiredState.PREEMPT and h.job(low).reason == "preempting"
    h.tick()  # asked once: a pass meanwhile does not preempt it again
    assert a.kills() == []
    a.exited(low, 143)
    job = h.job(low)
    assert (job.state, job.retries) == (JobState.QUEUED, 0)
    assert job.reason == "requeued: preempted by higher-priority work"
    assert job.desired == DesiredState.RUN
    h.tick()
    assert h.job(high).state == JobState.RUNNING


# ---- records of older versions ----------------------------------------------------------


def _old_record(**fields: object) -> dict[str, object]:
    job = master_job("old00001", state=JobState.RUNNING)
    rec = job.to_record()
    for key in ("stop_reason", "stop_text"):
        rec.pop(key)
    rec.update(fields)
    return rec


OLD = [
    ("running", {}, None, None),
    ("cancel requested", {"cancel_requested": True}, EndReason.CANCELLED, None),
    (
        "cancelled for idling",
        {"cancel_requested": True, "cancel_reason": "idle for 5 minutes"},
        EndReason.IDLE,
        "idle for 5 minutes",
    ),
    ("preempt requested", {"preempt_requested": True}, EndReason.PREEMPTED, None),
]


@pytest.mark.parametrize(
    ("fields", "reason", "text"), [c[1:] for c in OLD], ids=[c[0] for c in OLD]
)
def test_records_of_older_versions_load_with_their_stop(
    fields: dict[str, object], reason: EndReason | None, text: str | None
) -> None:
    job = Job.from_record(_old_record(**fields))
    assert (job.stop_reason, job.stop_text) == (reason, text)
    assert Job.from_record(job.to_record()).to_record() == job.to_record()


SLOTS = [
    ("ended", {"done": True, "pid": 7}, SlotPhase.EXITED),
    ("started", {"done": False, "pid": 7}, SlotPhase.STARTED),
    ("not reported started", {"done": False, "pid": None}, SlotPhase.SENT),
]


@pytest.mark.parametrize(("fields", "phase"), [c[1:] for c in SLOTS], ids=[c[0] for c in SLOTS])
def test_slots_of_older_versions_load_with_a_phase(
    fields: dict[str, object], phase: SlotPhase
) -> None:
    slot = {"node_id": "n1", "gpu_ids": [0], "hostname": None, "ip": None, "exit_code": None}
    job = Job.from_record(_old_record(allocation=[{**slot, **fields}]))
    assert job.allocation[0].phase == phase


# ---- queries see what is not written yet --------------------------------------------------


def queue_all(h: Harness) -> list[dict[str, Any]]:
    """The jobs of `GET /api/jobs?all=true`, as the route streams them."""

    async def read() -> bytes:
        return b"".join([chunk async for chunk in queue_answer(h.cl, True, 0, None, JobFilter())])

    jobs: list[dict[str, Any]] = json.loads(_run(read()))["jobs"]
    return jobs


def test_a_job_that_just_ended_is_in_queue_all_before_it_is_written(h: Harness) -> None:
    h.agent("n1")
    job_id = h.start()
    tasks = h.submit(array="0-1")
    exited = Exited(job_id=job_id, epoch=1, exit_code=0, time=h.clock.now)
    h.cl.agent_message("n1", exited)  # written at the end of the loop turn, not yet
    h.cl.life.finish(h.job(f"{tasks}_0"), EndReason.CANCELLED, "cancelled")
    assert h.stored(job_id).state == JobState.RUNNING
    assert job_id not in h.cl.jobs
    listed = {j["id"]: j["state"] for j in queue_all(h)}
    assert listed[job_id] == "completed" and listed[f"{tasks}_0"] == "cancelled"
    assert h.cl.get_job(job_id).state == JobState.COMPLETED  # type: ignore[union-attr]
    states = [t.state for t in h.cl.array_tasks(tasks)]
    assert states == [JobState.CANCELLED, JobState.QUEUED]
    h.settle()
    listed_ids = [j["id"] for j in queue_all(h)]
    assert listed_ids.count(job_id) == 1 and listed_ids.count(f"{tasks}_0") == 1


def test_only_rank_0_reserves_the_port_and_only_once(h: Harness) -> None:
    """MASTER_PORT is rank 0's, asked for at start: another rank's `port_reserved` (a
    rogue node in the gang) is ignored, and so is a second one of rank 0 after the
    launch (it would change the port, or launch the ranks again)."""
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1)
    h.tick()
    assert [r.job_id for r in n1.port_requests()] == [job_id]
    n2.port(job_id, 31337)
    assert n1.launches() == [] and n2.launches() == []
    assert h.job(job_id).port is None
    assert [s.phase for s in h.job(job_id).allocation] == [SlotPhase.PENDING] * 2
    n1.port(job_id, 29500)
    (l1,), (l2,) = n1.launches(), n2.launches()
    assert l1.env["MASTER_PORT"] == l2.env["MASTER_PORT"] == "29500"
    for agent in (n1, n2):
        agent.port(job_id, 31337)
    assert n1.launches() == [] and n2.launches() == []
    assert h.job(job_id).port == 29500 and h.stored(job_id).port == 29500


def test_a_port_for_a_job_that_asked_none_is_ignored(h: Harness) -> None:
    n1 = h.agent("n1", gpus=1)
    job_id = h.start()
    n1.link.take()
    n1.port(job_id, 31337)
    assert n1.link.take() == [] and h.job(job_id).port is None


def test_a_requeued_gang_waits_for_a_new_port(h: Harness) -> None:
    """A requeued run's old port is not the new run's: it waits for rank 0 again."""
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.submit(nodes=2, gpus_per_node=1, retries=3)
    h.tick()
    n1.port(job_id, 29500)
    n1.started(job_id)
    n2.exited(job_id, None, launch_error="no GPU")  # the node's fault: requeued
    n1.exited(job_id, 143)
    assert h.job(job_id).state == JobState.QUEUED
    h.advance(h.config.scheduling.retry_backoff_base)
    for agent in (n1, n2):
        agent.heartbeat()
        agent.link.take()
    h.tick()
    job = h.job(job_id)
    assert job.state == JobState.RUNNING and job.epoch == 2 and job.port is None
    assert [r.epoch for r in n1.port_requests()] == [2]
    n2.port(job_id, 31337)
    assert n1.launches() == [] and n2.launches() == []
    n1.port(job_id, 29501)
    (l1,), (l2,) = n1.launches(), n2.launches()
    assert l1.env["MASTER_PORT"] == l2.env["MASTER_PORT"] == "29501"
