"""What a node offers besides GPUs, read from recorded sysfs trees (mgpu.agent.hostres)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mgpu.agent.gpus import GpuInfo
from mgpu.agent.hostres import (
    HostCpu,
    detect_cpus,
    detect_host,
    fake_cpus,
    gpu_numa_nodes,
    parse_cpulist,
    pci_sysfs_name,
    read_mem_total_mb,
)

SYSFS = Path(__file__).resolve().parents[1] / "data" / "sysfs"
XEON = SYSFS / "xeon-2s-ht"


def test_cpu_lists_read_as_the_kernel_writes_them() -> None:
    assert parse_cpulist("0-3,8-11\n") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist("\n") == []
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpulist("3-1")


def test_a_two_socket_node_with_hyperthreads() -> None:
    cpus = detect_cpus(XEON, allowed=range(64))
    assert [c.id for c in cpus] == list(range(15))  # CPU 15 is offline
    by_id = {c.id: c for c in cpus}
    assert by_id[0] == HostCpu(id=0, core=0, numa=0)
    assert by_id[8] == HostCpu(id=8, core=0, numa=0)  # 0's sibling: the same core
    assert by_id[12] == HostCpu(id=12, core=4, numa=1)
    assert by_id[14].core == 6 and by_id[14].numa == 1


def test_only_the_cpus_the_agent_may_use_are_offered() -> None:
    """Its affinity (which its cgroup's cpuset bounds) limits what is offered."""
    cpus = detect_cpus(XEON, allowed={2, 3, 10, 15})
    assert [(c.id, c.core) for c in cpus] == [(2, 2), (3, 3), (10, 2)]


def test_a_recorded_vm_without_hyperthreads() -> None:
    cpus = detect_cpus(SYSFS / "vm-2cpu", allowed={0, 1})
    assert cpus == [HostCpu(0, 0, 0), HostCpu(1, 1, 0)]


def test_a_machine_without_numa_nodes_in_sysfs(tmp_path: Path) -> None:
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-1\n")
    assert detect_cpus(tmp_path, allowed={0, 1}) == [HostCpu(0, 0, None), HostCpu(1, 1, None)]


def test_gpus_are_placed_on_their_pci_devices_numa_node() -> None:
    assert pci_sysfs_name("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_sysfs_name("GPU-1234") is None
    bus = {0: "00000000:3B:00.0", 1: "00000000:D8:00.0", 2: "00000000:5E:00.0", 3: "x"}
    assert gpu_numa_nodes(bus, XEON) == {0: 0, 1: 1}  # -1 and unknown: not said
    assert gpu_numa_nodes({0: "00000000:00:04.0"}, SYSFS / "vm-2cpu") == {}


def test_memory_is_memtotal(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16370684 kB\nMemFree:         1000 kB\n")
    assert read_mem_total_mb(meminfo) == 15986
    assert read_mem_total_mb(tmp_path / "absent") == 0


def test_fake_cpus_and_memory_replace_the_machines() -> None:
    gpus = [GpuInfo(index=i, name="Fake", memory_mb=1) for i in range(2)]
    host = detect_host(gpus, "fake", fake_cpu_count=4, fake_mem_mb=8192)
    assert host.cpus == fake_cpus(4) == [HostCpu(i, i, 0) for i in range(4)]
    assert (host.mem_mb, host.gpu_numa) == (8192, {0: 0, 1: 0})
    with pytest.raises(ValueError, match="--fake-cpus"):
        fake_cpus(0)


MGPU = Path(sys.executable).with_name("mgpu")


def test_mgpu_node_takes_fake_cpus_and_memory() -> None:
    if not MGPU.exists():
        pytest.skip("no mgpu console script next to this Python")
    argv = [str(MGPU), "node", "--node-id", "n1", "--fake-gpus", "2", "--print-systemd-unit"]
    res = subprocess.run([*argv, "--fake-cpus", "4", "--fake-mem", "8G"], **_RUN)
    assert res.returncode == 0, res.stderr
    assert "--fake-gpus 2 --fake-cpus 4 --fake-mem 8G" in res.stdout
    for bad, said in (
        (["--fake-mem", "lots"], "--fake-mem: 'lots' is not a memory size"),
        (["--fake-mem", "0"], "--fake-mem must be more than 0"),
        (["--fake-cpus", "0"], "--fake-cpus must be from 1 to 4096"),
    ):
        res = subprocess.run([*argv, *bad], **_RUN)
        assert res.returncode != 0 and said in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


_RUN: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60}
