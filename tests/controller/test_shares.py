"""The GPU ledger with fractional jobs (`--gpu-share`): shares taken and given back, a whole
GPU never beside them, the launch's share variables, the charge at F x time, the ledger
rebuilt from the jobs after a master restart; reservations kept in the store."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness, seen_env

from mgpu.master.control.reservations import ReservationRequestError
from mgpu.master.state.shares import job_share_units
from mgpu.model import JobState


def test_shares_stack_up_to_one_gpu_and_go_when_their_jobs_end(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    quarter = [h.start(gpu_share=0.25) for _ in range(3)]
    half = h.submit(gpu_share=0.5)  # 0.75 + 0.5 > 1: waits
    whole = h.submit(gpus=1)
    h.tick()
    node = h.node("n1")
    assert node.busy == {} and node.shares == {0: dict.fromkeys(quarter, 250)}
    assert node.free_gpus() == frozenset()
    assert h.job(half).state == h.job(whole).state == JobState.QUEUED
    assert not h.cl.state.free("n1", [0]) and h.cl.state.free("n1", [0], 250)
    assert not h.cl.state.free("n1", [0], 500)

    launch = next(m for m in a.launches() if m.job_id == quarter[0])
    memory = h.node("n1").gpus[0].memory_mb // 4
    assert (launch.grant.share_units, launch.grant.gpu_memory_mb) == (250, memory)
    assert "MGPU_GPU_SHARE" not in launch.env  # the grant's, typed: not env text
    env = seen_env(launch)
    assert env["MGPU_GPU_SHARE"] == "0.25"
    assert env["MGPU_GPU_MEMORY_LIMIT_MB"] == str(memory)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"

    a.exited(quarter[0])
    h.tick()  # 0.5 + 0.5 = 1: the half fits now, the whole job still waits
    assert h.job(half).state == JobState.RUNNING
    assert node.shares[0] == {quarter[1]: 250, quarter[2]: 250, half: 500}
    assert h.job(whole).state == JobState.QUEUED
    a.started(half)
    for j in (quarter[1], quarter[2], half):
        a.exited(j)
    h.tick()
    assert node.shares == {} and node.busy == {0: whole}


def test_the_share_ledger_is_rebuilt_after_a_master_restart(h: Harness) -> None:
    a = h.agent("n1", gpus=2)
    shares = [h.start(gpu_share=0.4) for _ in range(2)]
    whole = h.start(gpus=1)
    h.settle()
    before = {g: dict(t) for g, t in h.node("n1").shares.items()}
    assert sum(len(t) for t in before.values()) == 2
    h.crash()
    node = h.node("n1")
    assert {g: dict(t) for g, t in node.shares.items()} == before
    assert list(node.busy.values()) == [whole]
    a.hello([a.running(j) for j in [*shares, whole]])  # reconcile keeps them
    h.tick()
    assert {g: dict(t) for g, t in node.shares.items()} == before
    assert job_share_units(h.job(shares[0])) == 400


def test_a_share_is_charged_its_fraction_of_the_gpu_time(h: Harness) -> None:
    a = h.agent("n1", gpus=1)
    job_id = h.start(gpu_share=0.25, user="carol")
    h.advance(400)
    a.exited(job_id)
    h.settle()
    usage = h.cl.usage.snapshot(h.clock.now)
    assert usage["carol"] == pytest.approx(0.25 * 400, rel=1e-6)


def test_reservations_are_kept_in_the_store(h: Harness) -> None:
    h.agent("n1", gpus=4)
    now = h.clock.now
    made = h.cl.create_reservation(
        {"name": "course", "gpus": 2, "start": "now+10", "duration": "60", "users": ["owner"]},
        actor="owner",
        address=None,
    )
    assert made["start"] == now + 600 and made["end"] == now + 600 + 3600
    with pytest.raises(ReservationRequestError, match="already exists"):
        h.cl.create_reservation({"name": "course", "gpus": 1, "duration": "5"}, None, None)
    h.crash()
    assert [r["name"] for r in h.cl.list_reservations()] == ["course"]
    (snap,) = h.cl.loop.reservations(h.clock.now)
    assert snap.gpus == 2 and snap.users == frozenset({"owner"})
    h.advance(600 + 3600)  # the window is over: dropped, and from the store too
    assert h.cl.list_reservations() == []
    h.crash()
    assert h.cl.list_reservations() == []
    assert [e["kind"] for e in h.events("reservation_ended")] == ["reservation_ended"]


def test_billing_weights_charge_the_cpus_a_job_held(make_harness: Any) -> None:
    h = make_harness({"scheduling": {"billing": {"gpu": 1.0, "cpu": 0.5}}})
    a = h.agent("n1", gpus=1)
    job_id = h.start(gpus=1, user="dave")
    h.job(job_id).allocation[0].cpus = 4  # what the launch held on the node
    h.advance(400)
    a.exited(job_id)
    h.settle()
    usage = h.cl.usage.snapshot(h.clock.now)
    assert usage["dave"] == pytest.approx((1.0 + 0.5 * 4) * 400, rel=1e-6)
