"""The CPU and memory limits a run's grant becomes (mgpu.agent.runlimits), written into a
temp tree laid out as cgroup v2 and v1 lay out theirs; and a run's memory counters read
back.  (tests/e2e/test_run_limits.py holds a real job to them on this machine's cgroups.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgpu.agent import cgroups, runlimits
from mgpu.agent.runlimits import CPU, CPUSET, MEMORY, Hierarchy, Limits

MB = 1 << 20


def _dir(path: Path, **files: str) -> Path:
    """A cgroup directory with these files (a dot in a name is written `__`).  A file the
    code writes starts empty: unlike the kernel's, a plain file keeps what a shorter write
    leaves of it."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)
    return path


def _read(path: Path, name: str) -> str:
    return (path / name).read_text()


# ---- cgroup v2: the run's own cgroup -----------------------------------------------------


def _v2(tmp_path: Path, swap: bool = True) -> tuple[Limits, Path]:
    base = _dir(tmp_path / "own/mgpu/key", cpuset__cpus__effective="0-7\n")
    run = _dir(
        base / "7.1",
        memory__max="",
        cpuset__cpus="",
        cpu__max="",
        **({"memory__swap__max": "", "memory__oom__group": ""} if swap else {}),
    )
    where = Hierarchy(2, str(base))
    return Limits({CPUSET: where, CPU: where, MEMORY: where}), run


def test_v2_limits_go_in_the_runs_own_cgroup(tmp_path: Path) -> None:
    limits, run = _v2(tmp_path)
    made = runlimits.apply(limits, "7", 1, [2, 3, 5], 100, str(run))
    assert _read(run, "memory.max") == str(100 * MB)
    assert _read(run, "memory.swap.max") == "0"  # swap included: none beyond the limit
    assert _read(run, "memory.oom.group") == "1"  # killed whole
    assert _read(run, "cpuset.cpus") == "2-3,5"
    assert _read(run, "cpu.max") == ""  # a cpuset, no quota
    assert made.join == [] and made.memory == str(run) and made.note() is None


def test_v2_counts_a_runs_memory_without_a_limit(tmp_path: Path) -> None:
    limits, run = _v2(tmp_path)
    made = runlimits.apply(limits, "7", 1, None, None, str(run))
    assert made.memory == str(run) and _read(run, "memory.max") == ""


def test_v2_without_swap_accounting_writes_the_limit_alone(tmp_path: Path) -> None:
    limits, run = _v2(tmp_path, swap=False)
    runlimits.apply(limits, "7", 1, None, 64, str(run))
    assert _read(run, "memory.max") == str(64 * MB)
    assert not (run / "memory.swap.max").exists() and not (run / "memory.oom.group").exists()
    assert _read(run, "cpuset.cpus") == ""  # no CPUs granted: none limited


def test_cpus_this_machine_has_not_become_a_quota_of_as_many(tmp_path: Path) -> None:
    limits, run = _v2(tmp_path)
    runlimits.apply(limits, "7", 1, [8, 9, 10], None, str(run))  # --fake-cpus
    assert _read(run, "cpu.max") == "300000 100000"
    assert _read(run, "cpuset.cpus") == ""


def test_v2_limits_without_a_run_cgroup_refuse_the_launch(tmp_path: Path) -> None:
    limits, _ = _v2(tmp_path)
    with pytest.raises(runlimits.LimitError, match="no cgroup of its own"):
        runlimits.apply(limits, "7", 1, None, 64, None)


def test_v2_enables_the_controllers_from_the_agents_cgroup_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's own cgroup has processes (the kernel refuses it +memory: EBUSY) but was
    delegated memory already; cpuset it cannot get there, so not below either."""
    own = _dir(
        tmp_path / "own",
        cgroup__controllers="cpuset cpu memory",
        cgroup__subtree_control="memory cpu",
    )
    mid = _dir(own / "mgpu", cgroup__controllers="cpu memory", cgroup__subtree_control="")
    base = _dir(mid / "key", cgroup__controllers="", cgroup__subtree_control="")
    writes: list[tuple[str, str]] = []

    def write(path: str, name: str, value: str) -> None:
        writes.append((os.path.relpath(path, tmp_path), value))
        if path == str(own):
            raise OSError(16, "Device or resource busy")
        f = Path(path, name)
        f.write_text(f"{f.read_text()} {value[1:]}".strip())

    monkeypatch.setattr(cgroups, "write", write)
    assert runlimits.enable_v2(str(base), runlimits.CONTROLLERS) == []  # base offers none yet
    assert writes == [("own", "+cpuset"), ("own/mgpu", "+cpu"), ("own/mgpu", "+memory")]
    (base / "cgroup.controllers").write_text("cpu memory")  # what the kernel now shows
    writes.clear()
    assert runlimits.enable_v2(str(base), runlimits.CONTROLLERS) == ["cpu", "memory"]
    assert ("own/mgpu/key", "+memory") in writes


# ---- cgroup v1: a cgroup of the run's own per controller -----------------------------------


def _v1(tmp_path: Path, cpuset: bool = True) -> tuple[Limits, dict[str, Path]]:
    bases = {
        MEMORY: _dir(tmp_path / "memory/mgpu/key"),
        CPU: _dir(tmp_path / "cpu/mgpu/key"),
        CPUSET: _dir(
            tmp_path / "cpuset/mgpu/key", cpuset__effective_cpus="0-3", cpuset__mems="0-1"
        ),
    }
    runs = {
        MEMORY: _dir(
            bases[MEMORY] / "7.1", memory__limit_in_bytes="", memory__memsw__limit_in_bytes=""
        ),
        CPU: _dir(bases[CPU] / "7.1", cpu__cfs_period_us="50000", cpu__cfs_quota_us=""),
        CPUSET: _dir(bases[CPUSET] / "7.1", cpuset__cpus="", cpuset__mems=""),
    }
    where = {c: Hierarchy(1, str(b)) for c, b in bases.items() if cpuset or c != CPUSET}
    return Limits(where), runs


def test_v1_limits_go_in_cgroups_the_shim_joins(tmp_path: Path) -> None:
    limits, runs = _v1(tmp_path)
    made = runlimits.apply(limits, "7", 1, [1, 2], 512, "/v2/run")
    assert _read(runs[MEMORY], "memory.limit_in_bytes") == str(512 * MB)
    assert _read(runs[MEMORY], "memory.memsw.limit_in_bytes") == str(512 * MB)
    assert _read(runs[CPUSET], "cpuset.cpus") == "1-2"
    assert _read(runs[CPUSET], "cpuset.mems") == "0-1"  # the parent's memory nodes
    assert _read(runs[CPU], "cpu.cfs_quota_us") == ""  # a cpuset, no quota
    assert made.join == [str(runs[MEMORY]), str(runs[CPUSET])]
    assert made.memory == str(runs[MEMORY])


def test_v1_without_a_cpuset_takes_a_quota(tmp_path: Path) -> None:
    limits, runs = _v1(tmp_path, cpuset=False)
    made = runlimits.apply(limits, "7", 1, [0, 1], None, "/freezer/run")
    assert _read(runs[CPU], "cpu.cfs_quota_us") == "100000"  # 2 CPUs of a 50 ms period
    # Its memory is counted (not limited) in a v1 cgroup of its own.
    assert made.join == [str(runs[MEMORY]), str(runs[CPU])] and made.memory == str(runs[MEMORY])


def test_a_grant_of_none_limits_nothing_and_counts_its_memory(tmp_path: Path) -> None:
    limits, runs = _v1(tmp_path)
    made = runlimits.apply(limits, "7", 1, None, None, "/freezer/run")
    # v1: a memory cgroup of no limit, joined so that its peak is the run's own.
    assert made.join == [str(runs[MEMORY])] and made.memory == str(runs[MEMORY])
    assert _read(runs[MEMORY], "memory.limit_in_bytes") == ""
    assert _read(runs[MEMORY], "memory.memsw.limit_in_bytes") == ""
    # A node that contains runs by their process tree (no cgroup of the run's): nothing
    # made, so that nothing escaping the tree is caught by a cgroup either.
    made = runlimits.apply(limits, "8", 1, None, None, None)
    assert made.join == [] and made.memory == ""
    assert _read(runs[CPUSET], "cpuset.cpus") == "" and _read(runs[CPU], "cpu.cfs_quota_us") == ""


def test_a_node_without_controllers_runs_the_job_and_says_so(tmp_path: Path) -> None:
    made = runlimits.apply(Limits(), "7", 1, [0, 1], 256, None)
    assert made.join == [] and made.memory == ""
    assert (
        made.note()
        == "this node cannot hold the job to its 256 MB of memory and 2 CPU(s): not limited"
    )


def test_a_refused_write_refuses_the_launch(tmp_path: Path) -> None:
    limits, runs = _v1(tmp_path)
    (runs[MEMORY] / "memory.limit_in_bytes").unlink()  # the kernel refused it
    with pytest.raises(runlimits.LimitError, match="cannot write the job's CPU and memory"):
        runlimits.apply(limits, "7", 1, None, 64, None)


def test_choose_finds_the_v1_hierarchies(tmp_path: Path) -> None:
    _dir(tmp_path / "memory/sub/mgpu/key", memory__limit_in_bytes="", cgroup__procs="")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"35 31 0:32 / {tmp_path}/memory rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {tmp_path}/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    own = tmp_path / "cgroup"
    own.write_text("4:memory:/sub\n3:cpuset:/\n0::/\n")
    containment = cgroups.Containment(cgroups.PROCESS_TREE)
    limits = runlimits.choose("key", containment, str(mountinfo), str(own))
    assert limits.where == {MEMORY: Hierarchy(1, f"{tmp_path}/memory/sub/mgpu/key")}
    assert limits.describe() == "memory v1"


# ---- what a run used ------------------------------------------------------------------------


def test_memory_counters_v2_and_v1(tmp_path: Path) -> None:
    v2 = _dir(
        tmp_path / "v2",
        memory__events="low 0\nhigh 0\nmax 9\noom 1\noom_kill 0\noom_group_kill 1\n",
        memory__peak=str(70 * MB),
        memory__current=str(3 * MB),
    )
    assert runlimits.memory_use(str(v2)) == runlimits.MemoryUse(1, 0, 70 * MB, 3 * MB)
    old = _dir(tmp_path / "old", memory__events="oom 0\noom_kill 0\n", memory__current="5")
    assert runlimits.memory_use(str(old)) == runlimits.MemoryUse(0, 0, None, 5)
    v1 = _dir(
        tmp_path / "v1",
        memory__oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        memory__failcnt="14",
        memory__max_usage_in_bytes=str(64 * MB),
        memory__usage_in_bytes="0",
    )
    assert runlimits.memory_use(str(v1)) == runlimits.MemoryUse(2, 14, 64 * MB, 0)
    older = _dir(tmp_path / "older", memory__oom_control="oom_kill_disable 0\nunder_oom 0\n")
    assert runlimits.memory_use(str(older)).oom_kills is None  # the kernel keeps no count


def test_cpu_lists() -> None:
    assert runlimits.cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert runlimits.cpu_list("") == set()
    assert runlimits.format_cpus([11, 0, 1, 2, 8, 10]) == "0-2,8,10-11"


def test_a_count_that_cannot_be_made_does_not_refuse_the_run(tmp_path: Path) -> None:
    limits, runs = _v1(tmp_path)
    base = Path(limits.where[MEMORY].base)
    (runs[MEMORY] / "memory.limit_in_bytes").unlink()
    (runs[MEMORY] / "memory.memsw.limit_in_bytes").unlink()
    runs[MEMORY].rmdir()
    base.chmod(0o500)  # (root ignores modes: a file where the directory would go instead)
    (base / "7.1").write_text("")
    try:
        made = runlimits.apply(limits, "7", 1, None, None, "/freezer/run")
    finally:
        base.chmod(0o755)
    assert made.join == [] and made.memory == "" and made.note() is None
