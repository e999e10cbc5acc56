"""A queued job's wait reason is typed (`reason_code`, beside its English `reason`), and
Slurm's commands show Slurm's code from it: a job behind another job's GPUs is
`(Resources)`, one that would fit but waits behind a higher-priority job `(Priority)`,
never `(Dependency)` for a job that has none."""

from __future__ import annotations

from harness import Harness

from mgpu.model import JobState, WaitCode
from mgpu.slurm import squeue, states


def _squeue_reason(h: Harness, job_id: str) -> str:
    public = h.job(job_id).to_public()
    return squeue.KNOWN["R"][1](public)


def test_a_job_behind_another_jobs_gpus_is_resources(h: Harness) -> None:
    h.agent("n1", gpus=2)
    h.start("sleep 100", gpus=2)
    behind = h.submit(gpus=2)
    h.tick()
    assert h.job(behind).reason_code is WaitCode.RESOURCES
    assert _squeue_reason(h, behind) == "(Resources)"


def test_a_job_that_fits_behind_a_higher_priority_waiting_job_is_priority(h: Harness) -> None:
    h.agent("n1", gpus=2)
    h.start("sleep 100", gpus=1, time="10:00")
    head = h.submit(gpus=2, priority=10)  # waits for both GPUs, first in line
    small = h.submit(gpus=1, time="2:00:00")  # would fit now, but would delay the head
    h.tick()
    assert (h.job(head).reason_code, h.job(small).reason_code) == (
        WaitCode.RESOURCES,
        WaitCode.PRIORITY,
    )
    assert (_squeue_reason(h, head), _squeue_reason(h, small)) == ("(Resources)", "(Priority)")


def test_held_and_dependent_jobs(h: Harness) -> None:
    h.agent("n1", gpus=2)
    running = h.start("sleep 100", gpus=1)
    held = h.submit(gpus=1, hold=True)
    dependent = h.submit(gpus=1, dependency=f"afterok:{running}")
    h.tick()
    assert h.job(dependent).reason_code is WaitCode.DEPENDENCY
    assert _squeue_reason(h, held) == "(JobHeldUser)"
    assert _squeue_reason(h, dependent) == "(Dependency)"
    assert states.reason(h.job(running).to_public()) == "None"  # running: no reason


def test_a_job_with_a_future_begin_waits_as_begintime_then_starts(h: Harness) -> None:
    """`--begin` is honoured (it was accepted and ignored: a job that re-submitted itself
    with `--begin=now+24hour` ran at once, looping): the job waits `(BeginTime)`, shows
    its begin as its expected start, and starts once the clock passes it, by itself."""
    a = h.agent("n1", gpus=2)
    begin = h.clock.now + 3600
    later = h.submit(gpus=1, begin=begin)
    h.tick()
    job = h.job(later)
    assert (job.state, job.reason_code) == (JobState.QUEUED, WaitCode.BEGIN_TIME)
    assert _squeue_reason(h, later) == "(BeginTime)"
    assert h.cl.public_job(job)["expected_start"] == begin
    assert not a.launches()
    h.advance(3590)
    a.heartbeat()
    h.tick()
    assert h.job(later).state is JobState.QUEUED and not a.launches()
    assert not h.cl.loop.backoff_expired()
    h.advance(11)
    assert h.cl.loop.backoff_expired()  # the loop wakes for it, with nothing else new
    a.heartbeat()
    h.tick()
    assert [launch.job_id for launch in a.launches()] == [later]


def test_a_begin_already_past_runs_at_once(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    now_job = h.submit(gpus=1, begin=h.clock.now - 5)
    h.tick()
    assert [launch.job_id for launch in a.launches()] == [now_job]


def test_sacct_says_dependency_only_for_a_job_that_waited_on_one(h: Harness) -> None:
    """Slurm's sacct Reason after a job left the queue is the reason it last waited for: a
    job held on its dependency says `Dependency`; one whose dependency was already met
    when it was submitted never waited on it and says `None` (mgpu said `Dependency` for
    any job with a dependency)."""
    from mgpu.slurm import sacct

    a = h.agent("n1", gpus=2)
    first = h.start("true", gpus=1, agent=a)
    waited = h.submit(gpus=1, dependency=f"afterok:{first}")
    h.tick()
    assert h.job(waited).reason_code is WaitCode.DEPENDENCY
    a.started(first)
    a.exited(first, 0)
    h.settle()
    met = h.submit(gpus=1, dependency=f"afterok:{first}")  # its target already completed
    h.tick()
    reasons = {j: sacct._reason(h.job(j).to_public()) for j in (waited, met)}
    assert h.job(waited).state is not JobState.QUEUED and h.job(met).state is not JobState.QUEUED
    assert reasons == {waited: "Dependency", met: "None"}
    stored = h.job(waited).to_public()
    del stored["waited_on_dependency"]  # a record from before the flag: as before
    assert sacct._reason(stored) == "Dependency"
