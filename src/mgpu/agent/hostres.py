"""What a node offers besides its GPUs: its CPUs (with their cores and NUMA nodes) and memory.

Read once at start-up and sent in the agent's hello; the master holds back what the cluster
config reserves for the system, and picks which CPUs each job gets (master/state/cpupick.py).

* CPUs: those the agent may use (its affinity, which its cgroup's cpuset bounds) that are
  online (``/sys/devices/system/cpu/online``).  Each CPU's core is the lowest id among its
  hyper-thread siblings (``cpuN/topology/thread_siblings_list``, or ``core_cpus_list``), so
  siblings share one core id; its NUMA node is the ``node*/cpulist`` that lists it (None
  where the machine has no NUMA nodes in sysfs).
* GPUs near which cores: a GPU's PCI device (its bus id, from NVML or nvidia-smi) has a
  ``numa_node`` in ``/sys/bus/pci/devices``; ``-1`` (and anything unreadable) is "not said".
* Memory: ``MemTotal`` of ``/proc/meminfo``.

``mgpu node --fake-cpus N --fake-mem SIZE`` replaces the CPUs (ids 0..N-1, each its own
core, all on NUMA node 0) and the memory, for tests and demos.  Every reader takes the
sysfs root, so tests run against recorded trees (tests/data/sysfs).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mgpu.agent import privileged
from mgpu.agent.gpus import NVIDIA_SMI, NVIDIA_SMI_TIMEOUT, GpuInfo

__all__ = [
    "HostCpu",
    "HostResources",
    "detect_cpus",
    "detect_host",
    "fake_cpus",
    "gpu_numa_nodes",
    "parse_cpulist",
    "pci_sysfs_name",
    "read_mem_total_mb",
]

log = logging.getLogger(__name__)

SYS = Path("/sys")
MEMINFO = Path("/proc/meminfo")
MAX_CPUS = 4096
"""CPUs a hello may list (protocol.MAX_CPUS_PER_NODE)."""


@dataclass(frozen=True, slots=True)
class HostCpu:
    id: int
    core: int
    """The lowest CPU id of its core: hyper-thread siblings share it."""
    numa: int | None = None


@dataclass(frozen=True, slots=True)
class HostResources:
    cpus: list[HostCpu]
    mem_mb: int
    """MemTotal (or --fake-mem), MiB; 0: not known."""
    gpu_numa: dict[int, int] = field(default_factory=dict)
    """GPU index -> the NUMA node its PCI device is on (only where the machine says)."""


class CpuListError(ValueError):
    """Text that is not a kernel CPU list."""


_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_cpulist(text: str) -> list[int]:
    """The kernel's list format (``0-3,8-11``, ``5``, empty) as sorted ids."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise CpuListError(f"{text.strip()!r} is not a CPU list")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if high < low or high >= 1 << 20:
            raise CpuListError(f"{text.strip()!r} is not a CPU list")
        out.update(range(low, high + 1))
    return sorted(out)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _read_list(path: Path) -> list[int] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except CpuListError:
        log.warning("%s: not a CPU list: %r", path, text.strip()[:80])
        return None


def _numa_of(sys_root: Path) -> dict[int, int]:
    """CPU id -> NUMA node, from node*/cpulist (empty: no NUMA nodes said)."""
    out: dict[int, int] = {}
    base = sys_root / "devices/system/node"
    for entry in sorted(base.glob("node[0-9]*")):
        node = int(entry.name[4:]) if entry.name[4:].isdigit() else None
        cpus = _read_list(entry / "cpulist") if node is not None else None
        for cpu in cpus or ():
            out.setdefault(cpu, node)  # type: ignore[arg-type]
    return out


def detect_cpus(sys_root: Path = SYS, allowed: Iterable[int] | None = None) -> list[HostCpu]:
    """The CPUs this process may use and that are online, with their cores and NUMA nodes.
    `allowed`: the affinity to assume (None: this process's own)."""
    usable = set(os.sched_getaffinity(0) if allowed is None else allowed)
    cpu_dir = sys_root / "devices/system/cpu"
    online = _read_list(cpu_dir / "online")
    if online is not None:
        usable &= set(online)
    numa = _numa_of(sys_root)
    cpus: list[HostCpu] = []
    for cpu in sorted(usable)[:MAX_CPUS]:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        siblings = _read_list(topo / "thread_siblings_list") or _read_list(topo / "core_cpus_list")
        core = min(siblings) if siblings and cpu in siblings else cpu
        cpus.append(HostCpu(id=cpu, core=core, numa=numa.get(cpu)))
    return cpus


def fake_cpus(count: int) -> list[HostCpu]:
    """`--fake-cpus N`: ids 0..N-1, each its own core, one NUMA node."""
    if isinstance(count, bool) or not 1 <= count <= MAX_CPUS:
        raise ValueError(f"--fake-cpus must be from 1 to {MAX_CPUS}, not {count}")
    return [HostCpu(id=i, core=i, numa=0) for i in range(count)]


def read_mem_total_mb(meminfo: Path = MEMINFO) -> int:
    """MemTotal in MiB (0 when it cannot be read)."""
    text = _read(meminfo) or ""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) // 1024 if m else 0


_BUS_ID = re.compile(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")


def pci_sysfs_name(bus_id: str) -> str | None:
    """NVML's and nvidia-smi's bus id (``00000000:3B:00.0``) as sysfs names the device
    (``0000:3b:00.0``); None for text that is not one."""
    m = re.fullmatch(
        r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])", bus_id.strip()
    )
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def gpu_numa_nodes(bus_ids: Mapping[int, str], sys_root: Path = SYS) -> dict[int, int]:
    """GPU index -> its PCI device's NUMA node, for the GPUs whose node the machine says."""
    out: dict[int, int] = {}
    for index, bus_id in bus_ids.items():
        name = pci_sysfs_name(bus_id)
        text = _read(sys_root / "bus/pci/devices" / name / "numa_node") if name else None
        try:
            node = int(text.strip()) if text else -1
        except ValueError:
            node = -1
        if node >= 0:
            out[index] = node
    return out


def gpu_bus_ids(
    gpus: Iterable[GpuInfo], source: str, nvidia_smi: str = NVIDIA_SMI
) -> dict[int, str]:
    """Each GPU's PCI bus id, asked of where the GPUs were found (a MIG instance: its
    GPU's); empty for fake GPUs or when the driver does not say."""
    gpus = list(gpus)
    if source == "nvml":
        return _nvml_bus_ids(gpus)
    if source == "nvidia-smi":
        return _smi_bus_ids(gpus, nvidia_smi)
    return {}


def _nvml_bus_ids(gpus: list[GpuInfo]) -> dict[int, str]:
    try:
        import pynvml
    except ImportError:
        return {}
    out: dict[int, str] = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # NVML's errors and OSError alike: topology is optional
        return {}
    try:
        for g in gpus:
            physical = g.device_index if g.device_index is not None else g.index
            handle = pynvml.nvmlDeviceGetHandleByIndex(physical)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            out[g.index] = bus.decode() if isinstance(bus, bytes) else str(bus)
    except Exception as exc:
        log.info("NVML did not say where the GPUs are (%s): no GPU topology", exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _smi_bus_ids(gpus: list[GpuInfo], nvidia_smi: str) -> dict[int, str]:
    try:
        proc = privileged.run(
            [nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
            NVIDIA_SMI_TIMEOUT,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi did not say where the GPUs are (%s)", exc)
        return {}
    if proc.returncode != 0:
        return {}
    by_index: dict[int, str] = {}
    for line in (proc.stdout or "").splitlines():
        index, _, bus = line.partition(",")
        if index.strip().isdigit() and bus.strip():
            by_index[int(index)] = bus.strip()
    wanted = {g.index for g in gpus if not g.mig}
    return {i: b for i, b in by_index.items() if i in wanted}


def detect_host(
    gpus: Iterable[GpuInfo],
    gpu_source: str,
    fake_cpu_count: int | None = None,
    fake_mem_mb: int | None = None,
    sys_root: Path = SYS,
) -> HostResources:
    """The node's CPUs, memory and GPU topology, or the fakes `mgpu node` was given."""
    gpus = list(gpus)
    if fake_cpu_count is not None:
        cpus = fake_cpus(fake_cpu_count)
        gpu_numa = {g.index: 0 for g in gpus}
    else:
        cpus = detect_cpus(sys_root)
        gpu_numa = gpu_numa_nodes(gpu_bus_ids(gpus, gpu_source), sys_root)
    mem = fake_mem_mb if fake_mem_mb is not None else read_mem_total_mb()
    return HostResources(cpus=cpus, mem_mb=mem, gpu_numa=gpu_numa)
