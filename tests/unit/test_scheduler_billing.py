"""Fairshare charges by configurable weights (Slurm's TRESBillingWeights): GPU-hours by
default, CPUs and memory when the cluster config weighs them."""

from __future__ import annotations

import pytest

from factories import job, node, running
from mgpu.config import Scheduling
from mgpu.master.state.snapshot import scheduler_config
from mgpu.scheduler import (
    BillingWeights,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    UsageLedger,
    schedule,
)
from mgpu.scheduler.running import RunningSet, running_usage

NOW = 10_000.0
WEIGHTS = BillingWeights(gpu=2.0, cpu=0.5, mem_gb=0.25)


def jobs() -> list[RunningJob]:
    return [
        running("a", "n1", (0,), now=NOW, started=100.0, user="u", cpus=8, mem_mb=4096),
        running("b", "n1", (1, 2), now=NOW, started=50.0, user="u"),
        running("c", "n2", (0,), now=NOW, started=10.0, user="v", share=500, cpus=2),
    ]


def test_the_default_charges_gpu_seconds_alone() -> None:
    assert BillingWeights().gpu_only
    assert running_usage(NOW, jobs()) == {"u": 100.0 + 100.0, "v": 5.0}


def test_weights_charge_cpus_and_memory_held() -> None:
    # u: a 1 GPU, 8 CPUs, 4 GiB for 100 s; b 2 GPUs for 50 s. v: half a GPU, 2 CPUs, 10 s.
    u = 2.0 * (100 + 100) + 0.5 * 8 * 100 + 0.25 * 4 * 100
    v = 2.0 * 0.5 * 10 + 0.5 * 2 * 10
    assert running_usage(NOW, jobs(), WEIGHTS) == pytest.approx({"u": u, "v": v})
    kept = RunningSet(3600.0, jobs())
    assert kept.usage(NOW, WEIGHTS) == running_usage(NOW, jobs(), WEIGHTS)
    kept.drop("a")
    assert kept.usage(NOW, WEIGHTS) == running_usage(NOW, jobs()[1:], WEIGHTS)
    assert kept.copy().usage(NOW) == running_usage(NOW, jobs()[1:])


def test_the_ledger_charges_ended_and_running_work_by_the_weights() -> None:
    ledger = UsageLedger(half_life=1e12, billing=WEIGHTS)  # no decay to speak of
    ledger.start("u", 1.0, 0.0, cpus=8, mem_mb=2048)
    assert ledger.snapshot(10.0)["u"] == pytest.approx(10 * (2.0 + 4.0 + 0.5))
    ledger.stop("u", 1.0, 0.0, 10.0, cpus=8, mem_mb=2048)
    assert ledger.snapshot(20.0)["u"] == pytest.approx(65.0)  # ended: no more accrues
    ledger.charge("v", 0.0, 4, 0, 100.0, 20.0)
    held = RunningJob("w", "w", jobs()[0].placements, 10.0)
    got = ledger.snapshot(20.0, [held])
    assert got["v"] == pytest.approx(200.0)
    assert got["w"] == pytest.approx(10 * (2.0 + 4.0 + 1.0))
    plain = UsageLedger(half_life=1e12)
    plain.start("u", 1.0, 0.0, cpus=8, mem_mb=2048)
    assert plain.snapshot(10.0)["u"] == pytest.approx(10.0)  # GPU-seconds alone


def test_the_cluster_config_sets_the_weights() -> None:
    assert scheduler_config(Scheduling()).billing == BillingWeights()
    conf = Scheduling.model_validate({"billing": {"gpu": 1.0, "cpu": 0.125, "mem_gb": 0.5}})
    assert scheduler_config(conf).billing == BillingWeights(1.0, 0.125, 0.5)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Scheduling.model_validate({"billing": {"cpu": -1}})


def test_a_user_holding_many_cpus_weighs_less_when_cpus_are_billed() -> None:
    # u and v each run one GPU; u's job holds 60 CPUs.  By GPU-hours they are even.
    held = [
        running("a", "n1", (0,), now=NOW, started=1000.0, user="u", cpus=60),
        running("b", "n1", (1,), now=NOW, started=1000.0, user="v"),
    ]
    pending = [job("pu", user="u", submit=NOW), job("pv", user="v", submit=NOW)]
    nodes = [node("n1", (), gpus=2)]

    def priorities(billing: BillingWeights) -> dict[str, float]:
        config = SchedulerConfig(billing=billing, preemption=False)
        snap = Snapshot(
            NOW, nodes, pending, held, usage=running_usage(NOW, held, billing), config=config
        )
        return schedule(snap).priorities

    even = priorities(BillingWeights())
    assert even["pu"] == even["pv"]
    billed = priorities(BillingWeights(cpu=0.1))
    assert billed["pu"] < billed["pv"]
