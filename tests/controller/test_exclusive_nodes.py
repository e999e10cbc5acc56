"""`--exclusive` in the master: a node to one job, whatever the other jobs hold.

A `--gpus 0` job that asks nothing holds none of a node's GPUs, CPUs or memory, so only the
master's ledger of who runs where can keep it and an exclusive job apart; and a start the
scheduler decided is checked again against that ledger before it is carried out.
"""

from __future__ import annotations

from harness import Harness

from mgpu.model import JobState


def test_an_exclusive_job_waits_for_a_cpu_only_job_to_end(h: Harness) -> None:
    a = h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    cpu_only = h.start(gpus=0)
    assert h.job(cpu_only).state == JobState.RUNNING
    whole = h.submit(gpus=1, exclusive=True)
    h.tick()
    assert h.job(whole).state == JobState.QUEUED
    assert h.job(whole).reason == "waiting for a whole node"
    a.exited(cpu_only)
    h.tick()
    job = h.job(whole)
    assert job.state == JobState.RUNNING
    slot = job.allocation[0]
    assert (slot.gpu_ids, slot.cpus, slot.mem_mb) == ([0, 1], 4, 8192)


def test_nothing_starts_beside_a_running_exclusive_job(h: Harness) -> None:
    a = h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    whole = h.start(gpus=1, exclusive=True)
    assert h.job(whole).state == JobState.RUNNING
    assert h.node("n1").whole_job == whole
    cpu_only = h.submit(gpus=0)
    h.tick()
    assert h.job(cpu_only).state == JobState.QUEUED
    a.exited(whole)
    h.tick()
    assert h.node("n1").whole_job is None
    assert h.job(cpu_only).state == JobState.RUNNING


def test_a_start_beside_an_exclusive_job_is_dropped_when_carried_out(h: Harness) -> None:
    """The ledger's last word: a start decided on an older view of the node is not made."""
    h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    state = h.cl.state
    assert state.room("n1", 0, 0)
    whole = h.start(gpus=1, exclusive=True)
    assert not state.room("n1", 0, 0)  # held whole: not even a job holding nothing
    h.agents["n1"].exited(whole)
    h.tick()
    h.start(gpus=0)
    assert state.room("n1", 0, 0)
    assert not state.room("n1", 0, 0, whole=True)  # something runs there: not idle


def test_submit_exclusive_is_in_the_jobs_resources(h: Harness) -> None:
    h.agent("n1", gpus=2, cpus=4, mem_mb=8192)
    whole = h.start(gpus=1, exclusive=True)
    public = h.job(whole).to_public()
    assert public["resources"]["exclusive"] is True
    assert (public["cpus"], public["mem_mb"]) == (4, 8192)
