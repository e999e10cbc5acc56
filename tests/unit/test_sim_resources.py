"""The simulator with CPUs and memory: trace columns, simulated nodes' CPUs and memory, and
`mgpu simulate --cpus-per-node/--mem-per-node`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu.client.api import MgpuError
from mgpu.client.cli import build_parser
from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.sim import ClusterShape, SimConfig, TraceError, TraceJob, read_trace, simulate
from mgpu.sim.asks import NodeSize, trace_ask

G = 1024
NODE = ClusterShape(1, 4, cpus_per_node=8, mem_per_node_mb=64 * G)


def tj(job_id: str, submit: float, run: float, gpus: int = 1, **kw: object) -> TraceJob:
    return TraceJob(job_id, submit, run, gpus, "u", float(run), **kw)  # type: ignore[arg-type]


def starts(jobs: list[TraceJob], config: SimConfig) -> dict[str, float]:
    return {j.job_id: j.start for j in simulate(jobs, config).jobs}


def test_csv_cpus_and_mem_columns_are_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "submit_time,duration,gpus,cpus,mem_mb\n0,10,1,6,16G\n0,10,2,,2048\n0,10,1,4,\n"
    )
    got = [(j.cpus, j.mem_mb) for j in read_trace(path).jobs]
    assert got == [(6, 16 * G), (None, 2048), (4, None)]


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("0,", "line 2: cpus must be at least 1, got '0'"),
        ("2.5,", "line 2: cpus must be a whole number, got '2.5'"),
        (",lots", "line 2: mem_mb must be MiB or a size such as 16G, got 'lots'"),
        (",0", "line 2: mem_mb must be more than 0, got '0'"),
    ],
)
def test_csv_bad_cpus_or_mem_names_the_line(tmp_path: Path, cells: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"submit_time,duration,gpus,cpus,mem_mb\n0,10,1,{cells}\n")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_a_trace_job_asks_per_node_or_per_gpu_and_defaults_per_gpu() -> None:
    node = NodeSize(gpus=4, cpus=8, mem_mb=64 * G)
    assert trace_ask(6, 16 * G, 2, False, node) == (
        ResourceAsk(cpus_per_node=6, mem_per_node_mb=16 * G),
        False,
    )
    # Wider than a node: split, its share per GPU on each node it spans.
    assert trace_ask(20, None, 10, False, node) == (
        ResourceAsk(cpus_per_gpu=2, mem_per_gpu_mb=16 * G),
        False,
    )
    # Nothing said: the node's CPUs and memory per GPU; a share asks nothing.
    assert trace_ask(None, None, 1, False, node) == (
        ResourceAsk(cpus_per_gpu=2, mem_per_gpu_mb=16 * G),
        False,
    )
    assert trace_ask(None, None, 1, True, node) == (NO_ASK, False)
    # More than a node has: cut down to the node, and said so.
    assert trace_ask(12, None, 1, False, node)[0].cpus_per_node == 8
    assert trace_ask(12, None, 1, False, node)[1] is True
    # Nodes that offer nothing: nothing asked.
    assert trace_ask(None, None, 1, False, NodeSize(gpus=4)) == (NO_ASK, False)


def test_two_jobs_whose_gpus_fit_but_cpus_do_not_run_one_after_the_other() -> None:
    jobs = [tj("a", 0, 100, cpus=6), tj("b", 0, 100, cpus=6), tj("c", 0, 50)]
    got = starts(jobs, SimConfig(NODE, "backfill"))
    # c (2 CPUs by default) backfills beside a; b needs a's CPUs back.
    assert got == {"a": 0.0, "b": 100.0, "c": 0.0}
    # The same trace on nodes that do not count CPUs: all at once.
    plain = [tj("a", 0, 100), tj("b", 0, 100), tj("c", 0, 50)]
    assert set(starts(plain, SimConfig(ClusterShape(1, 4), "backfill")).values()) == {0.0}


def test_memory_serialises_jobs_as_cpus_do() -> None:
    jobs = [tj("a", 0, 100, mem_mb=40 * G), tj("b", 0, 100, mem_mb=40 * G)]
    assert starts(jobs, SimConfig(NODE, "fifo")) == {"a": 0.0, "b": 100.0}


def test_jobs_that_say_nothing_pack_onto_gpus_as_before() -> None:
    jobs = [tj(str(i), 0, 100) for i in range(4)]
    assert set(starts(jobs, SimConfig(NODE, "fifo")).values()) == {0.0}


def test_a_trace_asking_cpus_needs_nodes_that_offer_them() -> None:
    with pytest.raises(ValueError, match="asks for 6 CPUs but the simulated nodes offer none"):
        simulate([tj("a", 0, 10, cpus=6)], SimConfig(ClusterShape(1, 4)))


def _simulate(*argv: str) -> None:
    args = build_parser().parse_args(["simulate", *argv])
    args.fn(args)


def test_the_cli_sizes_nodes_cpus_and_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit_time,duration,gpus,cpus,mem_mb\n0,100,1,6,\n0,100,1,6,\n")
    _simulate(str(path), "--nodes", "1", "--gpus-per-node", "4", "--cpus-per-node", "8",
              "--mem-per-node", "64G", "--json")  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["wait_avg"] == 50.0  # the second waits for the first's CPUs
    assert "(8 CPUs and 64G of memory per node)" in out["mapping"]
    with pytest.raises(MgpuError, match="give --cpus-per-node"):
        _simulate(str(path), "--nodes", "1")
    with pytest.raises(MgpuError, match="--mem-per-node: '12X' is not a memory size"):
        _simulate(str(path), "--mem-per-node", "12X")
    with pytest.raises(MgpuError, match="--cpus-per-node must be at least 1"):
        _simulate(str(path), "--cpus-per-node", "0")
