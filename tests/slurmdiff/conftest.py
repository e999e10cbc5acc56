"""The differential tier's clusters: one real Slurm and one mgpu, each started once per
session, the same shape (node001, node002, 4 GPUs each)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realslurm import CPUS, MEMORY_MB, RealSlurm, real_slurm, unavailable
from runner import System, environment_for, mgpu_system, slurm_system

from helpers import LocalCluster

NODES = ("node001", "node002")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSlurm]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real Slurm: {reason}")
    try:
        cluster = real_slurm(tmp_path_factory.mktemp("slurm"))
        started = cluster.__enter__()
    except (RuntimeError, AssertionError, OSError) as e:
        pytest.skip(f"Slurm cannot start here: {e}")
    try:
        yield started
    finally:
        cluster.__exit__(None, None, None)


@pytest.fixture(scope="session")
def mgpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """node001 and node002 as Slurm's: 4 GPUs, CPUS CPUs and MEMORY_MB of memory each."""
    cluster = LocalCluster(tmp_path_factory.mktemp("mgpu"))
    try:
        cluster.start_master()
        shape = ["--fake-cpus", str(CPUS), "--fake-mem", f"{MEMORY_MB}M"]
        for name in NODES:
            cluster.start_agent(name, gpus=4, wait=False, extra=shape)
        for name in NODES:
            cluster.wait_node(name, "online")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def systems(
    slurm: RealSlurm, mgpu: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[System, System]:
    """Slurm's commands and mgpu's, each from a directory of its own."""
    return (
        slurm_system(environment_for(slurm.env), tmp_path_factory.mktemp("on-slurm")),
        mgpu_system(environment_for(mgpu.env), tmp_path_factory.mktemp("on-mgpu")),
    )
