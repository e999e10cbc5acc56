"""Multifactor priority: age, fairshare, job size and user priority."""

from __future__ import annotations

import pytest

from factories import job, node
from mgpu.scheduler import (
    JobRequest,
    PriorityWeights,
    SchedulerConfig,
    Snapshot,
    compute_priorities,
    fairshare_factors,
    schedule,
)
from mgpu.scheduler.priority import user_priority_factor

NODES = [node(f"node{i}", gpus=8) for i in range(2)]  # 16 GPUs


def snap(
    pending: list[JobRequest],
    now: float = 0.0,
    usage: dict[str, float] | None = None,
    **config: object,
) -> Snapshot:
    return Snapshot(
        now=now,
        nodes=NODES,
        pending=pending,
        usage=usage or {},
        config=SchedulerConfig(**config),  # type: ignore[arg-type]
    )


def test_fairshare_follows_slurms_classic_formula() -> None:
    f = fairshare_factors(["alice", "bob"], {}, {"alice": 300.0, "bob": 100.0})
    # Equal shares (1/2 each); usage fractions 3/4 and 1/4.
    assert f["alice"] == pytest.approx(2 ** (-0.75 / 0.5))
    assert f["bob"] == pytest.approx(2 ** (-0.25 / 0.5))
    assert fairshare_factors(["carol"], {}, {}) == {"carol": 1.0}


def test_fairshare_uses_configured_shares_and_a_mean_share_for_others() -> None:
    f = fairshare_factors(
        ["alice", "bob", "carol"], {"alice": 3.0, "bob": 1.0}, {"alice": 50.0, "bob": 50.0}
    )
    # carol gets the mean configured share (2): shares 3/6, 1/6, 2/6.
    assert f["alice"] == pytest.approx(2 ** (-0.5 / 0.5))
    assert f["bob"] == pytest.approx(2 ** (-0.5 / (1 / 6)))
    assert f["carol"] == 1.0
    assert fairshare_factors(["dave"], {"dave": 0.0}, {})["dave"] == 0.0


def test_factors_are_weighted_and_add_up() -> None:
    w = PriorityWeights(age=1000, fairshare=10000, job_size=100, user_priority=1000, max_age=100)
    pending = [
        job("old", submit=0.0, gpus=4),
        job("new", submit=150.0, gpus=16, priority=1000),
        job("future", submit=300.0, gpus=32, priority=-5000),
    ]
    prios, factors = compute_priorities(snap(pending, now=200.0, weights=w))
    assert factors[0] == pytest.approx(
        {"age": 1000.0, "fairshare": 10000.0, "job_size": 25.0, "user_priority": 500.0}
    )
    assert factors[1] == pytest.approx(
        {"age": 500.0, "fairshare": 10000.0, "job_size": 100.0, "user_priority": 1000.0}
    )
    # A submit time in the future counts as age 0; size and priority saturate.
    assert factors[2] == pytest.approx(
        {"age": 0.0, "fairshare": 10000.0, "job_size": 100.0, "user_priority": 0.0}
    )
    for p, f in zip(prios, factors, strict=True):
        assert p == pytest.approx(sum(f.values()))


def test_user_priority_mapping() -> None:
    assert user_priority_factor(0) == 0.5
    assert user_priority_factor(1000) == 1.0
    assert user_priority_factor(-1000) == 0.0
    assert user_priority_factor(5000) == 1.0
    assert user_priority_factor(100) == pytest.approx(0.55)


def test_gang_and_pinned_jobs_count_all_their_gpus_for_size() -> None:
    pending = [
        job("gang", nodes=2, gpus_per_node=8, gpus=16),
        job("pinned", gpus=2, node_gpu_ids=(("node0", (0, 1)), ("node1", (0, 1)))),
    ]
    _, factors = compute_priorities(snap(pending, cluster_gpus=32))
    assert factors[0]["job_size"] == pytest.approx(50.0)
    assert factors[1]["job_size"] == pytest.approx(100.0 * 4 / 32)


def test_the_light_user_goes_first_under_fairshare() -> None:
    nodes = [node("node0", gpus=1)]
    pending = [job("heavy-1", user="heavy", submit=0.0), job("light-1", user="light", submit=5.0)]
    s = Snapshot(
        now=10.0,
        nodes=nodes,
        pending=pending,
        usage={"heavy": 1e6, "light": 10.0},
        config=SchedulerConfig(queue_policy="priority"),
    )
    d = schedule(s)
    assert [st.job_id for st in d.starts] == ["light-1"]
    assert d.factors["light-1"]["fairshare"] > d.factors["heavy-1"]["fairshare"]
    assert d.reasons == {"heavy-1": "waiting for 1 GPU"}


def test_older_jobs_win_among_equals_and_age_saturates() -> None:
    w = PriorityWeights(max_age=100.0)
    pending = [job("young", submit=90.0), job("old", submit=10.0), job("ancient", submit=-500.0)]
    prios, factors = compute_priorities(snap(pending, now=100.0, weights=w))
    assert prios[1] > prios[0]
    assert factors[2]["age"] == factors[1]["age"] * (100 / 90) == pytest.approx(w.age)
