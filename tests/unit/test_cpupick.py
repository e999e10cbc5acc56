"""Which CPUs a node offers and which a job gets (mgpu.master.state.cpus)."""

from __future__ import annotations

from mgpu.master.state.cpus import held_back, offered_cpus, pick_cpus
from mgpu.protocol import CpuDesc


def _xeon() -> list[CpuDesc]:
    """Two NUMA nodes of four cores x two threads (siblings i and i+8)."""
    return [CpuDesc(id=i, core=i % 8, numa=(i % 8) // 4) for i in range(16)]


def test_whole_cores_near_the_jobs_gpus_are_picked() -> None:
    assert pick_cpus(_xeon(), (), 4, near={1}) == [4, 5, 12, 13]
    assert pick_cpus(_xeon(), (), 4, near={0}) == [0, 1, 8, 9]
    assert pick_cpus(_xeon(), (), 2) == [0, 8]  # no topology said: whole cores, lowest


def test_a_core_shared_with_another_job_is_taken_last() -> None:
    # CPU 4 is held: core 4 has one free CPU (12); the job asks two.
    assert pick_cpus(_xeon(), {4}, 2, near={1}) == [5, 13]
    # One CPU: the free half of the broken core fits it exactly, before a whole core.
    assert pick_cpus(_xeon(), {4}, 1, near={1}) == [12]


def test_far_cpus_are_used_when_the_near_ones_are_taken() -> None:
    near_taken = {c.id for c in _xeon() if c.numa == 1}
    assert pick_cpus(_xeon(), near_taken, 2, near={1}) == [0, 8]


def test_too_few_free_cpus_is_none() -> None:
    assert pick_cpus(_xeon(), set(range(15)), 2) is None
    assert pick_cpus(_xeon(), set(range(15)), 1) == [15]
    assert pick_cpus(_xeon(), (), 0) == []


def test_the_reserve_is_the_highest_cores_whole() -> None:
    assert held_back(_xeon(), 2) == {7, 15}  # core 7: CPUs 7 and 15
    assert held_back(_xeon(), 3) == {7, 15, 14}  # then the highest of core 6
    assert [c.id for c in offered_cpus(_xeon(), 2)] == [*range(7), *range(8, 15)]
    assert offered_cpus(_xeon(), 0) == _xeon()
