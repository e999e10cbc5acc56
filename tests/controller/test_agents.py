"""What agents say, as the controller applies it: fencing by epoch, reconcile at hello
(lost, killed, resumed, never launched), messages that cannot be sent, GPU telemetry."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import FakeAgent, Harness

from mgpu.master.state.registry import Unsendable
from mgpu.master.store.outputs import ALL_SENT
from mgpu.model import JobState, NodeState, SlotPhase
from mgpu.protocol import (
    Exited,
    Forget,
    GpuTelemetry,
    Kill,
    Output,
    PortReserved,
    RunningReport,
    Started,
)

# ---- fencing: a message of an older run never counts --------------------------------

STALE = 1  # the job is on its second run (epoch 2): epoch 1 is a run the master requeued


def _requeued_and_running_again(h: Harness) -> tuple[FakeAgent, FakeAgent, str]:
    """A job whose first run (epoch 1, on n1) was lost with its node, now running on n2."""
    n1, n2 = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.start(nodelist=["n1", "n2"], retries=3)
    assert h.job(job_id).allocation[0].node_id == "n1"
    h.advance(h.config.networking.timeout + 1)
    n2.heartbeat()
    h.tick()  # n1 is lost: the job is requeued, with a backoff
    h.advance(h.config.scheduling.retry_backoff_base)
    n2.heartbeat()
    h.tick()
    job = h.job(job_id)
    assert (job.state, job.epoch, job.allocation[0].node_id) == (JobState.RUNNING, 2, "n2")
    n2.started(job_id)
    n2.link.take()
    return n1, n2, job_id


FENCING: list[tuple[str, Callable[[str, int], object], type | None]] = [
    # (case, the stale message from n1, what the master answers it with)
    ("stale output: dropped", lambda j, e: Output(job_id=j, epoch=e, stream="o", data="x"), None),
    (
        "stale exit: ignored, forgotten",
        lambda j, e: Exited(job_id=j, epoch=e, exit_code=0, time=1),
        Forget,
    ),
    (
        "stale start: killed",
        lambda j, e: Started(job_id=j, epoch=e, pid=1, hostname="h", ip="10.0.0.1", time=1),
        Kill,
    ),
    ("stale port: killed", lambda j, e: PortReserved(job_id=j, epoch=e, port=1), Kill),
]


@pytest.mark.parametrize(("make", "answer"), [c[1:] for c in FENCING], ids=[c[0] for c in FENCING])
def test_messages_of_an_older_run_are_fenced(
    h: Harness, make: Callable[[str, int], object], answer: type | None
) -> None:
    n1, n2, job_id = _requeued_and_running_again(h)
    n1.hello()  # back, after its jobs were moved away
    n1.link.take()
    before = h.job(job_id).to_record()
    n1.send(make(job_id, STALE))  # type: ignore[arg-type]
    assert h.job(job_id).to_record() == before  # the current run is untouched
    replies = n1.link.take()
    assert [type(m) for m in replies] == ([answer] if answer else [])
    if answer is Kill:
        assert replies[0].epoch == STALE and replies[0].reason == "stale"
    assert h.outputs.read(job_id) == []
    assert n2.link.take() == []


def test_a_start_of_a_job_the_master_does_not_know_is_killed(h: Harness) -> None:
    a = h.agent("n1")
    a.send(Started(job_id="a1b2c3d4", epoch=3, pid=1, hostname="h", ip="10.0.0.1", time=1.0))
    (kill,) = a.kills()
    assert (kill.job_id, kill.epoch, kill.reason) == ("a1b2c3d4", 3, "stale")


def test_an_exit_is_forgotten_only_after_its_effect_is_written(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start()
    a.link.take()
    h.cl.agent_message("n1", Exited(job_id=job_id, epoch=1, exit_code=0, time=1.0))
    assert a.link.sent == []  # not before the flush
    assert h.stored(job_id).state == JobState.RUNNING
    h.settle()
    assert h.stored(job_id).state == JobState.COMPLETED
    assert a.link.take() == [Forget(job_id=job_id, epoch=1)]


def test_an_exit_is_forgotten_only_after_its_output_is_stored(h: Harness) -> None:
    """An output store that writes later (PostgreSQL's buffer): the agent keeps the run,
    and would re-send its output, until the store says it has it."""
    held: list[Callable[[], None]] = []
    h.outputs.when_stored = held.append  # type: ignore[method-assign]
    a = h.agent("n1")
    job_id = h.start()
    a.link.take()
    a.send(Output(job_id=job_id, epoch=1, stream="o", data="last\n", offset=0, end=5))
    h.cl.agent_message("n1", Exited(job_id=job_id, epoch=1, exit_code=0, time=1.0))
    h.settle()
    assert h.stored(job_id).state == JobState.COMPLETED
    assert a.link.take() == []  # the output is not stored yet
    (stored,) = held
    stored()
    h.settle()
    assert a.link.take() == [Forget(job_id=job_id, epoch=1)]


# ---- reconcile at hello ---------------------------------------------------------------


def test_a_restarted_agent_loses_its_jobs_for_one_failure(h: Harness) -> None:
    a = h.agent("n1", gpus=3)
    lost = [h.start(), h.start()]
    kept = h.start()
    welcome = a.hello([a.running(kept), RunningReport(job_id="stale001", epoch=1, pid=9)])
    assert [r.job_id for r in welcome.kill] == ["stale001"]
    assert [(r.job_id, r.epoch) for r in welcome.resume] == [(kept, 1)]
    assert h.node("n1").failures == 1  # two jobs lost, one restart
    for job_id in lost:
        job = h.job(job_id)
        assert job.state == JobState.QUEUED and job.retries == 1
        assert job.reason == "requeued: n1 restarted and no longer runs it (retry 1/5)"
        assert job.attempts[-1].end_reason == "n1 restarted and no longer runs it"
    assert h.job(kept).state == JobState.RUNNING
    assert h.node("n1").busy == {2: kept} and h.node("n1").jobs == {kept}
    # The same agent saying hello again: nothing more is lost, no failure more.
    assert a.hello([a.running(kept)]).kill == []
    assert h.node("n1").failures == 1


def test_a_cancelled_job_still_running_at_hello_is_killed_and_its_end_taken(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start()
    assert h.cl.cancel(h.job(job_id), actor="alice")
    welcome = a.hello([a.running(job_id)])
    assert [r.job_id for r in welcome.kill] == [job_id]
    a.exited(job_id, 143)
    job = h.job(job_id)
    assert (job.state, job.reason, job.retries) == (JobState.CANCELLED, "cancelled", 0)


def test_master_crash_before_the_launch_was_sent_costs_no_retry(h: Harness) -> None:
    """The job is stored running with its launch sent, the master dies before the launch
    leaves: at the agent's next hello it is requeued free and starts again at once."""
    a = h.agent("n1")
    job_id = h.submit()
    h.tick()  # planned and started: written, then the launch handed to the connection
    assert h.stored(job_id).allocation[0].phase == SlotPhase.SENT
    h.crash()  # ... which dies with the master before the agent has read it
    assert h.job(job_id).state == JobState.RUNNING  # loaded as running
    a.hello([])
    job = h.job(job_id)
    assert job.state == JobState.QUEUED
    assert job.retries == 0 and job.eligible_time <= h.clock.now  # no backoff either
    assert job.reason == "requeued: the launch never reached n1"
    assert h.node("n1").failures == 0 and h.node("n1").busy == {}
    h.tick()
    assert h.job(job_id).state == JobState.RUNNING and h.job(job_id).epoch == 2
    assert [m.epoch for m in a.launches()] == [2]


def test_master_crash_after_the_start_was_stored_costs_a_retry_when_lost(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start()
    assert h.stored(job_id).allocation[0].phase == SlotPhase.STARTED
    h.crash()
    a.hello([])  # the agent lost a job it had started: a real loss
    job = h.job(job_id)
    assert job.state == JobState.QUEUED and job.retries == 1
    assert h.node("n1").failures == 1


def test_a_launch_the_agent_has_counts_as_started_at_hello(h: Harness) -> None:
    """Stored as sent, reported running after a master restart (its start never reached
    the master): adopted, not requeued; lost later, it counts."""
    a = h.agent("n1")
    job_id = h.submit()
    h.tick()
    assert h.stored(job_id).allocation[0].phase == SlotPhase.SENT
    h.crash()
    welcome = a.hello([RunningReport(job_id=job_id, epoch=1, pid=7)])
    assert welcome.kill == [] and [r.job_id for r in welcome.resume] == [job_id]
    job = h.job(job_id)
    assert job.state == JobState.RUNNING and job.allocation[0].phase == SlotPhase.STARTED
    a.hello([])  # and later lost: now it counts
    assert h.job(job_id).retries == 1


# ---- messages that cannot be sent ---------------------------------------------------


def test_an_unencodable_launch_fails_its_job_and_the_batch_goes_out(h: Harness) -> None:
    """A lone surrogate in one job's argv: that job fails with one sentence (no retry
    spent, the node not blamed, its GPU given back); the other launches go out."""
    a = h.agent("n1", gpus=3)
    with pytest.raises(Unsendable):
        a.link.send(Kill(job_id="a1b2c3d4", reason="bad \ud800"))
    jobs = []
    for i, arg in enumerate(["one", "bad \ud800", "three"]):
        spec = h.submit("x", gpus=1)
        job = h.job(spec)
        job.argv = ["echo", arg]  # past the edge's checks, as a record from before them
        jobs.append(job)
        h.cl.life.start(job, [("n1", [i])])
    h.settle()
    assert [m.job_id for m in a.launches()] == [jobs[0].id, jobs[2].id]
    bad = jobs[1]
    assert bad.state == JobState.FAILED
    assert bad.reason == (
        "could not be sent to n1: a string in it is not valid Unicode (a lone surrogate)"
    )
    assert bad.retries == 0 and h.node("n1").failures == 0
    assert h.node("n1").busy == {0: jobs[0].id, 2: jobs[2].id}
    assert not a.link.closed
    assert h.stored(bad.id).state == JobState.FAILED


# ---- GPU telemetry ----------------------------------------------------------------------


def test_idle_notify_writes_to_the_job_output(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"scheduling": {"idle_after_minutes": 1, "idle_action": "notify"}})
    a = h.agent("n1", gpus=1)
    job_id = h.start(interactive=True)
    job = h.job(job_id)
    for dt, util in ((0, 90.0), (30, 0.0), (20, 0.0), (41, 0.0)):
        h.advance(dt)
        a.heartbeat([GpuTelemetry(index=0, utilization_pct=util, memory_used_mb=40)])
        if dt != 41:
            assert h.cl.public_job(job)["idle"] is False
    assert h.cl.public_job(job)["idle"] is True
    assert h.cl.public_job(job)["idle_since"] == h.clock.now - 91
    assert job.gpu_memory_peak_mb == 40 and job.gpu_util_mean == pytest.approx(22.5)
    (note,) = h.outputs.read(job_id)
    assert note["s"] == "e" and "idle for 1 minutes" in note["d"]
    assert job.state == JobState.RUNNING  # notify does not cancel
    assert len(h.events("idle")) == 1


def test_idle_cancel_stops_the_job_with_its_reason(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"scheduling": {"idle_after_minutes": 1, "idle_action": "cancel"}})
    a = h.agent("n1", gpus=1)
    job_id = h.start(interactive=True)
    a.link.take()
    for dt in (0, 61):
        h.advance(dt)
        a.heartbeat([GpuTelemetry(index=0, utilization_pct=0.0)])
    (kill,) = a.kills()
    assert kill.reason == "cancelled"
    assert h.job(job_id).reason == "cancelling"
    assert [e["target"] for e in h.events("cancel")] == [job_id]
    a.exited(job_id, 143)
    job = h.job(job_id)
    assert (job.state, job.reason) == (JobState.CANCELLED, "idle for 1 minutes")


def test_gpus_used_outside_mgpu_are_not_offered_until_freed(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    a.heartbeat([GpuTelemetry(index=0, foreign_memory_mb=4000)])
    assert h.node("n1").foreign_blocked == frozenset({0})
    job_id = h.start()
    assert h.job(job_id).allocation[0].gpu_ids == [1]
    waiting = h.submit()
    h.tick()
    assert h.job(waiting).state == JobState.QUEUED
    a.heartbeat([GpuTelemetry(index=0, foreign_memory_mb=0)])
    assert h.node("n1").foreign_blocked == frozenset()
    h.tick()
    assert h.job(waiting).allocation[0].gpu_ids == [0]


def test_a_node_joining_is_online_or_back_to_its_drain(h: Harness) -> None:
    a = h.agent("n1")
    assert h.node("n1").state == NodeState.ONLINE
    h.cl.drain("n1", "maintenance")
    assert h.node("n1").state == NodeState.DRAINED
    a.hello()
    assert h.node("n1").state == NodeState.DRAINED  # the drain is kept across a join
    h.submit()
    h.tick()
    assert a.launches() == []


# ---- output past the cap ----------------------------------------------------------------


def test_output_past_the_cap_is_dropped_and_the_job_runs_on(
    make_harness: Callable[..., Harness],
) -> None:
    """`limits.max_output_per_job`: one marker, then nothing; a reconnect is told that
    nothing more of the run is wanted (ALL_SENT), and a resend is dropped all the same."""
    h = make_harness({"limits": {"max_output_per_job": "1K"}})
    a = h.agent("n1")
    job_id = h.start()

    def out(data: str, start: int) -> None:
        a.send(
            Output(
                job_id=job_id, epoch=1, stream="o", data=data, offset=start, end=start + len(data)
            )
        )

    out("x" * 600, 0)
    out("y" * 1000, 600)
    out("z" * 100, 1600)
    welcome = a.hello([a.running(job_id)])
    assert [(r.job_id, r.stdout, r.stderr) for r in welcome.resume] == [
        (job_id, ALL_SENT, ALL_SENT)
    ]
    out("x" * 600, 0)  # an agent that lost its place sends it all again
    a.exited(job_id, code=3)
    job = h.job(job_id)
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    records = h.outputs.read(job_id)
    assert [r["d"][:1] for r in records] == ["x", "y", "\n"]
    assert records[-1]["d"] == "\nmgpu: output truncated at 1 KiB (limits.max_output_per_job)\n"
    lines = (h.root / "output" / f"{job_id}.jsonl").read_bytes().splitlines(keepends=True)
    assert 1024 - 12 < sum(map(len, lines[:-1])) <= 1024  # the marker is past the cap
