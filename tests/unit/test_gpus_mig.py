"""MIG discovery: each MIG instance NVML reports is a GPU of its own (recorded NVML output)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from mgpu.agent.gpus import GpuInfo, detect_gpus, sample_gpus

RECORDED = Path(__file__).resolve().parent.parent / "data" / "nvml" / "a100_mig.json"
MIB = 1024 * 1024
NOT_FOUND, NOT_SUPPORTED = 6, 3


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_pynvml(recorded: dict[str, Any], with_mig_api: bool = True) -> types.ModuleType:
    """A pynvml module answering from the recording (handles are its dicts)."""
    devices = recorded["devices"]
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    mod.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    mod.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def handle(i: int) -> dict[str, Any]:
        if i >= len(devices):
            raise FakeNVMLError(NOT_FOUND)
        return dict(devices[i])

    def mig_handle(h: dict[str, Any], slot: int) -> dict[str, Any]:
        for m in h["mig_devices"]:
            if m["slot"] == slot:
                return dict(m, parent=h["uuid"])
        raise FakeNVMLError(NOT_FOUND)

    def mig_mode(h: dict[str, Any]) -> tuple[int, int]:
        if "parent" in h:  # a MIG handle has no MIG mode of its own
            raise FakeNVMLError(NOT_SUPPORTED)
        current, pending = h["mig_mode"]
        return current, pending

    funcs: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: h["name"],
        "nvmlDeviceGetUUID": lambda h: h["uuid"],
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            total=h["memory_total"], used=MIB, free=h["memory_total"] - MIB
        ),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=40, memory=0),
        "nvmlDeviceGetTemperature": lambda h, sensor: 35,
        "nvmlDeviceGetPowerUsage": lambda h: 90000,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
    }
    if with_mig_api:
        funcs.update(
            nvmlDeviceGetMigMode=mig_mode,
            nvmlDeviceGetMaxMigDeviceCount=lambda h: h["max_mig_device_count"],
            nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        )
    for name, fn in funcs.items():
        setattr(mod, name, fn)
    return mod


@pytest.fixture
def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDED.read_text())
    return data


def test_each_mig_instance_is_a_gpu(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded))
    gpus, source = detect_gpus()
    assert source == "nvml"
    migs = recorded["devices"][0]["mig_devices"]
    whole = recorded["devices"][1]
    assert gpus == [
        *(
            GpuInfo(i, m["name"], m["memory_total"] // MIB, m["uuid"], device_index=0)
            for i, m in enumerate(migs)
        ),
        # numbered after the instances; its /dev/nvidia1 and NVML index stay 1
        GpuInfo(3, whole["name"], whole["memory_total"] // MIB, whole["uuid"], device_index=1),
    ]
    assert [g.mig for g in gpus] == [True, True, True, False]
    assert [g.memory_mb for g in gpus[:3]] == [40608, 20000, 10000]


def test_telemetry_of_an_instance_reads_its_physical_gpu(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded))
    gpus, source = detect_gpus()
    samples = sample_gpus(gpus, source)
    assert [s.index for s in samples] == [0, 1, 2, 3]
    total = recorded["devices"][0]["memory_total"] // MIB
    assert samples[0].memory_total_mb == total  # the parent GPU's, read by its NVML index
    assert all(s.utilization_pct == 40.0 for s in samples)


def test_without_mig_mode_gpus_keep_their_indices(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded["devices"][0]["mig_mode"] = [0, 1]  # enabled on next reset: not yet
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded))
    gpus, _ = detect_gpus()
    assert [(g.index, g.device_index, g.mig) for g in gpus] == [(0, None, False), (1, None, False)]


def test_bindings_without_the_mig_api(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(recorded, with_mig_api=False))
    gpus, _ = detect_gpus()
    assert [g.uuid for g in gpus] == [d["uuid"] for d in recorded["devices"]]
