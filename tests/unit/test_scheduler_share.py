"""Fractional GPUs (`--gpu-share F`): packing, policies, accounting, backfill, preemption."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from factories import HOUR, job, node, running
from mgpu.scheduler import (
    SHARE_UNITS,
    Decisions,
    FreePool,
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    UsageLedger,
    could_ever_fit,
    format_share,
    place,
    schedule,
    share_units,
)
from mgpu.scheduler.placement import wait_reason

NOW = 10_000.0


def run(
    nodes: list[NodeView],
    pending: list[JobRequest],
    running: Iterable[RunningJob] = (),
    **config: object,
) -> Decisions:
    config.setdefault("preemption", False)
    return schedule(
        Snapshot(NOW, nodes, pending, tuple(running), config=SchedulerConfig(**config))  # type: ignore[arg-type]
    )


def where(d: Decisions) -> dict[str, tuple[str, tuple[int, ...], int]]:
    return {s.job_id: (p.node_id, p.gpu_ids, p.share) for s in d.starts for p in s.placements}


# --------------------------------------------------------------------------- share units


@pytest.mark.parametrize(
    ("fraction", "units", "text"),
    [(0.1, 100, "0.1"), (0.25, 250, "0.25"), (0.5, 500, "0.5"), (0.333, 333, "0.333")],
)
def test_share_units_are_exact_thousandths(fraction: float, units: int, text: str) -> None:
    assert share_units(fraction) == units
    assert format_share(units) == text


@pytest.mark.parametrize(
    ("fraction", "message"),
    [
        (1.5, "--gpu-share must be between 0 and 1 (a fraction of one GPU), got 1.5"),
        (0.0, "--gpu-share must be between 0 and 1 (a fraction of one GPU), got 0"),
        (1.0, "--gpu-share must be between 0 and 1 (a fraction of one GPU), got 1"),
        (0.0001, "finer than the smallest share"),
        (float("nan"), "--gpu-share must be a number between 0 and 1"),
    ],
)
def test_share_units_refuse_what_is_not_a_fraction(fraction: float, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        share_units(fraction)


# --------------------------------------------------------------------------- placement


def test_fill_first_packs_onto_the_shared_gpu_with_the_least_room_that_fits() -> None:
    nodes = [
        node("n1", free=(1, 2, 3), shared={0: 500}),  # room 500
        node("n2", free=(0, 2, 3), shared={1: 750}),  # room 250
    ]
    pool = FreePool(nodes)
    assert place(job("a", gpu_share=250), pool, "fill_first") == (Placement("n2", (1,), 250),)
    assert place(job("b", gpu_share=300), pool, "fill_first") == (Placement("n1", (0,), 300),)
    assert place(job("c", gpu_share=500), pool, "fill_first") == (Placement("n1", (0,), 500),)
    # No shared GPU has room for 0.6: a free GPU, on the busiest node, lowest index.
    nodes.append(node("n3", free=(3,)))
    assert place(job("d", gpu_share=600), FreePool(nodes), "fill_first") == (
        Placement("n3", (3,), 600),
    )


def test_fill_first_breaks_equal_room_ties_by_the_busiest_node() -> None:
    nodes = [node("n1", free=(1, 2, 3), shared={0: 500}), node("n2", free=(2,), shared={0: 500})]
    assert place(job("a", gpu_share=500), FreePool(nodes), "fill_first") == (
        Placement("n2", (0,), 500),
    )


def test_spread_takes_a_free_gpu_first_then_the_least_used_shared_one() -> None:
    nodes = [node("n1", free=(3,), shared={0: 500}), node("n2", free=(1, 2, 3), shared={0: 250})]
    pool = FreePool(nodes)
    assert place(job("a", gpu_share=250), pool, "spread") == (Placement("n2", (1,), 250),)
    full = [node("n1", free=(), shared={0: 500, 1: 250}), node("n2", free=(), shared={2: 600})]
    assert place(job("b", gpu_share=250), FreePool(full), "spread") == (Placement("n1", (1,), 250),)
    assert place(job("c", gpu_share=800), FreePool(full), "spread") is None


def test_ten_tenths_fill_a_gpu_exactly_and_the_eleventh_takes_another() -> None:
    pending = [job(f"s{i}", gpu_share=share_units(0.1), submit=float(i)) for i in range(11)]
    d = run([node("n1", gpus=2)], pending)
    gpus = [where(d)[f"s{i}"][1] for i in range(11)]
    assert gpus == [(0,)] * 10 + [(1,)]


def test_a_shared_gpu_is_never_given_to_a_whole_job_nor_a_whole_gpu_to_a_share() -> None:
    nodes = [node("n1", free=(1,), shared={0: 250}, gpus=3)]  # GPU 2 is held whole
    busy = [RunningJob("w", "bob", (Placement("n1", (2,)),), NOW, HOUR)]
    d = run(nodes, [job("two", gpus=2), job("one", gpus=1, submit=1.0, priority=100)], busy)
    assert where(d) == {"one": ("n1", (1,), 0)}
    assert d.reasons["two"] == "waiting for 2 GPUs"
    # The share goes beside the other share, never onto GPU 2 (whole) or GPU 1 (now taken).
    d = run(nodes, [job("one", gpus=1), job("s", gpu_share=750, submit=1.0)], busy)
    assert where(d) == {"one": ("n1", (1,), 0), "s": ("n1", (0,), 750)}
    d = run(nodes, [job("one", gpus=1), job("big", gpu_share=800, submit=1.0)], busy)
    assert d.reasons["big"] == "waiting for 0.8 of one GPU"


def test_the_pool_frees_a_shared_gpu_only_when_its_last_share_goes() -> None:
    pool = FreePool([node("n1", free=(0, 1), gpus=2)])
    pool.take([Placement("n1", (0,), 300), Placement("n1", (0,), 300)])
    assert (pool.total_free, dict(pool.shared("n1"))) == (1, {0: 600})
    pool.release("n1", (0,), 300)
    assert (pool.total_free, dict(pool.shared("n1"))) == (1, {0: 300})
    pool.release("n1", (0,), 300)
    assert (pool.total_free, dict(pool.shared("n1"))) == (2, {})
    assert place(job("w", gpus=2), pool, "fill_first") == (Placement("n1", (0, 1)),)


def test_withhold_and_restore_put_free_and_shared_gpus_back_exactly() -> None:
    pool = FreePool([node("n1", free=(1, 2), shared={0: 400}, gpus=3)])
    taken = pool.withhold([Placement("n1", (0, 1))])
    assert (pool.total_free, dict(pool.shared("n1"))) == (1, {})
    assert place(job("s", gpu_share=100), pool, "fill_first") == (Placement("n1", (2,), 100),)
    pool.restore(taken)
    assert (pool.total_free, dict(pool.shared("n1"))) == (2, {0: 400})
    assert place(job("s", gpu_share=100), pool, "fill_first") == (Placement("n1", (0,), 100),)


def test_a_blocked_gpu_stays_blocked_through_a_release_in_that_copy_only() -> None:
    pool = FreePool([node("n1", free=(1,), shared={0: 500}, gpus=3)])
    other = pool.copy()
    pool.block([Placement("n1", (0, 1))])
    pool.release("n1", (0,), 500)
    pool.release("n1", (1, 2))
    assert pool.total_free == 1 and pool.usable("n1") == {2}
    assert place(job("w", gpus=2), pool, "fill_first") is None
    other.release("n1", (0,), 500)
    assert other.total_free == 2 and other.usable("n1") == {0, 1, 2}


def test_could_ever_fit_and_wait_reason_for_shares() -> None:
    nodes = [node("n1")]
    assert could_ever_fit(job("s", gpu_share=250), nodes) is None
    assert could_ever_fit(job("s", gpu_share=250, nodes=2, gpus_per_node=1), nodes) == (
        "--gpu-share asks for part of one GPU; it cannot be combined with --nodes, "
        "--gpu-ids, --node-gpu-ids or --distributed"
    )
    assert could_ever_fit(job("s", gpu_share=250, gpus=2), nodes) == (
        "--gpu-share asks for part of one GPU; it cannot be combined with --gpus"
    )
    assert could_ever_fit(job("s", gpu_share=SHARE_UNITS), nodes) == (
        "--gpu-share must be between 0 and 1 (a fraction of one GPU)"
    )
    assert wait_reason(job("s", gpu_share=250), FreePool(nodes)) == (
        "waiting for 0.25 of one GPU",
        True,
    )
    a100 = [NodeView("n1", (0, 1), frozenset(), gpu_type="a100")]
    typed = job("s", gpu_share=250, gpu_type="a100")
    assert wait_reason(typed, FreePool(a100)) == ("waiting for 0.25 of one a100 GPU", True)


# --------------------------------------------------------------------------- accounting


def test_job_size_factor_counts_the_share() -> None:
    nodes = [node("n1", free=())]
    d = run(nodes, [job("w", gpus=1), job("s", gpu_share=500)])
    assert d.factors["s"]["job_size"] == pytest.approx(d.factors["w"]["job_size"] / 2)


def test_running_job_counts_its_share_as_gpu_amount() -> None:
    r = running("r", "n1", (0,), now=NOW, share=250, ends_in=HOUR)
    assert (r.gpus, r.gpu_units, r.gpu_amount) == (1, 250, 0.25)


def test_usage_charges_the_share_times_the_time_and_returns_to_exactly_zero() -> None:
    ledger = UsageLedger(half_life=1e12)  # no decay to speak of
    for _ in range(10):
        ledger.start("a", 0.1, 0.0)
    assert ledger.snapshot(100.0)["a"] == pytest.approx(100.0)  # 10 x 0.1 GPU x 100 s
    for _ in range(10):
        ledger.stop("a", 0.1, 0.0, 100.0)
    assert ledger._units["a"] == 0 and ledger._started["a"] == 0.0
    assert ledger.snapshot(500.0)["a"] == pytest.approx(100.0)  # nothing running any more
    ledger.start("b", 0.25, 0.0)
    usage = ledger.snapshot(
        NOW, [running("r", "n1", (0,), now=NOW, share=500, ends_in=HOUR)]
    )  # started an hour ago
    assert usage["b"] == pytest.approx(0.25 * NOW)
    assert usage["bob"] == pytest.approx(0.5 * HOUR)


def test_per_user_gpu_limit_counts_shares() -> None:
    pending = [job(f"s{i}", gpu_share=500, submit=float(i)) for i in range(3)]
    d = run([node("n1")], pending, max_gpus_per_user=1)
    assert set(where(d)) == {"s0", "s1"}
    assert d.reasons["s2"] == "user alice is at the limit of 1 GPUs in use"
    d = run(
        [node("n1")], [job("w", gpus=1), job("s", gpu_share=500, submit=1.0)], max_gpus_per_user=1
    )
    assert d.reasons["s"] == "user alice is at the limit of 1 GPUs in use"
    busy = [RunningJob("r", "alice", (Placement("n1", (0,), 500),), NOW, HOUR)]
    d = run([node("n1", free=(1, 2, 3), shared={0: 500})], [job("w", gpus=1)], busy,
            max_gpus_per_user=1)  # fmt: skip
    assert d.reasons["w"] == "user alice has 0.5 of at most 1 GPUs in use and the job needs 1"


# --------------------------------------------------------------------------- backfill


def test_a_whole_head_waits_until_every_share_of_its_gpu_is_gone() -> None:
    nodes = [node("n1", free=(), shared={0: 1000}, gpus=1)]
    busy = [
        running("a", "n1", (0,), now=NOW, share=500, ends_in=HOUR),
        running("b", "n1", (0,), now=NOW, share=500, ends_in=2 * HOUR),
    ]
    d = run(nodes, [job("head", gpus=1)], busy)
    assert d.expected_start["head"] == NOW + 2 * HOUR
    assert d.waiting_on["head"] == ("a", "b")


def test_a_share_head_waits_for_room_and_keeps_its_gpu_from_long_backfill() -> None:
    nodes = [node("n1", free=(), shared={0: 750}, gpus=1)]
    busy = [running("big", "n1", (0,), now=NOW, share=750, ends_in=HOUR)]
    pending = [
        job("head", gpu_share=500, priority=100),
        job("long", gpu_share=250, submit=1.0, time_limit=2 * HOUR),
        job("short", gpu_share=250, submit=2.0, time_limit=HOUR / 2),
    ]
    d = run(nodes, pending, busy, queue_policy="backfill")
    assert d.expected_start["head"] == NOW + HOUR
    # The head's GPU is kept whole from backfill: only a share that ends before it starts.
    assert where(d) == {"short": ("n1", (0,), 250)}
    assert d.reasons["long"] == "priority"


# --------------------------------------------------------------------------- preemption


def test_a_whole_job_preempts_every_share_of_a_gpu() -> None:
    nodes = [node("n1", free=(), shared={0: 1000}, gpus=1)]
    busy = [
        running("a", "n1", (0,), now=NOW, share=500, ends_in=HOUR, preemptible=True),
        running("b", "n1", (0,), now=NOW, share=500, ends_in=HOUR, preemptible=True),
    ]
    d = run(nodes, [job("urgent", gpus=1, priority=1000)], busy, preemption=True)
    assert sorted(d.preempt) == ["a", "b"]
    assert d.expected_start["urgent"] == NOW
    assert set(d.waiting_on["urgent"]) == {"a", "b"}


def test_no_preemption_when_a_share_of_the_gpu_may_not_be_preempted() -> None:
    nodes = [node("n1", free=(), shared={0: 1000}, gpus=1)]
    busy = [
        running("a", "n1", (0,), now=NOW, share=500, ends_in=HOUR, preemptible=True),
        running("b", "n1", (0,), now=NOW, share=500, ends_in=HOUR),
    ]
    d = run(nodes, [job("urgent", gpus=1, priority=1000)], busy, preemption=True)
    assert d.preempt == []


def test_a_share_preempts_only_as_much_as_it_needs() -> None:
    nodes = [node("n1", free=(), shared={0: 1000}, gpus=1)]
    busy = [
        running("a", "n1", (0,), now=NOW, share=500, ends_in=HOUR, preemptible=True),
        running("b", "n1", (0,), now=NOW, share=500, ends_in=HOUR, preemptible=True),
    ]
    d = run(nodes, [job("urgent", gpu_share=400, priority=1000)], busy, preemption=True)
    assert len(d.preempt) == 1
