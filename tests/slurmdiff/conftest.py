"""The differential tier's clusters: one real Slurm and one mgpu, each started once per
session, the same shape (node001, node002, 4 GPUs each)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realslurm import RealSlurm, real_slurm, unavailable
from runner import System, environment_for, mgpu_system, slurm_system

from helpers import LocalCluster, local_cluster


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
    with local_cluster(tmp_path_factory.mktemp("mgpu"), agents=2, gpus=4) as c:
        yield c


@pytest.fixture(scope="session")
def systems(
    slurm: RealSlurm, mgpu: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[System, System]:
    """Slurm's commands and mgpu's, each from a directory of its own."""
    return (
        slurm_system(environment_for(slurm.env), tmp_path_factory.mktemp("on-slurm")),
        mgpu_system(environment_for(mgpu.env), tmp_path_factory.mktemp("on-mgpu")),
    )
