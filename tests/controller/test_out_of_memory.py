"""A job its node killed for its memory limit (Exited `out_of_memory`) fails as its own
failure: end_code and end_reason `out_of_memory`, Slurm's OUT_OF_MEMORY and `0:125`, no
retry spent, not requeued, and its node neither drained nor charged a failure.  Its peak
memory (`max_rss_mb`) is what its agents said, the highest of its nodes."""

from __future__ import annotations

from harness import Harness

from mgpu.model import EndCode, EndReason, JobState
from mgpu.protocol import RunMemory
from mgpu.slurm import sacct, states


def test_out_of_memory_fails_the_job_without_a_retry_or_blaming_the_node(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    h.node("n1").failures = 2  # one more node failure would count
    job_id = h.start("python hog.py", retries=3)
    a.exited(job_id, 137, out_of_memory=True, max_rss_mb=2048)

    job = h.stored(job_id)
    assert job.state == JobState.FAILED and job.end_code is EndCode.OUT_OF_MEMORY
    assert job.retries == 0 and len(job.attempts) == 1
    assert job.max_rss_mb == 2048 and job.last_end is EndReason.OUT_OF_MEMORY
    public = job.to_public()
    assert (public["end_code"], public["end_reason"]) == ("out_of_memory", "out_of_memory")
    assert public["max_rss_mb"] == 2048 and "out of memory" in str(public["reason"])
    assert (states.state(public), states.exit_code(public)) == ("OUT_OF_MEMORY", "0:125")
    assert sacct.GETTERS["MaxRSS"](public) == "2G"

    node = h.node("n1")
    assert node.failures == 0 and not node.drain_requested
    again = h.start("true")  # the node takes the next job
    assert h.job(again).state == JobState.RUNNING


def test_a_gang_job_ends_out_of_memory_when_one_node_ran_out(h: Harness) -> None:
    a, b = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.start(nodes=2, gpus_per_node=1, retries=3)
    a.exited(job_id, 137, out_of_memory=True, max_rss_mb=900)
    b.exited(job_id, 143, max_rss_mb=1000)  # killed as its rank failed
    job = h.stored(job_id)
    assert (job.state, job.end_code, job.retries) == (JobState.FAILED, EndCode.OUT_OF_MEMORY, 0)
    assert job.max_rss_mb == 1000 and "on n1" in str(job.reason)
    assert not h.node("n1").drain_requested and not h.node("n2").drain_requested


def test_end_reason_is_how_the_last_run_ended(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    job_id = h.start(retries=3)
    assert h.job(job_id).to_public()["end_reason"] is None  # none ended yet
    a.exited(job_id, 3, max_rss_mb=5)
    public = h.stored(job_id).to_public()
    assert (public["end_reason"], public["end_code"], public["max_rss_mb"]) == ("exit", "failed", 5)
    assert sacct.GETTERS["MaxRSS"](public) == "5M"
    assert states.exit_code(public) == "3:0"


def test_a_running_jobs_peak_is_known_before_it_ends(h: Harness) -> None:
    """The agent's heartbeats carry each running job's peak so far: `mgpu show` and sacct's
    MaxRSS have it while the job runs; a stale run's or another node's word is not taken."""
    a, b = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    job_id = h.start()
    epoch = h.job(job_id).epoch
    assert h.job(job_id).to_public()["max_rss_mb"] is None
    a.heartbeat(memory=[RunMemory(job_id=job_id, epoch=epoch, max_rss_mb=300)])
    public = h.job(job_id).to_public()
    assert public["state"] == "running" and public["max_rss_mb"] == 300
    assert sacct.GETTERS["MaxRSS"](public) == "300M"
    a.heartbeat(memory=[RunMemory(job_id=job_id, epoch=epoch, max_rss_mb=200)])  # a peak
    assert h.job(job_id).max_rss_mb == 300  # never goes down
    a.heartbeat(memory=[RunMemory(job_id=job_id, epoch=epoch - 1, max_rss_mb=900)])
    b.heartbeat(memory=[RunMemory(job_id=job_id, epoch=epoch, max_rss_mb=900)])
    assert h.job(job_id).max_rss_mb == 300  # an older run's, a node it does not run on
    a.exited(job_id, 0, max_rss_mb=350)
    assert h.stored(job_id).max_rss_mb == 350
