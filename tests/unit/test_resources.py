"""CPUs and memory a job asks of a node (mgpu.resources)."""

from __future__ import annotations

import pytest

from mgpu.model import Job
from mgpu.resources import NO_ASK, ResourceAsk, SizeError, parse_size_mb


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("16000", 16000),
        ("500M", 500),
        ("16G", 16384),
        ("1T", 1048576),
        ("512K", 1),
        ("2gb", 2048),
        ("0", 0),
        ("1.5G", 1536),
    ],
)
def test_sizes_read_as_slurm_reads_them(text: str, mb: int) -> None:
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize("text", ["", "G", "lots", "-1G", "nan", "inf"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(SizeError, match="not a memory size"):
        parse_size_mb(text)


def test_an_empty_ask_holds_nothing() -> None:
    assert NO_ASK.empty
    assert NO_ASK.cpus_on(4, 64) == 0
    assert NO_ASK.mem_on(4, 0, 256_000) == 0


def test_per_gpu_and_per_cpu_asks_scale_with_what_the_node_gives() -> None:
    ask = ResourceAsk(cpus_per_node=2, cpus_per_gpu=8, mem_per_cpu_mb=1000)
    cpus = ask.cpus_on(2, 64)
    assert cpus == 18
    assert ask.mem_on(2, cpus, 256_000) == 18_000
    assert ResourceAsk(mem_per_gpu_mb=4096).mem_on(3, 0, 256_000) == 12288


def test_whole_nodes_and_mem_zero_take_the_node() -> None:
    assert ResourceAsk(exclusive=True).cpus_on(1, 64) == 64
    assert ResourceAsk(exclusive=True).mem_on(1, 64, 256_000) == 256_000
    assert ResourceAsk(mem_per_node_mb=0).mem_on(1, 1, 256_000) == 256_000


def test_a_job_keeps_its_ask_through_the_store() -> None:
    job = Job(id="1", user="u", argv=["true"], command="true", ask=ResourceAsk(cpus_per_gpu=4))
    back = Job.from_record(job.to_record())
    assert back.ask == ResourceAsk(cpus_per_gpu=4)
    old = job.to_record()
    del old["ask"]  # a record from before CPUs and memory
    assert Job.from_record(old).ask is NO_ASK
    assert job.to_public()["resources"] == {**NO_ASK.to_record(), "cpus_per_gpu": 4}
