"""A stop the master asked for stays that stop whatever happens to the agent meanwhile
(issue 25 item 8): a requeue, a cancel or a preemption whose agent is killed during the
kill grace and restarted ends as asked: requeued without a retry spent, or cancelled;
never failed, never a retry, never a failure charged to the node."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import FakeAgent, Harness

from mgpu.master.control.jobctl import Actor
from mgpu.model import EndReason, JobState

ALICE = Actor("alice", admin=False)
VANISHED = "the job's process vanished while the agent was down"


def _requeue(h: Harness, job_id: str) -> None:
    h.cl.jobctl.requeue(h.job(job_id), ALICE)


def _cancel(h: Harness, job_id: str) -> None:
    assert h.cl.cancel(h.job(job_id), "alice")


def _preempt(h: Harness, job_id: str) -> None:
    h.cl.life.request_stop(h.job(job_id), EndReason.PREEMPTED)


def _vanished(h: Harness, a: FakeAgent, job_id: str) -> None:
    """The restarted agent finds the run's process gone and reports no exit code."""
    a.hello([a.running(job_id, exited=True)])
    a.exited(job_id, None, launch_error=VANISHED, fatal=False)


def _forgotten(h: Harness, a: FakeAgent, job_id: str) -> None:
    """The restarted agent no longer has the run at all."""
    a.hello([])


def _master_crash_too(h: Harness, a: FakeAgent, job_id: str) -> None:
    """The master restarts as well, from what it had stored."""
    h.crash()
    a.hello([])


@pytest.mark.parametrize(
    ("stop", "state", "reason"),
    [
        (_requeue, JobState.QUEUED, "requeued: requested by alice"),
        (_cancel, JobState.CANCELLED, None),
        (_preempt, JobState.QUEUED, "requeued: preempted by higher-priority work"),
    ],
)
@pytest.mark.parametrize("restart", [_vanished, _forgotten, _master_crash_too])
def test_a_stop_interrupted_by_an_agent_restart_stays_that_stop(
    h: Harness,
    stop: Callable[[Harness, str], None],
    state: JobState,
    reason: str | None,
    restart: Callable[[Harness, FakeAgent, str], None],
) -> None:
    a = h.agent("n1", gpus=1)
    job_id = h.start("trap '' TERM; sleep 600", agent=a, retries=0)
    stop(h, job_id)
    h.settle()
    assert a.kills()  # the kill grace begins; the agent is killed during it
    a.disconnect()
    restart(h, a, job_id)
    job = h.job(job_id)
    assert job.state == state, job.reason
    assert job.retries == 0
    if reason is not None:
        assert job.reason == reason
    assert h.cl.state.nodes["n1"].failures == 0


def test_a_run_lost_without_a_stop_is_still_the_nodes_failure(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    job_id = h.start("sleep 600", agent=a, retries=1)
    a.disconnect()
    a.hello([])
    job = h.job(job_id)
    assert (job.state, job.retries) == (JobState.QUEUED, 1)
    assert h.cl.state.nodes["n1"].failures == 1
