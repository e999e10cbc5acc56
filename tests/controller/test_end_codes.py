"""An ended job's end is typed (`end_code`, beside its English `reason`), set where the
master ends it, and in its public JSON: Slurm's commands show Slurm's state from it
(NODE_FAIL for a job out of retries after its node was lost, TIMEOUT for a time limit)."""

from __future__ import annotations

import pytest
from harness import Harness

from factories import master_job
from mgpu.model import EndCode, EndReason, Job, JobState
from mgpu.slurm import states


def _public(h: Harness, job_id: str) -> dict[str, object]:
    return h.job(job_id).to_public()


def test_a_silent_node_out_of_retries_ends_node_fail(h: Harness) -> None:
    h.agent("n1", gpus=1)
    b = h.agent("n2", gpus=1)
    job_id = h.start(nodelist=["n1"], retries=0)
    h.advance(h.config.networking.timeout + 1)
    b.heartbeat()
    h.tick()
    public = _public(h, job_id)
    assert (public["state"], public["end_code"]) == ("failed", "node_fail")
    assert states.state(public) == "NODE_FAIL"
    assert h.stored(job_id).end_code is EndCode.NODE_FAIL


def test_a_node_that_could_not_launch_it_out_of_retries_ends_boot_fail(h: Harness) -> None:
    h.agent("n1")
    job_id = h.start(retries=0)
    h.cl.life.requeue(h.job(job_id), EndReason.LAUNCH_FAILED, "n1: could not launch")
    h.settle()
    assert _public(h, job_id)["end_code"] == "boot_fail"
    assert states.state(_public(h, job_id)) == "BOOT_FAIL"


def test_a_time_limit_ends_timeout(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start("sleep 100", time="1:00")
    a.exited(job_id, 137, timed_out=True)
    public = _public(h, job_id)
    assert (public["state"], public["end_code"]) == ("timeout", "timeout")
    assert (states.state(public), states.exit_code(public)) == ("TIMEOUT", "0:9")


@pytest.mark.parametrize(
    ("code", "end_code", "slurm"),
    [(0, "completed", "COMPLETED"), (3, "failed", "FAILED")],
)
def test_an_exit_ends_completed_or_failed(h: Harness, code: int, end_code: str, slurm: str) -> None:
    a = h.agent("n1")
    job_id = h.start()
    a.exited(job_id, code)
    public = _public(h, job_id)
    assert (public["end_code"], states.state(public)) == (end_code, slurm)


def test_a_queued_job_cancelled_ends_cancelled(h: Harness) -> None:
    job_id = h.submit(nodelist=["nowhere"])
    h.cl.life.finish(h.job(job_id), EndReason.CANCELLED, "cancelled by alice")
    h.settle()
    assert _public(h, job_id)["end_code"] == "cancelled"


def test_a_running_job_has_no_end_code(h: Harness) -> None:
    h.agent("n1")
    job_id = h.start("sleep 100")
    assert _public(h, job_id)["end_code"] is None


def _old_ended(state: JobState, reason: str | None) -> dict[str, object]:
    rec = master_job("old00002", state=state).to_record()
    rec.pop("end_code")
    rec["reason"] = reason
    return rec


OLD = [
    ("completed", JobState.COMPLETED, None, EndCode.COMPLETED),
    ("failed", JobState.FAILED, "exit code 3", EndCode.FAILED),
    ("node lost", JobState.FAILED, "node n1 lost", EndCode.NODE_FAIL),
    ("node removed", JobState.FAILED, "node n1 removed", EndCode.NODE_FAIL),
    ("cancelled", JobState.CANCELLED, "cancelled by alice", EndCode.CANCELLED),
    ("timeout", JobState.TIMEOUT, "time limit reached", EndCode.TIMEOUT),
]


@pytest.mark.parametrize(("state", "reason", "code"), [c[1:] for c in OLD], ids=[c[0] for c in OLD])
def test_ended_records_of_older_versions_load_with_an_end_code(
    state: JobState, reason: str | None, code: EndCode
) -> None:
    job = Job.from_record(_old_ended(state, reason))
    assert job.end_code is code
    assert Job.from_record(job.to_record()).to_record() == job.to_record()


def test_a_queued_record_of_an_older_version_has_no_end_code() -> None:
    assert Job.from_record(_old_ended(JobState.QUEUED, "node n1 lost")).end_code is None
