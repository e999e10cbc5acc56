"""GPU discovery: fake GPUs, NVML (fake pynvml module), nvidia-smi (recorded outputs)."""

from __future__ import annotations

import random
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mgpu.agent.gpus import (
    FAKE_GPU_MEMORY_MB,
    FAKE_GPU_NAME,
    GpuCountError,
    GpuInfo,
    detect_gpus,
    parse_nvidia_smi_csv,
    sample_gpus,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "nvidia-smi"
MIB = 1024 * 1024

A100_UUIDS = (
    "GPU-4c2a3f1e-8b0d-7d5e-2f6a-91c0b3e4d5a6",
    "GPU-7e9b1c2d-3a4f-5b6c-8d7e-0f1a2b3c4d5e",
)


# --------------------------------------------------------------------------- fake pynvml


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError (an Exception subclass with a `value`)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


@dataclass
class FakeDevice:
    name: str | bytes
    total: int
    uuid: str | bytes | None
    used: int = 0
    util: int | None = 0
    temp: int | None = 30
    power_mw: int | None = 50000
    pids: tuple[int, ...] = ()


@dataclass
class FakeNvml:
    """The slice of the pynvml API that gpus.py uses, with recorded values."""

    devices: list[FakeDevice]
    init_error: int | None = None
    fail_handle_at: int | None = None
    calls: list[str] = field(default_factory=list)

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml")
        mod.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
        mod.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(mod, name, getattr(self, name))
        return mod

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        if i == self.fail_handle_at or i >= len(self.devices):
            raise FakeNVMLError(15)  # NVML_ERROR_GPU_IS_LOST
        return self.devices[i]

    def nvmlDeviceGetName(self, h: FakeDevice) -> str | bytes:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str | bytes:
        if h.uuid is None:
            raise FakeNVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        return h.uuid

    def nvmlDeviceGetMemoryInfo(self, h: FakeDevice) -> Any:
        return types.SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeDevice) -> Any:
        if h.util is None:
            raise FakeNVMLError(3)
        return types.SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetTemperature(self, h: FakeDevice, sensor: int) -> int:
        assert sensor == 0
        if h.temp is None:
            raise FakeNVMLError(3)
        return h.temp

    def nvmlDeviceGetPowerUsage(self, h: FakeDevice) -> int:
        if h.power_mw is None:
            raise FakeNVMLError(3)
        return h.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeDevice) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=1 * MIB) for p in h.pids]


def a100_box() -> FakeNvml:
    # nvidia-ml-py >= 11.515 returns str; memory totals are bytes (81920 MiB).
    return FakeNvml(
        [
            FakeDevice("NVIDIA A100-SXM4-80GB", 85899345920, A100_UUIDS[0]),
            FakeDevice("NVIDIA A100-SXM4-80GB", 85899345920, A100_UUIDS[1]),
        ]
    )


def rtx3060_box_old_bindings() -> FakeNvml:
    # Older bindings (pynvml 11.4) hand back bytes.
    return FakeNvml(
        [
            FakeDevice(
                b"NVIDIA GeForce RTX 3060",
                12884901888,
                b"GPU-5d8e2b71-9c3a-4f06-b1e7-2a9d4c6f8b03",
            )
        ]
    )


def install_nvml(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml | None) -> None:
    if fake is None:
        # A None entry in sys.modules makes `import pynvml` raise ImportError.
        monkeypatch.setitem(sys.modules, "pynvml", None)
    else:
        monkeypatch.setitem(sys.modules, "pynvml", fake.module())


# --------------------------------------------------------------------------- fake nvidia-smi


@dataclass
class SmiRun:
    """Replays recorded nvidia-smi outputs, chosen by the query in argv."""

    outputs: dict[str, tuple[str, int]]
    calls: list[list[str]] = field(default_factory=list)
    timeouts: list[float | None] = field(default_factory=list)

    def __call__(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(args))
        self.timeouts.append(kwargs.get("timeout"))
        assert kwargs.get("text") is True
        for key, (out, rc) in self.outputs.items():
            if any(key in a for a in args):
                return subprocess.CompletedProcess(args, rc, stdout=out, stderr="")
        raise AssertionError(f"unexpected nvidia-smi call {args}")


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def install_smi(monkeypatch: pytest.MonkeyPatch, **outputs: tuple[str, int]) -> SmiRun:
    run = SmiRun({k.replace("_", "-"): v for k, v in outputs.items()})
    monkeypatch.setattr("mgpu.agent.gpus.subprocess.run", run)
    return run


def install_smi_raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> list[Any]:
    calls: list[Any] = []

    def run(args: list[str], **kwargs: Any) -> Any:
        calls.append(args)
        raise exc

    monkeypatch.setattr("mgpu.agent.gpus.subprocess.run", run)
    return calls


# --------------------------------------------------------------------------- fake GPUs


@pytest.mark.parametrize("count", [0, 1, 4, 8])
def test_fake_gpus(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fake GPUs never touch NVML or nvidia-smi.
    install_smi_raising(monkeypatch, AssertionError("nvidia-smi must not run"))
    install_nvml(monkeypatch, FakeNvml([], init_error=999))
    gpus, source = detect_gpus(fake=count, hostname="gpu001")
    assert source == "fake"
    assert [g.index for g in gpus] == list(range(count))
    for g in gpus:
        assert g.name == FAKE_GPU_NAME
        assert g.memory_mb == FAKE_GPU_MEMORY_MB == 81920
        assert g.uuid == f"FAKE-gpu001-{g.index}"


def test_fake_gpus_default_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mgpu.agent.gpus.socket.gethostname", lambda: "box")
    gpus, _ = detect_gpus(fake=2)
    assert [g.uuid for g in gpus] == ["FAKE-box-0", "FAKE-box-1"]


def test_fake_gpus_negative() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        detect_gpus(fake=-1)


# --------------------------------------------------------------------------- NVML


def test_nvml_a100(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = a100_box()
    install_nvml(monkeypatch, fake)
    install_smi_raising(monkeypatch, AssertionError("nvidia-smi must not run"))
    gpus, source = detect_gpus()
    assert source == "nvml"
    assert gpus == [
        GpuInfo(0, "NVIDIA A100-SXM4-80GB", 81920, A100_UUIDS[0]),
        GpuInfo(1, "NVIDIA A100-SXM4-80GB", 81920, A100_UUIDS[1]),
    ]
    assert fake.calls == ["init", "shutdown"]


def test_nvml_bytes_names(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, rtx3060_box_old_bindings())
    gpus, source = detect_gpus()
    assert source == "nvml"
    assert gpus == [
        GpuInfo(0, "NVIDIA GeForce RTX 3060", 12288, "GPU-5d8e2b71-9c3a-4f06-b1e7-2a9d4c6f8b03")
    ]


def test_nvml_uuid_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, FakeNvml([FakeDevice("Tesla T4", 16106127360, None)]))
    gpus, _ = detect_gpus()
    assert gpus == [GpuInfo(0, "Tesla T4", 15360, None)]


def test_nvml_undecodable_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen under WSL: the bindings' own .decode() raises UnicodeDecodeError.
    fake = a100_box()

    def bad_name(h: FakeDevice) -> str:
        raise UnicodeDecodeError("utf-8", b"\xf8", 0, 1, "invalid start byte")

    mod = fake.module()
    mod.nvmlDeviceGetName = bad_name  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    gpus, source = detect_gpus()
    assert source == "nvml"
    assert [g.name for g in gpus] == ["NVIDIA GPU", "NVIDIA GPU"]
    assert gpus[0].memory_mb == 81920


@pytest.mark.parametrize(
    "nvml",
    [
        pytest.param(None, id="pynvml-not-installed"),
        pytest.param(FakeNvml([], init_error=12), id="library-not-found"),
        pytest.param(FakeNvml([], init_error=9), id="driver-not-loaded"),
        pytest.param(FakeNvml([]), id="zero-devices"),
        pytest.param(
            FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 85899345920, "x")] * 2, fail_handle_at=1),
            id="gpu-lost-while-listing",
        ),
    ],
)
def test_nvml_failure_falls_back_to_nvidia_smi(
    nvml: FakeNvml | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_nvml(monkeypatch, nvml)
    run = install_smi(monkeypatch, query_gpu=(recorded("a100x4.csv"), 0))
    gpus, source = detect_gpus(timeout=7.0)
    assert source == "nvidia-smi"
    assert len(gpus) == 4
    assert run.calls == [
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,uuid",
            "--format=csv,noheader,nounits",
        ]
    ]
    assert run.timeouts == [7.0]
    if nvml is not None and nvml.init_error is None:
        assert nvml.calls == ["init", "shutdown"]  # shut down even after a failure


def test_nvml_init_oserror_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([])

    def init() -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    mod = fake.module()
    mod.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    install_smi(monkeypatch, query_gpu=(recorded("rtx3060.csv"), 0))
    gpus, source = detect_gpus()
    assert (source, [g.name for g in gpus]) == ("nvidia-smi", ["NVIDIA GeForce RTX 3060"])


# --------------------------------------------------------------------------- nvidia-smi


def test_nvidia_smi_a100x4(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, None)
    install_smi(monkeypatch, query_gpu=(recorded("a100x4.csv"), 0))
    gpus, source = detect_gpus()
    assert source == "nvidia-smi"
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {g.name for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert {g.memory_mb for g in gpus} == {81920}
    assert gpus[0].uuid == A100_UUIDS[0]
    assert all(g.uuid and g.uuid.startswith("GPU-") for g in gpus)


def test_nvidia_smi_rtx3060(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, None)
    install_smi(monkeypatch, query_gpu=(recorded("rtx3060.csv"), 0))
    gpus, source = detect_gpus()
    assert (gpus, source) == (
        [GpuInfo(0, "NVIDIA GeForce RTX 3060", 12288, "GPU-5d8e2b71-9c3a-4f06-b1e7-2a9d4c6f8b03")],
        "nvidia-smi",
    )


def test_nvidia_smi_na_fields() -> None:
    gpus = parse_nvidia_smi_csv(recorded("na_fields.csv"))
    # GPU 1 (lost) and GPU 2 (no memory size) are skipped, as is the garbage line.
    assert gpus == [
        GpuInfo(0, "NVIDIA A100-PCIE-40GB", 40960, None),
        GpuInfo(3, "NVIDIA A100-PCIE-40GB", 40960, None),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("\n\n", []),
        ("0, Odd, Name, 1024, GPU-x\n", [GpuInfo(0, "Odd, Name", 1024, "GPU-x")]),
        (
            "1, B, 2048, GPU-b\n0, A, 1024, GPU-a\n",
            [GpuInfo(0, "A", 1024, "GPU-a"), GpuInfo(1, "B", 2048, "GPU-b")],
        ),
        ("0, A, 1024, GPU-a\n0, A2, 1, GPU-z\n", [GpuInfo(0, "A", 1024, "GPU-a")]),
        ("-1, A, 1024, GPU-a\n", []),
        ("x, A, 1024, GPU-a\n", []),
        ("0, A, 1024\n", []),
        ("0, [N/A], 1024, GPU-a\n", []),
        ("0,A,1024,GPU-a\r\n", [GpuInfo(0, "A", 1024, "GPU-a")]),
    ],
)
def test_parse_nvidia_smi_csv(text: str, expected: list[GpuInfo]) -> None:
    assert parse_nvidia_smi_csv(text) == expected


@pytest.mark.parametrize(
    ("stdout", "rc"),
    [
        pytest.param(recorded("driver_error.txt"), 9, id="driver-error-rc9"),
        pytest.param(recorded("no_devices.txt"), 6, id="no-devices-rc6"),
        pytest.param("", 0, id="empty-output"),
        pytest.param("garbage\n", 0, id="garbage-output"),
    ],
)
def test_nvidia_smi_failure_gives_none(
    stdout: str, rc: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_nvml(monkeypatch, None)
    install_smi(monkeypatch, query_gpu=(stdout, rc))
    assert detect_gpus() == ([], "none")


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(2, "No such file or directory", "nvidia-smi"),
        PermissionError(13, "Permission denied", "nvidia-smi"),
        subprocess.TimeoutExpired(["nvidia-smi"], 15.0),
    ],
    ids=["not-installed", "not-executable", "hangs"],
)
def test_nvidia_smi_not_runnable_gives_none(
    exc: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_nvml(monkeypatch, FakeNvml([], init_error=12))
    calls = install_smi_raising(monkeypatch, exc)
    assert detect_gpus() == ([], "none")
    assert len(calls) == 1


def test_driver_error_message_is_what_nvidia_smi_prints() -> None:
    assert recorded("driver_error.txt").startswith(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


# --------------------------------------------------------------------------- --gpu-count


@pytest.mark.parametrize("count", [0, 1, 4])
def test_gpu_count_keeps_the_first_real_gpus(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, None)
    install_smi(monkeypatch, query_gpu=(recorded("a100x4.csv"), 0))
    gpus, source = detect_gpus(count=count)
    assert source == "nvidia-smi"
    assert [g.index for g in gpus] == list(range(count))
    assert [g.uuid for g in gpus] == [g.uuid for g in detect_gpus()[0][:count]]


def test_gpu_count_keeps_indices_as_cuda_numbers_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPUs 1 and 2 are unreadable: the "first two" are 0 and 3, not renumbered.
    install_nvml(monkeypatch, None)
    install_smi(monkeypatch, query_gpu=(recorded("na_fields.csv"), 0))
    gpus, _ = detect_gpus(count=2)
    assert [g.index for g in gpus] == [0, 3]


def test_gpu_count_with_fake_gpus() -> None:
    gpus, source = detect_gpus(fake=4, count=2, hostname="h")
    assert (source, [g.uuid for g in gpus]) == ("fake", ["FAKE-h-0", "FAKE-h-1"])


@pytest.mark.parametrize(
    ("fake", "count", "message"),
    [
        (
            2,
            3,
            "--gpu-count 3 asks for more GPUs than this node has (2 simulated by --fake-gpus); "
            "give a smaller N, or leave --gpu-count out to use them all",
        ),
        (2, -1, "--gpu-count must be 0 or more, not -1"),
    ],
)
def test_gpu_count_beyond_the_node(fake: int, count: int, message: str) -> None:
    with pytest.raises(GpuCountError) as err:
        detect_gpus(fake=fake, count=count)
    assert str(err.value) == message


def test_gpu_count_on_a_node_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, None)
    install_smi(monkeypatch, query_gpu=(recorded("no_devices.txt"), 6))
    with pytest.raises(GpuCountError, match="none found through NVML or nvidia-smi") as err:
        detect_gpus(count=1)
    assert "--fake-gpus N simulates GPUs" in str(err.value)
    assert detect_gpus(count=0) == ([], "none")


def test_gpu_count_of_a_real_node(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, a100_box())
    with pytest.raises(GpuCountError, match=r"\(2 found through nvml\)"):
        detect_gpus(count=8)


# --------------------------------------------------------------------------- telemetry


def test_sample_fake() -> None:
    gpus, source = detect_gpus(fake=3, hostname="h")
    samples = sample_gpus(gpus, source, busy={1}, rng=random.Random(1))
    assert [s.index for s in samples] == [0, 1, 2]
    assert all(s.simulated for s in samples)
    assert all(s.memory_total_mb == 81920 for s in samples)
    idle, busy = samples[0], samples[1]
    assert idle.utilization_pct is not None and idle.utilization_pct < 5
    assert busy.utilization_pct is not None and busy.utilization_pct >= 70
    assert busy.memory_used_mb is not None and busy.memory_used_mb > 10000
    assert busy.power_w is not None and idle.power_w is not None and busy.power_w > idle.power_w
    assert all(s.temperature_c is not None and 20 < s.temperature_c < 90 for s in samples)
    assert all(s.foreign_processes == () for s in samples)


def test_sample_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = a100_box()
    d0, d1 = fake.devices
    d0.used, d0.util, d0.temp, d0.power_mw, d0.pids = 61234 * MIB, 97, 64, 387520, (41872, 500)
    d1.util, d1.power_mw = None, None  # not supported
    install_nvml(monkeypatch, fake)
    gpus, source = detect_gpus()
    samples = sample_gpus(gpus, source, exclude_pids={500})
    s0, s1 = samples
    assert (s0.utilization_pct, s0.memory_used_mb, s0.memory_total_mb) == (97.0, 61234, 81920)
    assert (s0.temperature_c, s0.power_w) == (64.0, 387.52)
    assert s0.foreign_processes == (41872,)
    assert not s0.simulated
    assert (s1.utilization_pct, s1.power_w, s1.temperature_c) == (None, None, 30.0)
    assert fake.calls == ["init", "shutdown", "init", "shutdown"]


def test_sample_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, FakeNvml([], init_error=9))
    gpus = [GpuInfo(0, "NVIDIA A100-SXM4-80GB", 81920, A100_UUIDS[0])]
    (s,) = sample_gpus(gpus, "nvml")
    assert (s.index, s.utilization_pct, s.memory_total_mb, s.simulated) == (0, None, 81920, False)


def test_sample_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    install_smi(
        monkeypatch,
        query_gpu=(recorded("a100x2_sample.csv"), 0),
        query_compute_apps=(recorded("a100x2_apps.csv"), 0),
    )
    gpus = [GpuInfo(i, "NVIDIA A100-SXM4-80GB", 81920, A100_UUIDS[i]) for i in range(2)]
    s0, s1 = sample_gpus(gpus, "nvidia-smi", exclude_pids={41900})
    assert (s0.utilization_pct, s0.memory_used_mb, s0.temperature_c, s0.power_w) == (
        97.0,
        61234,
        64.0,
        387.52,
    )
    assert s0.foreign_processes == (41872,)
    assert (s1.utilization_pct, s1.memory_used_mb, s1.foreign_processes) == (0.0, 4, ())


def test_sample_nvidia_smi_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    install_smi(
        monkeypatch,
        query_gpu=(recorded("driver_error.txt"), 9),
        query_compute_apps=(recorded("driver_error.txt"), 9),
    )
    gpus = [GpuInfo(0, "NVIDIA GeForce RTX 3060", 12288, None)]
    (s,) = sample_gpus(gpus, "nvidia-smi")
    assert (s.utilization_pct, s.memory_total_mb, s.foreign_processes) == (None, 12288, ())


def test_sample_none() -> None:
    assert sample_gpus([], "none") == []
