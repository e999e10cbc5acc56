"""A reservation's window opens: non-member jobs still on its GPUs are stopped (preempted:
back to the queue, no retry spent, the reason naming the reservation), its members start."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import Harness

from mgpu.master.control.reservations import ReservationRequestError
from mgpu.model import DesiredState, JobState

HOUR = 3600.0


def reserve(h: Harness, **body: object) -> dict[str, object]:
    body = {"name": "course-a", "gpus": 2, "start": "now+1", "duration": "2:00:00", **body}
    return h.cl.create_reservation(body, actor="admin", address=None)


def test_a_job_without_a_limit_is_not_placed_on_gpus_reserved_later(h: Harness) -> None:
    h.agent("n1", gpus=2)
    reserve(h, start="now+2d")  # further off than any default limit would matter
    unlimited = h.submit(gpus=1)
    hour = h.submit(gpus=1, time="00:30:00")
    h.tick()
    assert h.job(unlimited).state == JobState.QUEUED
    assert "reservation course-a takes 2 GPUs" in h.job(unlimited).reason
    assert h.job(hour).state == JobState.RUNNING  # it ends before the window


def test_an_unlimited_job_is_not_counted_as_ending_at_the_default_limit(
    make_harness: Callable[..., Harness],
) -> None:
    """The issue's case: with `default_time_limit: 10 s` an UNLIMITED job (which keeps no
    limit) was counted as ending in 10 s, started on a GPU reserved from 30 s later and
    held it through the window."""
    h = make_harness({"scheduling": {"default_time_limit": "00:00:10"}})
    h.agent("n1", gpus=2)
    reserve(h, gpus=1, start="now+0.5")
    first, second = (h.submit(gpus=1, time="UNLIMITED") for _ in range(2))
    h.tick()
    (gpu,) = h.cl.list_reservations()[0]["allocation"][0]["gpu_ids"]
    assert h.job(first).state == JobState.RUNNING
    assert h.job(first).allocation[0].gpu_ids != [gpu]
    assert h.job(second).state == JobState.QUEUED
    assert h.job(second).reason == "waiting for 1 GPU (reservation course-a takes 1 GPU in 30s)"


def test_a_reservation_on_a_running_unlimited_job_is_refused_unless_forced(h: Harness) -> None:
    h.agent("n1", gpus=2)
    job_id = h.start(gpus=2)
    with pytest.raises(ReservationRequestError, match=f"job {job_id} may still run then"):
        reserve(h, start="now+100d")
    assert h.cl.list_reservations() == []
    made = reserve(h, ignore_jobs=True)
    assert made["allocation"] == [{"node_id": "n1", "gpu_ids": [0, 1]}]


def test_the_window_opens_a_non_member_is_stopped_and_the_member_starts(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    outsider = h.start(gpus=2)
    reserve(h, ignore_jobs=True, users=["alice"])
    member = h.submit(gpus=2, reservation="course-a")
    a.link.take()
    h.tick()
    assert h.job(outsider).desired == DesiredState.RUN  # the window is not open yet
    assert a.kills() == []
    h.advance(61)
    a.heartbeat()
    h.tick()
    (kill,) = a.kills()
    assert kill.job_id == outsider
    h.tick()  # asked once
    assert a.kills() == []
    a.exited(outsider, 143)
    job = h.job(outsider)
    assert (job.state, job.retries) == (JobState.QUEUED, 0)
    assert job.reason == (
        "requeued: preempted by reservation course-a, whose window opened on its GPUs"
    )
    h.tick()
    assert h.job(member).state == JobState.RUNNING
    assert h.job(outsider).state == JobState.QUEUED  # kept off the reserved GPUs now


def test_a_share_on_reserved_gpus_is_stopped_too(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    shared = h.start(gpu_share=0.5)
    reserve(h, gpus=1, ignore_jobs=True)
    a.link.take()
    h.advance(61)
    a.heartbeat()
    h.tick()
    assert [k.job_id for k in a.kills()] == [shared]


def test_a_terminal_on_reserved_gpus_is_cancelled_it_cannot_be_requeued(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    terminal = h.start("bash", pty=True)
    reserve(h, gpus=1, ignore_jobs=True, start="now+0.01")
    a.link.take()
    h.advance(1)
    h.tick()
    assert [k.job_id for k in a.kills()] == [terminal]
    a.exited(terminal, 129)
    job = h.stored(terminal)
    assert job.state == JobState.CANCELLED
    assert job.reason == "cancelled by reservation course-a, whose window opened on its GPUs"
