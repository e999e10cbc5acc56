"""The trace simulator: readers, the replay against hand-worked schedules, metrics, CLI."""

from __future__ import annotations

import argparse
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu.client.api import MgpuError
from mgpu.client.cmd_simulate import add_simulate_parser, cmd_simulate
from mgpu.scheduler import Placement, RunningJob, UsageLedger
from mgpu.sim import (
    ClusterShape,
    SimConfig,
    TraceError,
    TraceJob,
    compress,
    compute_metrics,
    read_trace,
    resample,
    simulate,
)
from mgpu.sim.report import percentile

DATA = Path(__file__).resolve().parent.parent / "data" / "traces"
NASA = DATA / "NASA-iPSC-1993-3.1-cln.swf.gz"
TINY_CSV = DATA / "tiny.csv"
TINY_SWF = DATA / "tiny.swf"


def job(job_id: str, submit: float, run: float, gpus: int, limit: float | None = None) -> TraceJob:
    return TraceJob(job_id, submit, run, gpus, f"user{job_id}", limit)


def waits(jobs: list[TraceJob], policy: str, nodes: int = 1, per_node: int = 4) -> dict[str, float]:
    result = simulate(jobs, SimConfig(ClusterShape(nodes, per_node), policy))  # type: ignore[arg-type]
    return {j.job_id: j.start - j.submit for j in result.jobs}


# --------------------------------------------------------------------------- readers


def test_swf_reader_skips_comments_and_bad_records() -> None:
    trace = read_trace(TINY_SWF)
    assert trace.format == "swf"
    assert trace.max_procs == 8
    assert trace.skipped == {"negative run time": 1, "no processors": 1}
    # Sorted by submit time: job 5 (submitted at 5) comes second.
    assert [j.job_id for j in trace.jobs] == ["1", "5", "2"]
    first, fifth, second = trace.jobs
    assert (first.submit, first.run, first.gpus, first.user, first.time_limit) == (
        0.0,
        100.0,
        2,
        "u3",
        120.0,
    )
    assert second.gpus == 4  # allocated -1: the requested processors count
    assert second.time_limit is None  # -1 = unknown
    assert fifth.user == "unknown" and fifth.run == 0.0


def test_swf_reader_reads_gzip_by_content(tmp_path: Path) -> None:
    packed = tmp_path / "trace.log"  # the name says nothing; the magic bytes do
    packed.write_bytes(gzip.compress(TINY_SWF.read_bytes()))
    assert read_trace(packed).jobs == read_trace(TINY_SWF).jobs


def test_swf_short_record_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_text("; header\n1 0 -1 10 1\n")
    with pytest.raises(TraceError, match="line 2: an SWF job has 18 fields, found 5"):
        read_trace(bad)


def test_nasa_trace_reads_in_full() -> None:
    trace = read_trace(NASA)
    assert len(trace.jobs) == 18239
    assert trace.max_procs == 128
    assert max(j.gpus for j in trace.jobs) == 128


def test_csv_reader() -> None:
    trace = read_trace(TINY_CSV)
    assert trace.format == "csv"
    assert [(j.submit, j.run, j.gpus, j.user, j.time_limit) for j in trace.jobs] == [
        (0.0, 100.0, 2, "alice", 100.0),
        (1.0, 100.0, 4, "bob", 100.0),
        (2.0, 50.0, 2, "carol", 50.0),
        (3.0, 200.0, 2, "dave", 200.0),
    ]


def test_csv_optional_columns(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("gpus,submit_time,duration\n1,5,10\n0,6,10\n")
    trace = read_trace(f)
    assert [(j.submit, j.gpus, j.user, j.time_limit) for j in trace.jobs] == [
        (5.0, 1, "user", None)
    ]
    assert trace.skipped == {"no GPUs": 1}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("5,ten,1,bob,", "line 3: duration must be a number of seconds, got 'ten'"),
        ("5,10,1.5,bob,", "line 3: gpus must be a whole number, got '1.5'"),
        ("5,10,1", "line 3: expected 5 fields, found 3"),
        ("5,-1,1,bob,", "line 3: duration must not be negative"),
    ],
)
def test_csv_bad_row_names_its_line(tmp_path: Path, row: str, message: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(f"submit_time,duration,gpus,user,time_limit\n0,10,1,alice,\n{row}\n")
    with pytest.raises(TraceError, match=message):
        read_trace(f)


def test_csv_bad_header(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("submit,duration,gpus\n0,1,1\n")
    with pytest.raises(TraceError, match=r"line 1: the header must name .*missing submit_time"):
        read_trace(f)


def test_missing_file() -> None:
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(DATA / "nope.swf")


# --------------------------------------------------------------------------- the replay


def test_fifo_and_backfill_differ_as_worked_out_by_hand() -> None:
    """1 node x 4 GPUs; time limits equal run times (tiny.csv).

    A(2 GPUs, 0-100) starts at once.  B(4 GPUs) must wait for A: it can start at 100.
    C(2 GPUs, 50 s) fits beside A at t=2 and would end at 52 <= 100, so backfill starts
    it then; FIFO keeps it behind B until B ends at 200.  D(2 GPUs, 200 s) would run past
    B's reservation, so even backfill holds it until B ends at 200.
    """
    jobs = read_trace(TINY_CSV).jobs
    assert waits(jobs, "fifo") == {"1": 0.0, "2": 99.0, "3": 198.0, "4": 197.0}
    assert waits(jobs, "backfill") == {"1": 0.0, "2": 99.0, "3": 0.0, "4": 197.0}
    # Priority favours the bigger B anyway (job-size factor): same as FIFO here.
    assert waits(jobs, "priority") == waits(jobs, "fifo")


def test_unknown_limits_use_the_factor() -> None:
    # C's limit is unknown: with factor 1 it is 50 s (backfills); with factor 3 it is
    # 150 s, which would delay B's reservation at 100, so C waits for B.
    jobs = [job("A", 0, 100, 2, 100), job("B", 1, 100, 4, 100), job("C", 2, 50, 2)]
    shape = ClusterShape(1, 4)
    exact = simulate(jobs, SimConfig(shape, "backfill", time_limit_factor=1.0))
    padded = simulate(jobs, SimConfig(shape, "backfill", time_limit_factor=3.0))
    assert exact.jobs[2].start == 2.0
    assert padded.jobs[2].start == 200.0


def test_job_is_killed_at_its_time_limit() -> None:
    result = simulate([job("A", 0, 100, 1, limit=30)], SimConfig(ClusterShape(1, 1), "fifo"))
    (a,) = result.jobs
    assert (a.end, a.run, a.timed_out) == (30.0, 30.0, True)


def test_wide_jobs_split_over_nodes_and_are_capped() -> None:
    # 12 GPUs on 2 x 8: distributed over both nodes; 40 GPUs capped to 16.
    jobs = [job("A", 0, 10, 12), job("B", 0, 10, 40)]
    result = simulate(jobs, SimConfig(ClusterShape(2, 8), "fifo"))
    assert result.capped == 1
    assert [(j.start, j.end, j.gpus) for j in result.jobs] == [(0, 10, 12), (10, 20, 16)]


def test_duplicate_trace_ids_are_fine() -> None:
    result = simulate([job("A", 0, 10, 1), job("A", 0, 10, 1)], SimConfig(ClusterShape(1, 1)))
    assert [(j.job_id, j.start) for j in result.jobs] == [("A", 0.0), ("A", 10.0)]


def test_metrics_on_a_trivial_trace() -> None:
    """1 node x 2 GPUs: A(1 GPU, 0-100), B(1 GPU, 0-5), C(2 GPUs at 10, 20 s) runs 100-120."""
    jobs = [job("A", 0, 100, 1), job("B", 0, 5, 1), job("C", 10, 20, 2)]
    m = compute_metrics(simulate(jobs, SimConfig(ClusterShape(1, 2), "backfill")))
    assert m.makespan == 120.0
    assert m.busy_gpu_seconds == 100 + 5 + 2 * 20
    assert m.utilisation == pytest.approx(145 / (2 * 120))
    assert m.wait_avg == 30.0 and m.wait_median == 0.0
    assert m.wait_p99 == pytest.approx(0.98 * 90)  # linear between 0 and 90
    assert m.completion_avg == pytest.approx((100 + 5 + 110) / 3)
    # A: 100/100 = 1; B: 5 s counts as 10 s -> max(1, 0.5) = 1; C: (90 + 20) / 20 = 5.5
    assert m.bounded_slowdown_avg == pytest.approx((1 + 1 + 5.5) / 3)
    assert m.finished == 3 and m.never_started == 0 and m.timeouts == 0


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 25) == 2.5
    assert math.isnan(percentile([], 50))


def test_fairshare_usage_decays() -> None:
    """A heavy user's waiting job yields to a light user's under priority, not FIFO."""
    # X (heavy) ran 1000 s on the only GPU; then at 1000 X and Y both wait behind Z.
    jobs = [
        TraceJob("1", 0, 1000, 1, "heavy"),
        TraceJob("2", 999, 10, 1, "other"),  # holds the GPU when the next two arrive
        TraceJob("3", 1001, 10, 1, "heavy"),
        TraceJob("4", 1002, 10, 1, "light"),
    ]
    shape = ClusterShape(1, 1)
    fifo = simulate(jobs, SimConfig(shape, "fifo"))
    prio = simulate(jobs, SimConfig(shape, "priority"))
    assert fifo.jobs[2].start < fifo.jobs[3].start
    assert prio.jobs[3].start < prio.jobs[2].start


def test_preemption_requeues_the_victim(tmp_path: Path) -> None:
    """1 node x 2 GPUs: a preemptible job is stopped for a high-priority one, then reruns."""
    f = tmp_path / "p.csv"
    f.write_text(
        "submit_time,duration,gpus,user,time_limit,priority,preemptible\n"
        "0,100,2,lo,,0,1\n"
        "10,10,2,hi,,1000,0\n"
    )
    result = simulate(read_trace(f).jobs, SimConfig(ClusterShape(1, 2), "backfill"))
    low, high = result.jobs
    assert (high.start, high.end) == (10.0, 20.0)
    assert (low.start, low.end, low.requeues) == (20.0, 120.0, 1)
    assert result.preemptions == 1
    assert result.busy_gpu_seconds == 2 * 10 + 2 * 10 + 2 * 100  # the lost 10 s count


def test_dependencies_are_replayed_as_the_master_applies_them(tmp_path: Path) -> None:
    """Job 1 is killed at its limit: afterok on it is cancelled (and so is afterok on that),
    afternotok and afterany run once it ended, and a chain waits for its link."""
    f = tmp_path / "deps.csv"
    f.write_text(
        "submit_time,duration,gpus,user,time_limit,dependency\n"
        "0,100,1,u,50,\n"  # 1: times out at 50
        "0,10,1,u,,afterok:1\n"  # 2
        "0,10,1,u,,afternotok:1\n"  # 3
        "0,10,1,u,,afterany:1\n"  # 4
        "0,10,1,u,,afterok:2\n"  # 5
        '0,10,1,u,,"afterok:3,afterany:4"\n'  # 6
    )
    trace = read_trace(f)
    assert trace.jobs[5].dependency == (("afterok", "3"), ("afterany", "4"))
    result = simulate(trace.jobs, SimConfig(ClusterShape(1, 4), "backfill"))
    spans = {j.job_id: (j.start, j.end) for j in result.jobs if j.finished}
    assert spans == {"1": (0, 50), "3": (50, 60), "4": (50, 60), "6": (60, 70)}
    assert [j.job_id for j in result.jobs if j.cancelled] == ["2", "5"]


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("afterok:9", "line 3: dependency on job 9, which is not a job of the trace"),
        ("afterok:3", "line 3: dependency on job 3, which asks for no GPUs and is skipped"),
        ("before:1", "line 3: dependency type 'before' is not one of afterok"),
        ("afterok:", "line 3: dependency 'afterok:' names no job"),
    ],
)
def test_csv_bad_dependency(tmp_path: Path, cell: str, message: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(f"submit_time,duration,gpus,dependency\n0,10,1,\n0,10,1,{cell}\n0,1,0,\n")
    with pytest.raises(TraceError, match=message):
        read_trace(f)


def test_usage_ledger_counts_running_work_either_way() -> None:
    """Ended work decays from its end; running work counts undecayed, whether registered as
    it starts and stops (the simulator) or passed to each snapshot (the master)."""
    sim, master = UsageLedger(half_life=100.0), UsageLedger(half_life=100.0)
    a = RunningJob("a", "a", (Placement("n", (0, 1)),), 0.0)
    sim.start("a", 2, 0.0)
    assert sim.snapshot(50.0) == master.snapshot(50.0, [a]) == {"a": 100.0}  # 2 GPUs x 50 s
    sim.stop("a", 2, 0.0, 100.0)
    master.add("a", 200.0, 100.0)
    sim.start("b", 1, 150.0)
    b = RunningJob("b", "b", (Placement("n", (0,)),), 150.0)
    for now in (100.0, 200.0, 250.0):
        assert sim.snapshot(now)["a"] == pytest.approx(master.snapshot(now, [b])["a"])
    assert sim.snapshot(200.0)["a"] == pytest.approx(100.0)  # halved after one half-life
    assert sim.snapshot(200.0)["b"] == pytest.approx(50.0)
    assert master.snapshot(200.0, [b])["b"] == pytest.approx(50.0)
    sim.stop("b", 1, 150.0, 200.0)
    # Far past the rebasing point (k·t > 300): no overflow, and a stop right then is exact.
    sim.start("c", 1, 1e6 - 10)
    sim.stop("c", 1, 1e6 - 10, 1e6)
    far = sim.snapshot(1e6)
    assert far["a"] == pytest.approx(0.0, abs=1e-9) and far["c"] == pytest.approx(10.0)


def test_usage_ledger_is_stored_readably_and_reads_the_older_form() -> None:
    ledger = UsageLedger(half_life=100.0)
    ledger.add("a", 200.0, 1e9)  # far from the start: the base moves to it
    ledger.add("b", 50.0, 1e9 + 100.0)
    stored = json.loads(ledger.dumps())
    # Each user's usage as of the last change, to be halved every half-life after it.
    assert stored["a"] == [pytest.approx(100.0), 1e9 + 100.0]
    assert stored["b"] == [pytest.approx(50.0), 1e9 + 100.0]
    again = UsageLedger.loads(100.0, ledger.dumps())
    assert again.snapshot(1e9 + 200.0) == pytest.approx({"a": 50.0, "b": 25.0})
    # The older form gave each user an as-of time of its own.
    old = UsageLedger.loads(100.0, json.dumps({"a": [200.0, 1e9], "b": [50.0, 1e9 + 100.0]}))
    assert old.snapshot(1e9 + 200.0) == pytest.approx({"a": 50.0, "b": 25.0})
    assert UsageLedger.loads(100.0, None).snapshot(5.0) == {}


def test_load_factor_and_resample_are_deterministic() -> None:
    jobs = [job("A", 100, 1, 1), job("B", 300, 1, 1)]
    assert [j.submit for j in compress(jobs, 2.0)] == [100.0, 200.0]
    trace = read_trace(TINY_SWF)
    one, two = resample(trace, 50, seed=3), resample(trace, 50, seed=3)
    assert one.jobs == two.jobs and len(one.jobs) == 50


def test_nasa_first_2000_jobs_backfill_beats_fifo() -> None:
    # At its logged load (47%) the NASA log barely queues on 128 GPUs (its submit times
    # are really start times), so arrivals are compressed 2x to make the policies matter.
    jobs = compress(read_trace(NASA).jobs[:2000], 2.0)
    shape = ClusterShape(16, 8)
    m = {
        p: compute_metrics(simulate(jobs, SimConfig(shape, p)))
        for p in ("fifo", "priority", "backfill")
    }
    assert all(x.finished == 2000 for x in m.values())
    assert m["backfill"].utilisation >= m["fifo"].utilisation
    assert m["backfill"].wait_avg < m["fifo"].wait_avg
    assert m["backfill"].wait_avg < m["priority"].wait_avg
    # Same work whatever the order.
    assert m["fifo"].busy_gpu_seconds == m["backfill"].busy_gpu_seconds


# --------------------------------------------------------------------------- the command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mgpu")
    add_simulate_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["simulate", *argv])


def test_cmd_simulate_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(str(TINY_CSV), "--nodes", "1", "--gpus-per-node", "4", "--json")
    assert args.fn(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "backfill"
    assert (out["nodes"], out["gpus_per_node"], out["gpus"]) == (1, 4, 4)
    assert out["jobs"] == 4 and out["finished"] == 4
    assert out["wait_avg"] == pytest.approx((0 + 99 + 0 + 197) / 4)
    assert out["makespan"] == 400.0
    for key in ("wait_median", "wait_p99", "completion_avg", "bounded_slowdown_avg"):
        assert isinstance(out[key], float)
    assert out["passes"] >= 1 and out["pass_ms_mean"] > 0
    assert "GPUs as in the CSV" in out["mapping"]


def test_cmd_simulate_text_states_the_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd_simulate(parse(str(NASA), "--limit", "300", "--policy", "fifo")) == 0
    out = capsys.readouterr().out
    assert "1 GPU per SWF processor on 16 nodes x 8 GPUs = 128 GPUs" in out
    assert "jobs:             300 replayed" in out
    assert "GPU utilisation:" in out and "passes" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.csv"], "does not exist"),
        ([str(TINY_CSV), "--nodes", "0"], "--nodes must be at least 1"),
        ([str(TINY_CSV), "--load-factor", "0"], "--load-factor must be a positive number"),
        ([str(TINY_CSV), "--plot", "/no/such/dir/x.png"], "directory /no/such/dir"),
    ],
)
def test_cmd_simulate_errors_are_one_sentence(argv: list[str], message: str) -> None:
    with pytest.raises(MgpuError, match=message):
        cmd_simulate(parse(*argv))


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.png"
    assert cmd_simulate(parse(str(TINY_CSV), "--gpus-per-node", "4", "--plot", str(out))) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {out}" in capsys.readouterr().out


def _mgpu(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mgpu", *argv], capture_output=True, text=True, timeout=60
    )


def test_cli_subprocess() -> None:
    if _mgpu("simulate", "--help").returncode != 0:
        pytest.skip("`mgpu simulate` is not wired into cli.py yet")
    done = _mgpu("simulate", str(TINY_CSV), "--gpus-per-node", "4", "--policy", "fifo", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["wait_avg"] == pytest.approx((0 + 99 + 198 + 197) / 4)
    bad = _mgpu("simulate", str(DATA / "README.md"))
    assert bad.returncode != 0
    assert bad.stderr.startswith("mgpu: error: ") and "Traceback" not in bad.stderr
