"""Slurm's CPU and memory options as sbatch takes them (Slurm 22.05's units, its sentences
of refusal, its rule for the three memory options and their input variables), and the
one translation of them into what a job asks of each node (`slurm_ask`)."""

from __future__ import annotations

from typing import Any

import pytest

from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.slurm import jobopts, optable, opts
from mgpu.slurm.common import SlurmError
from mgpu.slurm.resources import memory_mb, own_words, slurm_ask, tasks_on_node
from mgpu.slurmoptions import SlurmOptions


def block_of(argv: list[str], script: str = "#!/bin/sh\ntrue\n", env: Any = None) -> Any:
    """What sbatch ARGV sends with SCRIPT: (the slurm block, the warnings)."""
    found = opts.parse("sbatch", argv, jobopts.JOB_OPTIONS)[0]
    values = jobopts.merged("sbatch", script, found, env or {})
    _, block, warnings = jobopts.submit_fields("sbatch", values, {}, "/")
    return block, warnings


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("16000", 16000),  # MiB by default
        ("500M", 500),
        ("16G", 16384),
        ("16g", 16384),
        ("16GB", 16384),
        ("1T", 1024 * 1024),
        ("512K", 1),
        ("1025K", 2),  # K rounded up, as str_to_mbytes
        ("0", 0),  # --mem=0: all of the node's memory
    ],
)
def test_sizes_in_slurms_units(text: str, mb: int) -> None:
    assert memory_mb("sbatch", "mem", text) == mb


@pytest.mark.parametrize("text", ["lots", "1.5G", "16B", "", "-1", "G", "16X", "1e3"])
def test_a_size_slurm_refuses_is_refused_in_its_words(text: str) -> None:
    with pytest.raises(SlurmError) as e:
        memory_mb("sbatch", "mem-per-gpu", text)
    assert str(e.value) == "sbatch: error: Invalid --mem-per-gpu specification"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-c", "4"], {"cpus_per_task": 4}),
        (["--cpus-per-gpu=8"], {"cpus_per_gpu": 8}),
        (["--mem=16G"], {"mem_per_node_mb": 16384}),
        (["--mem=0"], {"mem_per_node_mb": 0}),
        (["--mem-per-cpu=2G"], {"mem_per_cpu_mb": 2048}),
        (["--mem-per-gpu=40G"], {"mem_per_gpu_mb": 40960}),
        (["--exclusive"], {"exclusive": True}),
        (["--exclusive=exclusive"], {"exclusive": True}),
    ],
)
def test_each_option_reaches_the_block_without_a_warning(
    argv: list[str], expected: dict[str, Any]
) -> None:
    block, warnings = block_of(argv)
    assert {k: block.get(k) for k in expected} == expected
    assert warnings == []  # scheduled now: no "not scheduled" warning


def test_the_newer_keys_are_sent_only_when_given() -> None:
    """A master of an older mgpu refuses keys it does not know."""
    block, _ = block_of(["-c", "2", "--mem=1G"])
    assert not {"cpus_per_gpu", "mem_per_gpu_mb", "exclusive"} & block.keys()


@pytest.mark.parametrize(
    ("argv", "script", "env", "message"),
    [
        (
            ["--mem=4G", "--mem-per-cpu=1G"],
            None,
            {},
            "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
        ),
        (  # a #SBATCH line and the command line are both the user's own: Slurm refuses
            ["--mem-per-gpu=2G"],
            "#!/bin/sh\n#SBATCH --mem=4G\ntrue\n",
            {},
            "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
        ),
        (
            [],
            None,
            {"SBATCH_MEM_PER_NODE": "4G", "SBATCH_MEM_PER_CPU": "1G"},
            "SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive.",
        ),
        (
            ["-c", "2", "--cpus-per-gpu=4"],
            None,
            {},
            "--cpus-per-gpu is mutually exclusive with --cpus-per-task",
        ),
        (["-c", "0"], None, {}, 'Invalid numeric value "0" for --cpus-per-task.'),
        (["--cpus-per-gpu=x"], None, {}, 'Invalid numeric value "x" for --cpus-per-gpu.'),
        (["--mem-per-cpu=1.5G"], None, {}, "Invalid --mem-per-cpu specification"),
        (["--exclusive=bogus"], None, {}, "Invalid --exclusive specification"),
        (
            ["--exclusive=user"],
            None,
            {},
            "--exclusive=user is not supported by mgpu (nodes shared only among one user's "
            "jobs); use --exclusive for whole nodes",
        ),
        (
            ["--exclusive=mcs"],
            None,
            {},
            "--exclusive=mcs is not supported by mgpu (nodes shared only among one mcs's "
            "jobs); use --exclusive for whole nodes",
        ),
    ],
)
def test_slurms_refusals(
    argv: list[str], script: str | None, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SlurmError) as e:
        block_of(argv, script or "#!/bin/sh\ntrue\n", env)
    assert str(e.value) == f"sbatch: error: {message}"


def test_one_memory_option_given_by_hand_drops_those_of_the_variables() -> None:
    """Slurm's `_validate_memory_options`: the command line's --mem-per-cpu stands, the
    variable's --mem is reset."""
    block, _ = block_of(["--mem-per-cpu=1G"], env={"SBATCH_MEM_PER_NODE": "4G"})
    assert (block["mem_per_cpu_mb"], block["mem_per_node_mb"]) == (1024, None)
    block, _ = block_of(
        [], "#!/bin/sh\n#SBATCH --mem-per-gpu=3G\ntrue\n", {"SBATCH_MEM_PER_NODE": "4G"}
    )
    assert (block.get("mem_per_gpu_mb"), block["mem_per_node_mb"]) == (3072, None)
    # The same option in a variable and on the command line: the command line's.
    block, _ = block_of(["--mem=2G"], env={"SBATCH_MEM_PER_NODE": "4G"})
    assert block["mem_per_node_mb"] == 2048


def test_exclusive_oversubscribe_is_ignored_with_a_warning() -> None:
    block, warnings = block_of(["--exclusive=oversubscribe"])
    assert "exclusive" not in block
    assert warnings == ["ignored: --exclusive=oversubscribe"]


def test_the_options_are_honoured_in_the_option_table() -> None:
    for name in ("cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu"):
        assert name in optable.names("sbatch", "job")
        assert name in optable.names("srun", "job")
    assert "exclusive" in optable.names("salloc", "job")
    assert not {"mem", "exclusive"} & optable.names("sbatch", "warn")


@pytest.mark.parametrize(
    ("nodes", "ntasks", "per_node", "most"),
    [(1, None, None, 1), (1, 4, None, 4), (2, 5, None, 3), (3, None, 2, 2), (2, 3, 4, 3)],
)
def test_tasks_on_the_busiest_node(
    nodes: int, ntasks: int | None, per_node: int | None, most: int
) -> None:
    assert tasks_on_node(nodes, ntasks, per_node) == most


@pytest.mark.parametrize(
    ("slurm", "nodes", "ask"),
    [
        ({}, 1, NO_ASK),
        ({"ntasks": 8}, 1, NO_ASK),  # tasks alone ask for no CPUs: packs as before
        ({"cpus_per_task": 4}, 1, ResourceAsk(cpus_per_node=4)),
        ({"ntasks": 4, "cpus_per_task": 2}, 1, ResourceAsk(cpus_per_node=8)),
        ({"ntasks": 6, "cpus_per_task": 2}, 2, ResourceAsk(cpus_per_node=6)),
        ({"ntasks_per_node": 2, "cpus_per_task": 3}, 4, ResourceAsk(cpus_per_node=6)),
        ({"cpus_per_gpu": 8}, 1, ResourceAsk(cpus_per_gpu=8)),
        (  # memory per CPU holds a CPU per task (Slurm's default -c 1)
            {"ntasks": 4, "mem_per_cpu_mb": 1024},
            1,
            ResourceAsk(cpus_per_node=4, mem_per_cpu_mb=1024),
        ),
        (
            {"cpus_per_gpu": 4, "mem_per_cpu_mb": 1024},
            1,
            ResourceAsk(cpus_per_gpu=4, mem_per_cpu_mb=1024),
        ),
        ({"mem_per_node_mb": 0}, 1, ResourceAsk(mem_per_node_mb=0)),
        ({"mem_per_gpu_mb": 4096}, 2, ResourceAsk(mem_per_gpu_mb=4096)),
        ({"exclusive": True}, 1, ResourceAsk(exclusive=True)),
    ],
)
def test_slurm_ask(slurm: dict[str, Any], nodes: int, ask: ResourceAsk) -> None:
    assert slurm_ask(SlurmOptions(**slurm), nodes) == ask


def test_mgpus_own_cpus_and_mem_stand_over_slurms_each_kind_alone() -> None:
    slurm = SlurmOptions(cpus_per_gpu=4, mem_per_gpu_mb=2048)
    assert slurm_ask(slurm, 1, own=ResourceAsk(cpus_per_node=3)) == ResourceAsk(
        cpus_per_node=3, mem_per_gpu_mb=2048
    )
    assert slurm_ask(slurm, 1, own=ResourceAsk(mem_per_node_mb=512)) == ResourceAsk(
        cpus_per_gpu=4, mem_per_node_mb=512
    )


@pytest.mark.parametrize(
    ("block", "gpus", "nodes", "words"),
    [
        ({}, 1, 1, []),
        ({"cpus_per_task": 2, "ntasks": 3}, 1, 1, ["--cpus", "6"]),
        ({"cpus_per_gpu": 4, "mem_per_gpu_mb": 1024}, 2, 1, ["--cpus", "8", "--mem", "2048M"]),
        ({"mem_per_cpu_mb": 100, "ntasks": 2}, 0, 1, ["--cpus", "2", "--mem", "200M"]),
        ({"mem_per_node_mb": 0}, 1, 1, ["--mem", "0M"]),
        ({"exclusive": True}, 1, 1, ["--exclusive"]),
    ],
)
def test_srun_outside_a_job_asks_mgpu_srun_for_the_same(
    block: dict[str, Any], gpus: int, nodes: int, words: list[str]
) -> None:
    assert own_words(block, gpus, nodes) == words
