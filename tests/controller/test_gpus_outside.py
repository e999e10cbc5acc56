"""GPUs used outside mgpu and shares without MPS, as the master tells them: a waiting
job's reason names the GPU and who uses it (`queue`, `show` and the dashboard read
`public_job`), and a share job on a node without MPS is told once, in its output."""

from __future__ import annotations

from harness import Harness

from mgpu.client.render import render_nodes
from mgpu.gpuuse import outside_use
from mgpu.model import JobState
from mgpu.protocol import ForeignProcess, GpuTelemetry

BOB = ForeignProcess(pid=679, user="bob", memory_mb=3072)


def used_by_bob(index: int = 0, **fields: object) -> GpuTelemetry:
    return GpuTelemetry(
        index=index, foreign_memory_mb=3072, foreign=[BOB], foreign_processes=[679], **fields
    )


def test_a_job_waiting_for_a_gpu_used_outside_mgpu_says_which_and_whose(h: Harness) -> None:
    a = h.agent("gpu01", gpus=1)
    a.heartbeat([used_by_bob()])
    waiting = h.submit(gpus=1)
    h.tick()
    job = h.job(waiting)
    assert job.state == JobState.QUEUED
    assert h.cl.public_job(job)["reason"] == (
        "waiting for 1 GPU: gpu01 GPU 0 is used outside mgpu (3.0 GiB, pid 679, user bob)"
    )
    assert job.reason == "waiting for 1 GPU"  # what the scheduler said stays as it was
    # The node's GPU says the same in `mgpu nodes`.
    table = render_nodes(h.cl.nodes_public())
    assert "GPU 0 is used outside mgpu (3.0 GiB, pid 679, user bob)" in table

    # Another user's process joins: the first named is the biggest, the rest counted.
    eve = ForeignProcess(pid=700, user="eve", memory_mb=100)
    a.heartbeat([GpuTelemetry(index=0, foreign_memory_mb=3172, foreign=[BOB, eve])])
    assert h.cl.public_job(job)["reason"].endswith(
        "gpu01 GPU 0 is used outside mgpu (3.1 GiB, pid 679, user bob, and 1 more process)"
    )

    # The use ends: the job runs, and nothing is said any more.
    a.heartbeat([GpuTelemetry(index=0, foreign_memory_mb=0)])
    h.tick()
    assert h.job(waiting).state == JobState.RUNNING


def test_only_jobs_that_could_use_the_gpu_name_it(h: Harness) -> None:
    h.agent("gpu01", gpus=1).heartbeat([used_by_bob()])
    h.agent("gpu02", gpus=1)
    busy = h.start(gpus=1)  # takes gpu02's GPU
    assert h.job(busy).allocation[0].node_id == "gpu02"
    elsewhere = h.submit(gpus=1, nodelist=["gpu02"])
    cpu = h.submit(gpus=0, nodelist=["gpu02"], dependency=f"afterok:{busy}")
    anywhere = h.submit(gpus=1)
    h.tick()
    assert h.cl.public_job(h.job(elsewhere))["reason"] == "waiting for 1 GPU"
    assert "outside" not in (h.cl.public_job(h.job(cpu))["reason"] or "")
    assert "gpu01 GPU 0 is used outside mgpu" in h.cl.public_job(h.job(anywhere))["reason"]


def test_a_node_that_goes_away_is_not_named(h: Harness) -> None:
    a = h.agent("gpu01", gpus=1)
    a.heartbeat([used_by_bob()])
    waiting = h.submit(gpus=1)
    h.tick()
    a.disconnect()
    assert h.cl.public_job(h.job(waiting))["reason"] == "waiting for 1 GPU"


def test_a_share_job_on_a_node_without_mps_is_told_once(h: Harness) -> None:
    a = h.agent("gpu01", gpus=1)
    a.heartbeat([GpuTelemetry(index=0, shares_enforced=False)])
    job_id = h.start(gpu_share=0.5)
    whole = h.start(gpus=0)
    for _ in range(3):
        a.heartbeat([GpuTelemetry(index=0, shares_enforced=False)])
    (note,) = h.outputs.read(job_id)
    assert note["s"] == "e"
    assert note["d"].startswith("mgpu: gpu01 does not hold GPU shares to their limits")
    assert note["d"].count("\n") == 1
    assert h.outputs.read(whole) == []
    assert "GPU shares not enforced (no MPS)" in render_nodes(h.cl.nodes_public())


def test_a_share_job_where_mps_runs_is_told_nothing(h: Harness) -> None:
    a = h.agent("gpu01", gpus=1)
    job_id = h.start(gpu_share=0.5)
    a.heartbeat([GpuTelemetry(index=0, shares_enforced=True)])
    assert h.outputs.read(job_id) == []
    assert "not enforced" not in render_nodes(h.cl.nodes_public())


def test_outside_use_sentence() -> None:
    assert outside_use("n1", 2, {"foreign_memory_mb": 512}) == (
        "n1 GPU 2 is used outside mgpu (512 MiB)"
    )
    # Simulated use (pid 0), and an older agent's pids without owners.
    assert outside_use("n1", 0, {"foreign_memory_mb": 4096, "foreign_processes": [0]}) == (
        "n1 GPU 0 is used outside mgpu (4.0 GiB)"
    )
    tel = {"foreign_memory_mb": 2048, "foreign_processes": [5, 6, 7]}
    assert outside_use("n1", 0, tel) == (
        "n1 GPU 0 is used outside mgpu (2.0 GiB, pid 5, and 2 more processes)"
    )
    assert outside_use("n1", 0, None) == "n1 GPU 0 is used outside mgpu"
