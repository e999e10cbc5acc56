"""Slurm's CPU and memory options end to end, on a node started with `--fake-gpus 2
--fake-cpus 4 --fake-mem 8G`: sbatch's -c, --mem, --mem-per-gpu, --mem=0 and --exclusive
reach the job's SLURM_* with what it was granted and squeue, sinfo, sacct and scontrol
show them in Slurm's formats; two jobs whose GPUs fit but CPUs do not run one after the
other; a request no node could hold is refused in Slurm's words, nothing queued."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, wait_for

WAIT = 60.0
"""Seconds for a job to start or end on a loaded machine."""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("slurmcpu"))
    try:
        c.start_master()
        c.start_agent("node001", gpus=2, extra=["--fake-cpus", "4", "--fake-mem", "8G"])
        yield c
    finally:
        c.stop()


def run(c: LocalCluster, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`mgpu COMMAND ...` (the same code as the bin dir's COMMAND)."""
    return subprocess.run(
        [str(BIN / "mgpu"), *argv],
        capture_output=True,
        text=True,
        env=c.env,
        cwd=cwd,
        timeout=120,
    )


def out(c: LocalCluster, *argv: str) -> str:
    res = run(c, *argv)
    assert res.returncode == 0, res.stderr
    return res.stdout


def sbatch(c: LocalCluster, tmp: Path, *argv: str, script: str) -> tuple[str, Path]:
    """Queue SCRIPT (its SLURM_* written to a file) in `tmp`: (the job id, that file)."""
    seen = tmp / "env.txt"
    path = tmp / "job.sh"
    path.write_text(f"#!/bin/sh\n{script}\nenv | grep '^SLURM_' > {seen}\n")
    job_id = out(c, "sbatch", "--parsable", "-D", str(tmp), *argv, str(path)).strip()
    return job_id, seen


def env_of(path: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines())
    return {k: v for k, _, v in pairs}


def state(c: LocalCluster, job_id: str) -> str:
    return str(c.client().show(job_id)["state"])


def ended(c: LocalCluster, job_id: str) -> dict[str, Any]:
    wait_for(lambda: state(c, job_id) not in ("queued", "running"), WAIT, what="the job's end")
    job = c.client().show(job_id)
    assert job["state"] == "completed", job
    return job  # type: ignore[no-any-return]


def test_cpus_and_memory_reach_slurm_variables_and_every_command(
    node: LocalCluster, tmp_path: Path
) -> None:
    c = node
    gate = tmp_path / "gate"
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    job_id, seen = sbatch(
        c, tmp_path, "-n", "1", "-c", "2", "--mem=1G", "--gres=gpu:1", script=wait
    )
    wait_for(lambda: state(c, job_id) == "running", WAIT, what="the job running")
    try:
        assert out(c, "squeue", "-h", "-j", job_id, "-o", "%C|%m") == "2|1G\n"
        assert out(c, "squeue", "-h", "-j", job_id, "-O", "NumCPUs:|,MinMemory").split() == ["2|1G"]
        assert out(c, "sinfo", "-h", "-o", "%c|%m|%e|%C") == "4|8192|7168|2/2/0/4\n"
        assert out(c, "sinfo", "-h", "-O", "CPUs:|,Memory:|,FreeMem:|,CPUsState").split() == [
            "4|8192|7168|2/2/0/4"
        ]
        job_text = out(c, "scontrol", "show", "job", job_id)
        assert "NumCPUs=2 " in job_text and "CPUs/Task=2" in job_text
        assert "MinMemoryNode=1G" in job_text
        assert "TRES=cpu=2,mem=1G,node=1,billing=2,gres/gpu=1" in job_text
        node_text = out(c, "scontrol", "show", "node", "node001")
        assert "CPUAlloc=2 CPUEfctv=4 CPUTot=4" in node_text
        assert "RealMemory=8192 AllocMem=1024 FreeMem=7168" in node_text
    finally:
        gate.touch()
    ended(c, job_id)
    env = env_of(seen)
    assert env["SLURM_CPUS_PER_TASK"] == "2"
    assert env["SLURM_CPUS_ON_NODE"] == "2"
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "2"
    assert env["SLURM_MEM_PER_NODE"] == "1024"
    rows = out(c, "sacct", "-P", "-n", "-X", "-j", job_id, "-o", "AllocCPUS,ReqMem,AllocTRES")
    assert rows == "2|1G|billing=2,cpu=2,gres/gpu=1,mem=1G,node=1\n"


@pytest.mark.parametrize(
    ("argv", "variable", "value", "mem_mb"),
    [
        (["--gres=gpu:2", "--mem-per-gpu=2G"], "SLURM_MEM_PER_GPU", "2048", 4096),
        (["--gres=gpu:1", "--mem=0"], "SLURM_MEM_PER_NODE", "8192", 8192),
        (["--gres=gpu:1", "--exclusive"], "SLURM_CPUS_ON_NODE", "4", 8192),
    ],
)
def test_memory_forms_and_whole_nodes(
    node: LocalCluster,
    tmp_path: Path,
    argv: list[str],
    variable: str,
    value: str,
    mem_mb: int,
) -> None:
    job_id, seen = sbatch(node, tmp_path, *argv, script="true")
    job = ended(node, job_id)
    assert job["mem_mb"] == mem_mb
    assert env_of(seen)[variable] == value


def test_two_jobs_whose_gpus_fit_but_cpus_do_not_run_one_after_the_other(
    node: LocalCluster, tmp_path: Path
) -> None:
    c = node
    gate = tmp_path / "gate"
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _ = sbatch(c, tmp_path / "a", "-c", "3", "--gres=gpu:1", script=wait)
    wait_for(lambda: state(c, first) == "running", WAIT, what="the first job running")
    try:
        second, _ = sbatch(c, tmp_path / "b", "-c", "3", "--gres=gpu:1", script="true")
        wait_for(lambda: c.client().show(second)["reason"], WAIT, what="a pass over the second")
        assert state(c, second) == "queued"  # a GPU is free, one CPU is not three
    finally:
        gate.touch()
    ended(c, first)
    assert ended(c, second)["start_time"] >= c.client().show(first)["end_time"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["-c", "8"],
            [
                "sbatch: error: Batch job submission failed: Requested node configuration is "
                "not available: 8 CPUs asked per node, the most any node offers is 4"
            ],
        ),
        (["--mem=9G"], ["Requested node configuration is not available", "9G of memory"]),
        (
            ["--mem=1G", "--mem-per-cpu=1G"],
            ["sbatch: error: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive."],
        ),
        (["--exclusive=user"], ["sbatch: error: --exclusive=user is not supported by mgpu"]),
    ],
)
def test_what_no_node_could_hold_is_refused_and_nothing_queued(
    node: LocalCluster, tmp_path: Path, argv: list[str], words: list[str]
) -> None:
    c = node
    before = len(c.client().queue(all=True)["jobs"])
    res = run(c, "sbatch", "-D", str(tmp_path), "--gres=gpu:1", *argv, "--wrap", "true")
    assert res.returncode != 0
    for word in words:
        assert word in res.stderr
    assert len(c.client().queue(all=True)["jobs"]) == before


@pytest.mark.parametrize(
    ("command", "words", "held"),
    [
        ("srun", ["-c", "2", "--mem=512M", "--gres=gpu:1", "true"], (2, 512)),  # mgpu srun's
        ("salloc", ["-c", "2", "--mem=512M", "--gres=gpu:1", "true"], (2, 512)),  # the block
        ("srun", ["--exclusive", "--gres=gpu:1", "true"], (4, 8192)),  # the whole node
    ],
)
def test_srun_and_salloc_outside_a_job_hold_what_they_ask(
    node: LocalCluster, tmp_path: Path, command: str, words: list[str], held: tuple[int, int]
) -> None:
    c = node
    before = {j["id"] for j in c.client().queue(all=True)["jobs"]}
    res = subprocess.run(  # Slurm's srun (`mgpu srun` is mgpu's own)
        [sys.executable, "-m", "mgpu.slurm", command, *words],
        capture_output=True,
        text=True,
        env=c.env,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    (job,) = [j for j in c.client().queue(all=True)["jobs"] if j["id"] not in before]
    assert (job["cpus"], job["mem_mb"]) == held
