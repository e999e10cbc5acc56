"""The simulator with shares, reservations and estimates; the sharing experiment."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mgpu.scheduler import Placement, Reservation
from mgpu.sim import ClusterShape, SimConfig, TraceError, TraceJob, read_trace, simulate
from mgpu.sim.experiments import (
    format_sharing,
    round_up_shares,
    sharing_experiment,
    small_jobs_trace,
)
from mgpu.sim.report import compute_metrics, estimate_metrics, format_estimates

ONE_GPU = ClusterShape(1, 1)


def tj(job_id: str, submit: float, run: float, gpus: int = 1, **kw: object) -> TraceJob:
    return TraceJob(job_id, submit, run, gpus, "u", float(run), **kw)  # type: ignore[arg-type]


def starts(jobs: list[TraceJob], config: SimConfig) -> dict[str, float]:
    return {j.job_id: j.start for j in simulate(jobs, config).jobs}


# --------------------------------------------------------------------------- CSV


def test_csv_gpus_below_one_is_a_share_and_reservation_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "submit_time,duration,gpus,user,time_limit,reservation\n"
        "0,100,0.25,a,,\n"
        "5,100,2,b,,course-a\n"
    )
    first, second = read_trace(path).jobs
    assert (first.gpus, first.gpu_share, first.gpu_amount, first.reservation) == (
        1,
        250,
        0.25,
        None,
    )
    assert (second.gpus, second.gpu_share, second.reservation) == (2, 0, "course-a")


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("1.5", r"gpus must be a whole number, got '1.5' \(or a share of one GPU below 1"),
        ("0.0001", "a share of a GPU must be 0.001 to 0.999, got '0.0001'"),
        ("-1", "gpus must not be negative, got '-1'"),
        ("x", "gpus must be a number, got 'x'"),
    ],
)
def test_csv_bad_gpus_names_the_line(tmp_path: Path, cell: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"submit_time,duration,gpus\n0,10,1\n0,10,{cell}\n")
    with pytest.raises(TraceError, match=f"line 3: {message}"):
        read_trace(path)


# --------------------------------------------------------------------------- shares


def test_shares_pack_on_one_gpu_and_rounding_up_serialises_them() -> None:
    jobs = [tj(f"s{i}", 0.0, 100.0, gpu_share=250) for i in range(4)]
    config = SimConfig(ONE_GPU, "backfill")
    assert starts(jobs, config) == {"s0": 0.0, "s1": 0.0, "s2": 0.0, "s3": 0.0}
    assert sorted(starts(round_up_shares(jobs), config).values()) == [0.0, 100.0, 200.0, 300.0]
    result = simulate(jobs, config)
    m = compute_metrics(result)
    assert m.utilisation == pytest.approx(1.0)  # 4 x 0.25 for the whole makespan
    assert result.busy[0] == pytest.approx(1.0)


def test_a_whole_job_waits_for_every_share_and_usage_charges_f() -> None:
    jobs = [
        tj("a", 0.0, 100.0, gpu_share=500),
        tj("b", 0.0, 300.0, gpu_share=500),
        tj("w", 10.0, 50.0),
    ]
    result = simulate(jobs, SimConfig(ONE_GPU, "backfill"))
    by_id = {j.job_id: j for j in result.jobs}
    assert by_id["w"].start == 300.0
    assert result.busy_gpu_seconds == pytest.approx(0.5 * 100 + 0.5 * 300 + 50)


# --------------------------------------------------------------------------- reservations


def test_reservations_replay_windows_and_their_jobs() -> None:
    window = Reservation("lab", (Placement("node001", (0,)),), 100.0, 200.0)
    jobs = [
        tj("member", 0.0, 50.0, reservation="lab"),
        tj("long", 0.0, 150.0),  # would still run at 100: after the window
        tj("short", 1.0, 90.0),  # ends by 100: may use the GPU before
    ]
    got = starts(jobs, SimConfig(ONE_GPU, "backfill", reservations=(window,)))
    assert got == {"member": 100.0, "short": 1.0, "long": 200.0}


def test_a_job_of_a_missing_reservation_never_starts() -> None:
    jobs = [tj("lost", 0.0, 10.0, reservation="nope"), tj("other", 0.0, 10.0)]
    result = simulate(jobs, SimConfig(ONE_GPU, "backfill"))
    by_id = {j.job_id: j for j in result.jobs}
    assert math.isnan(by_id["lost"].start) and by_id["other"].start == 0.0


# --------------------------------------------------------------------------- estimates


def test_estimates_at_submit_are_kept_and_compared_with_real_starts() -> None:
    jobs = [tj("a", 0.0, 100.0), tj("b", 10.0, 50.0), tj("c", 20.0, 10.0), tj("d", 30.0, 5.0)]
    result = simulate(jobs, SimConfig(ONE_GPU, "fifo", estimates=True))
    by_id = {j.job_id: j for j in result.jobs}
    assert not by_id["a"].queued and math.isnan(by_id["a"].estimate)
    assert [(by_id[k].estimate, by_id[k].start) for k in "bcd"] == [
        (100.0, 100.0),
        (150.0, 150.0),
        (160.0, 160.0),
    ]
    e = estimate_metrics(result)
    assert (e.queued, e.estimated, e.exact, e.error_median, e.share) == (3, 3, 3, 0.0, 1.0)
    assert format_estimates(e).startswith("3 of 3 waiting jobs (100%) got an estimate at submit")
    # Without estimates nothing is recorded (and the planner does not run).
    plain = simulate(jobs, SimConfig(ONE_GPU, "fifo"))
    assert all(math.isnan(j.estimate) for j in plain.jobs)


def test_an_estimate_misses_when_a_job_ends_before_its_limit() -> None:
    early = TraceJob("a", 0.0, 40.0, 1, "u", 100.0)  # asks for 100 s, runs 40
    result = simulate([early, tj("b", 10.0, 10.0)], SimConfig(ONE_GPU, "backfill", estimates=True))
    by_id = {j.job_id: j for j in result.jobs}
    assert (by_id["b"].estimate, by_id["b"].start) == (100.0, 40.0)
    e = estimate_metrics(result)
    assert (e.error_median, e.signed_median, e.exact) == (60.0, -60.0, 0)


# --------------------------------------------------------------------------- the experiment


def test_small_jobs_trace_is_deterministic_and_near_its_load() -> None:
    jobs = small_jobs_trace(2000, gpus=16, load=0.5, seed=3)
    assert jobs == small_jobs_trace(2000, gpus=16, load=0.5, seed=3)
    assert any(j.gpu_share for j in jobs) and any(j.gpus > 1 for j in jobs)
    used = sum(j.gpu_amount * j.run for j in jobs)
    span = jobs[-1].submit - jobs[0].submit
    assert used / (16 * span) == pytest.approx(0.5, rel=0.1)


def test_packing_shares_waits_less_for_the_same_work() -> None:
    jobs = small_jobs_trace(400, gpus=8, load=0.8, seed=2)
    shared, rounded = sharing_experiment(jobs, SimConfig(ClusterShape(2, 4), "backfill"))
    assert shared.jobs == rounded.jobs == 400
    assert shared.wait_avg < rounded.wait_avg
    assert shared.allocated == pytest.approx(shared.useful)  # a share is charged F
    assert rounded.allocated > rounded.useful  # a rounded-up share holds a whole GPU
    table = format_sharing([shared, rounded])
    assert table.splitlines()[2].startswith("| shares packed | 400 |")
