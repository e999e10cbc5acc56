"""Use outside mgpu on an H200 (recorded NVML answers, tests/data/nvml/h200_*.json): the
memory the driver reserves for itself is nobody's use; the processes' memory is, and the
telemetry says whose it is."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from mgpu.agent import telemetry
from mgpu.agent.gpus import GpuInfo, GpuProcess, parse_compute_apps, sample_gpus
from mgpu.agent.telemetry import TelemetrySampler, owner
from mgpu.protocol import MAX_FOREIGN_PROCESSES, ForeignProcess

DATA = Path(__file__).resolve().parent.parent / "data"
MIB = 1024 * 1024
H200 = GpuInfo(0, "NVIDIA H200", 143771, "GPU-0e4b6c1a-59d2-4f3b-a8e7-3c91d2f0b6a4")
MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2
FUNCTION_NOT_FOUND = 13
BOB_3G = {"pid": 679, "usedGpuMemory": 3072 * MIB}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def recorded(name: str) -> dict[str, Any]:
    device: dict[str, Any] = json.loads((DATA / "nvml" / name).read_text())["devices"][0]
    return device


def fake_pynvml(device: dict[str, Any], *, v2: bool = True, graphics: bool = True) -> Any:
    """A pynvml module answering from one recorded device.  `v2=False`: a driver older
    than nvmlDeviceGetMemoryInfo_v2 (the binding has it, the call fails)."""
    mod = types.ModuleType("pynvml")

    def memory(handle: Any, version: int | None = None) -> Any:
        if version is None:
            return types.SimpleNamespace(**device["memory_v1"])
        assert version == MEMORY_V2
        if not v2:
            raise FakeNVMLError(FUNCTION_NOT_FOUND)
        return types.SimpleNamespace(**device["memory_v2"])

    def procs(key: str) -> Any:
        return lambda handle: [types.SimpleNamespace(**p) for p in device[key]]

    funcs: dict[str, Any] = {
        "NVMLError": FakeNVMLError,
        "NVML_TEMPERATURE_GPU": 0,
        "nvmlMemory_v2": MEMORY_V2,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda i: device,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(
            gpu=device["utilization"], memory=0
        ),
        "nvmlDeviceGetTemperature": lambda h, sensor: device["temperature"],
        "nvmlDeviceGetPowerUsage": lambda h: device["power_mw"],
        "nvmlDeviceGetComputeRunningProcesses": procs("compute_processes"),
    }
    if graphics:
        funcs["nvmlDeviceGetGraphicsRunningProcesses"] = procs("graphics_processes")
    for name, value in funcs.items():
        setattr(mod, name, value)
    return mod


@pytest.fixture
def owners(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """The recorded pids' owners, as /proc of that machine would say."""
    names = {679: "bob", 4242: "alice"}
    monkeypatch.setattr(telemetry, "owner", names.get)
    return names


def sampler(tmp_path: Path) -> TelemetrySampler:
    return TelemetrySampler([H200], "nvml", tmp_path, shares_enforced=lambda: False)


def test_an_idle_h200_is_not_used_outside_mgpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    """615 MiB used through NVML's v1 query and no process: the driver's reserve.  It is
    not use outside mgpu (with a 512 MiB threshold the GPU was never allocated again), and
    the memory used is what nvidia-smi shows: 0 MiB."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded("h200_idle.json")))
    (tel,) = sampler(tmp_path).sample([])
    assert (tel.memory_used_mb, tel.memory_total_mb) == (0, 143771)
    assert tel.foreign_memory_mb == 0
    assert tel.foreign == [] and tel.foreign_processes == []
    assert (tel.utilization_pct, tel.power_w, tel.shares_enforced) == (0.0, 76.218, False)


def test_a_driver_without_the_v2_query_still_leaves_the_reserve_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    """v1 alone counts the reserve as used; the empty process list still says that no
    process outside mgpu holds any of it."""
    device = recorded("h200_idle.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device, v2=False))
    (tel,) = sampler(tmp_path).sample([])
    assert tel.memory_used_mb == 615
    assert tel.foreign_memory_mb == 0


def test_a_process_outside_mgpu_is_counted_with_its_owner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    device = recorded("h200_busy.json")
    device["compute_processes"] = device["compute_processes"][:1]  # the job's GPU is not this
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device))
    (tel,) = sampler(tmp_path).sample([])
    assert tel.memory_used_mb == 3072 + 973  # nvidia-smi's figure: the reserve left out
    assert tel.foreign_memory_mb == 3072
    assert tel.foreign == [ForeignProcess(pid=679, user="bob", memory_mb=3072)]
    assert tel.foreign_processes == [679]


def test_the_jobs_own_processes_are_not_foreign(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded("h200_busy.json")))
    (s,) = sample_gpus([H200], "nvml", exclude_pids={4242})
    assert s.foreign == (GpuProcess(679, 3072),)
    (s,) = sample_gpus([H200], "nvml")
    assert s.foreign == (GpuProcess(679, 3072), GpuProcess(4242, 973))  # most memory first


def test_graphics_processes_count_and_one_in_both_lists_counts_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = recorded("h200_busy.json")
    device["graphics_processes"] = [
        {"pid": 812, "usedGpuMemory": 256 * MIB},  # a desktop session
        {"pid": 679, "usedGpuMemory": 3072 * MIB},
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device))
    (s,) = sample_gpus([H200], "nvml", exclude_pids={4242})
    assert s.foreign == (GpuProcess(679, 3072), GpuProcess(812, 256))
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device, graphics=False))
    (s,) = sample_gpus([H200], "nvml", exclude_pids={4242})  # older bindings: compute only
    assert s.foreign == (GpuProcess(679, 3072),)


def test_a_process_whose_memory_is_not_said_counts_all_the_memory_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    """Under WDDM, or without the rights, NVML gives no usedGpuMemory (pynvml: None): the
    memory in use (the reserve left out) is then taken as the process's."""
    device = recorded("h200_busy.json")
    device["compute_processes"] = [{"pid": 679, "usedGpuMemory": None}]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device))
    (tel,) = sampler(tmp_path).sample([])
    assert tel.foreign_memory_mb == 3072 + 973
    assert tel.foreign == [ForeignProcess(pid=679, user="bob", memory_mb=None)]


def test_an_unreadable_process_list_counts_all_the_memory_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    mod = fake_pynvml(recorded("h200_busy.json"))

    def refused(handle: Any) -> Any:
        raise FakeNVMLError(4)  # NVML_ERROR_NO_PERMISSION

    mod.nvmlDeviceGetComputeRunningProcesses = refused
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    (tel,) = sampler(tmp_path).sample([])
    assert tel.foreign_memory_mb == 3072 + 973
    assert tel.foreign == []


def test_the_foreign_list_is_bounded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    device = recorded("h200_busy.json")
    many = MAX_FOREIGN_PROCESSES + 10
    device["compute_processes"] = [{"pid": 10_000 + i, "usedGpuMemory": MIB} for i in range(many)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device))
    (tel,) = sampler(tmp_path).sample([])
    assert len(tel.foreign) == len(tel.foreign_processes) == MAX_FOREIGN_PROCESSES
    assert tel.foreign_memory_mb == many  # the memory of them all


def test_nvidia_smi_apps_with_their_memory() -> None:
    text = (DATA / "nvidia-smi" / "h200_apps.csv").read_text()
    assert parse_compute_apps(text) == {
        H200.uuid: [GpuProcess(679, 3072), GpuProcess(4242, 973), GpuProcess(5120, None)]
    }
    # The older query, without used_memory: processes of unknown memory.
    assert parse_compute_apps(f"{H200.uuid}, 679\n") == {H200.uuid: [GpuProcess(679, None)]}


def test_owner_is_the_account_name() -> None:
    assert owner(os.getpid()) == psutil.Process().username()
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert owner(dead.pid) is None


def test_the_mps_server_is_not_use_outside_mgpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owners: dict[int, str]
) -> None:
    """Shared jobs under MPS run their kernels in the MPS server: NVML lists it, not them."""
    device = recorded("h200_busy.json")
    device["compute_processes"] = [{"pid": 913, "usedGpuMemory": 600 * MIB}, BOB_3G]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device))
    monkeypatch.setattr(telemetry, "mps_server", lambda pid: pid == 913)
    (tel,) = sampler(tmp_path).sample([])
    assert tel.foreign_processes == [679] and tel.foreign_memory_mb == 3072
    assert not telemetry.mps_server(os.getpid())


def test_the_master_takes_a_bounded_list_of_printable_owners() -> None:
    from pydantic import ValidationError

    from mgpu.protocol import GpuTelemetry

    many = [{"pid": 1, "user": "bob"}] * (MAX_FOREIGN_PROCESSES + 1)
    with pytest.raises(ValidationError, match="foreign"):
        GpuTelemetry.model_validate({"index": 0, "foreign": many})
    with pytest.raises(ValidationError, match="cannot be shown"):
        GpuTelemetry.model_validate({"index": 0, "foreign": [{"pid": 1, "user": "b\x1bob"}]})
    # An older agent's telemetry (no owners, no word on shares) is still taken.
    old = GpuTelemetry.model_validate({"index": 0, "foreign_processes": [5]})
    assert (old.foreign, old.shares_enforced) == ([], None)
