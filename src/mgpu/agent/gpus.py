"""GPU discovery and telemetry for the node agent.

Discovery order (`detect_gpus`): simulated GPUs when ``--fake-gpus N`` is given, else NVML
through the ``pynvml`` module of the ``nvidia-ml-py`` package, else ``nvidia-smi``'s CSV
query, else no GPUs.  ``--gpu-count N`` then keeps the first N of them (by index), as the
seeds' node agent did.

The agent manages *every* GPU of its node: an inherited ``CUDA_VISIBLE_DEVICES`` is
deliberately ignored here (NVML and nvidia-smi do not honour it either), because the agent
sets ``CUDA_VISIBLE_DEVICES`` itself for each job.  To keep GPUs away from mgpu, give the
agent ``--gpu-count N`` (it then manages GPUs 0..N-1 only), or drain the node.

Reported facts, checked against nvidia-ml-py 13.x:

* ``nvmlDeviceGetName``/``nvmlDeviceGetUUID`` return ``str`` since nvidia-ml-py 11.515
  (older bindings and the unofficial ``pynvml`` 11.4 returned ``bytes``; both are handled).
  Under WSL the name can fail to decode (``UnicodeDecodeError``); the GPU is then kept
  under a generic name.
* ``nvmlDeviceGetMemoryInfo(h)`` has ``total``/``free``/``used`` in **bytes**, its ``used``
  counting the memory the driver reserves for itself (615 MiB on an idle H200 with driver
  580); ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` (driver >= 510) has that
  ``reserved`` apart and a ``used`` without it, which is what nvidia-smi shows;
  ``nvmlDeviceGetPowerUsage`` is in **milliwatts**; ``nvmlDeviceGetUtilizationRates(h).gpu``
  is a percentage; ``nvmlDeviceGetComputeRunningProcesses`` and
  ``nvmlDeviceGetGraphicsRunningProcesses`` items have ``.pid`` and ``.usedGpuMemory``
  (bytes; None where the driver cannot say, e.g. under WDDM or without the rights).
* ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` prints one line per GPU,
  fields separated by ``", "``, memory in MiB, and ``[N/A]``/``[Not Supported]``/
  ``[Unknown Error]`` for values it cannot read.  With no usable driver it exits non-zero
  (9 for "couldn't communicate with the NVIDIA driver", 6 for "No devices were found").
"""

from __future__ import annotations

import logging
import random
import socket
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from mgpu.agent import privileged

__all__ = [
    "FAKE_GPU_MEMORY_MB",
    "FAKE_GPU_NAME",
    "GpuCountError",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "GpuSource",
    "detect_gpus",
    "fake_gpus",
    "first_gpus",
    "parse_compute_apps",
    "parse_nvidia_smi_csv",
    "sample_gpus",
]

log = logging.getLogger(__name__)

GpuSource = Literal["nvml", "nvidia-smi", "fake", "none"]

FAKE_GPU_NAME: Final = "Fake GPU (simulated A100)"
FAKE_GPU_MEMORY_MB: Final = 81920
NVIDIA_SMI: Final = "nvidia-smi"
NVIDIA_SMI_TIMEOUT: Final = 15.0
_QUERY_FIELDS: Final = "index,name,memory.total,uuid"
_SAMPLE_FIELDS: Final = "index,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
_APPS_FIELDS: Final = "gpu_uuid,pid,used_memory"
_MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of the node, as discovered at start-up."""

    index: int
    name: str
    memory_mb: int
    uuid: str | None = None
    device_index: int | None = None
    """The physical GPU's NVML index (its /dev/nvidiaN) where it differs from `index`: a MIG
    instance (its parent), and the GPUs numbered after MIG instances on the node."""

    @property
    def mig(self) -> bool:
        return bool(self.uuid and self.uuid.startswith("MIG-"))


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU: its pid and the GPU memory it holds (None: not said)."""

    pid: int
    memory_mb: int | None = None


@dataclass
class GpuSample:
    """Telemetry of one GPU at one moment; None where the value could not be read."""

    index: int
    utilization_pct: float | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    temperature_c: float | None
    power_w: float | None
    simulated: bool
    foreign: tuple[GpuProcess, ...] | None = None
    """Processes on the GPU (compute and graphics), minus those the caller excluded as its
    own, most memory first; None where the driver's process list could not be read."""

    @property
    def foreign_processes(self) -> tuple[int, ...]:
        """The pids of `foreign`, in order."""
        return tuple(p.pid for p in self.foreign or ())


# --------------------------------------------------------------------------- discovery


class GpuCountError(ValueError):
    """``--gpu-count N`` asks for more GPUs than the node has."""


def detect_gpus(
    fake: int | None = None,
    *,
    count: int | None = None,
    hostname: str | None = None,
    nvidia_smi: str = NVIDIA_SMI,
    timeout: float = NVIDIA_SMI_TIMEOUT,
) -> tuple[list[GpuInfo], str]:
    """Find the node's GPUs and say where the list came from.

    Returns ``(gpus, source)`` with `source` one of ``"fake"``, ``"nvml"``,
    ``"nvidia-smi"`` or ``"none"``; `gpus` is sorted by index.  ``fake=N`` (N >= 0)
    simulates N GPUs without touching the hardware.  A real source that finds zero GPUs
    falls through to the next one, so ``"none"`` always comes with an empty list.
    ``count=N`` keeps the first N GPUs found (`GpuCountError` if there are fewer).
    """
    gpus, source = _discover(fake, hostname, nvidia_smi, timeout)
    if count is None:
        return gpus, source
    return first_gpus(gpus, count, source), source


def _discover(
    fake: int | None, hostname: str | None, nvidia_smi: str, timeout: float
) -> tuple[list[GpuInfo], str]:
    if fake is not None:
        return fake_gpus(fake, hostname=hostname), "fake"

    gpus = _detect_nvml()
    if gpus:
        return gpus, "nvml"

    gpus = _detect_nvidia_smi(nvidia_smi, timeout)
    if gpus:
        return gpus, "nvidia-smi"

    log.info("no NVIDIA GPUs found (NVML and nvidia-smi both unavailable or empty)")
    return [], "none"


def first_gpus(gpus: Sequence[GpuInfo], count: int, source: str) -> list[GpuInfo]:
    """The first `count` of `gpus` (sorted by index): what ``--gpu-count`` leaves the agent.

    The others stay outside mgpu: never allocated, nor sampled.  Their indices are not
    renumbered (GPU 0..count-1 are the node's own 0..count-1, as CUDA numbers them)."""
    if isinstance(count, bool) or count < 0:
        raise GpuCountError(f"--gpu-count must be 0 or more, not {count}")
    if count > len(gpus):
        found = {
            "fake": f"{len(gpus)} simulated by --fake-gpus",
            "none": "none found through NVML or nvidia-smi",
        }.get(source, f"{len(gpus)} found through {source}")
        hint = "--fake-gpus N simulates GPUs" if source == "none" else "give a smaller N"
        raise GpuCountError(
            f"--gpu-count {count} asks for more GPUs than this node has ({found}); "
            f"{hint}, or leave --gpu-count out to use them all"
        )
    return sorted(gpus, key=lambda g: g.index)[:count]


def fake_gpus(count: int, *, hostname: str | None = None) -> list[GpuInfo]:
    """`count` simulated A100-like GPUs with stable per-host UUIDs."""
    if isinstance(count, bool) or count < 0:
        raise ValueError(f"the number of fake GPUs must be 0 or more, not {count}")
    host = hostname or socket.gethostname() or "localhost"
    return [
        GpuInfo(index=i, name=FAKE_GPU_NAME, memory_mb=FAKE_GPU_MEMORY_MB, uuid=f"FAKE-{host}-{i}")
        for i in range(count)
    ]


def _import_pynvml() -> Any | None:
    try:
        import pynvml
    except ImportError as exc:
        log.debug("pynvml is not importable: %s", exc)
        return None
    return pynvml


def _text(value: Any) -> str:
    """NVML strings are str in nvidia-ml-py >= 11.515 and bytes before."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _nvml_error(nvml: Any) -> type[BaseException]:
    err = getattr(nvml, "NVMLError", None)
    if isinstance(err, type) and issubclass(err, BaseException):
        return err
    return OSError


def _detect_nvml() -> list[GpuInfo]:
    """GPUs via NVML; an empty list when NVML is missing or fails."""
    nvml = _import_pynvml()
    if nvml is None:
        return []
    nvml_error = _nvml_error(nvml)
    try:
        nvml.nvmlInit()
    except (nvml_error, OSError) as exc:
        log.info("NVML is unavailable (%s); trying nvidia-smi", exc)
        return []
    try:
        gpus: list[GpuInfo] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            instances = _mig_instances(nvml, handle, nvml_error)
            if instances:  # each MIG instance is a device of its own
                for mig in instances:
                    gpus.append(_nvml_gpu(nvml, mig, len(gpus), i, nvml_error))
                continue
            renumbered = len(gpus) != i
            gpus.append(_nvml_gpu(nvml, handle, len(gpus), i if renumbered else None, nvml_error))
        return gpus
    except (nvml_error, OSError) as exc:
        log.warning("NVML failed while listing GPUs (%s); trying nvidia-smi", exc)
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except (nvml_error, OSError):
            pass


def _nvml_gpu(
    nvml: Any, handle: Any, index: int, device_index: int | None, nvml_error: type[BaseException]
) -> GpuInfo:
    """One GPU (or MIG instance) from its NVML handle."""
    try:
        name = _text(nvml.nvmlDeviceGetName(handle)).strip() or "NVIDIA GPU"
    except UnicodeDecodeError:  # seen under WSL: NVML returns undecodable bytes
        name = "NVIDIA GPU"
    memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
    try:
        uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle)).strip() or None
    except (nvml_error, UnicodeDecodeError):
        uuid = None
    return GpuInfo(
        index=index, name=name, memory_mb=memory_mb, uuid=uuid, device_index=device_index
    )


def _mig_instances(nvml: Any, handle: Any, nvml_error: type[BaseException]) -> list[Any]:
    """The MIG instances of a GPU in MIG mode (their NVML handles), else [].

    `nvmlDeviceGetMigMode` returns (current, pending) and raises NOT_SUPPORTED on GPUs
    without MIG; `nvmlDeviceGetMaxMigDeviceCount` bounds the instance slots, and
    `nvmlDeviceGetMigDeviceHandleByIndex` raises NOT_FOUND for an empty slot."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if get_mode is None:  # bindings older than MIG
        return []
    try:
        current, _pending = get_mode(handle)
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except (nvml_error, OSError):
        return []
    found = []
    for slot in range(slots):
        try:
            found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        except (nvml_error, OSError):
            continue
    return found


def _run_nvidia_smi(args: list[str], timeout: float) -> str | None:
    """stdout of a successful nvidia-smi run, else None (logged)."""
    try:
        proc = privileged.run(args, timeout)
    except FileNotFoundError:
        log.debug("%s is not installed", args[0])
        return None
    except subprocess.TimeoutExpired:
        log.warning("%s did not answer within %.0f s", args[0], timeout)
        return None
    except OSError as exc:
        log.warning("%s could not be run: %s", args[0], exc)
        return None
    if proc.returncode != 0:
        detail = (proc.stdout or proc.stderr or "").strip().splitlines()
        log.info(
            "%s exited with code %d: %s",
            args[0],
            proc.returncode,
            detail[0] if detail else "(no output)",
        )
        return None
    return proc.stdout or ""


def _detect_nvidia_smi(nvidia_smi: str, timeout: float) -> list[GpuInfo]:
    out = _run_nvidia_smi(
        [nvidia_smi, f"--query-gpu={_QUERY_FIELDS}", "--format=csv,noheader,nounits"],
        timeout,
    )
    return parse_nvidia_smi_csv(out) if out is not None else []


def _na(field: str) -> bool:
    """nvidia-smi writes unreadable values as [N/A], [Not Supported], [Unknown Error]..."""
    f = field.strip()
    return not f or (f.startswith("[") and f.endswith("]")) or f.upper() == "N/A"


def _int_field(field: str) -> int | None:
    f = field.strip()
    if _na(f):
        return None
    try:
        return int(float(f))
    except (ValueError, OverflowError):  # garbage, "nan", "inf"
        return None


def _float_field(field: str) -> float | None:
    f = field.strip()
    if _na(f):
        return None
    try:
        return float(f)
    except ValueError:
        return None


def parse_nvidia_smi_csv(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total,uuid
    --format=csv,noheader,nounits`` output.

    Lines without an integer index or memory size (garbage, or a GPU nvidia-smi cannot
    read, which is unusable anyway) are skipped; a ``[N/A]`` UUID becomes None.  A name
    containing commas is kept whole.  Duplicate indices keep the first line.
    """
    gpus: dict[int, GpuInfo] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 4:
            if line.strip():
                log.debug("skipping nvidia-smi line %r", line)
            continue
        index = _int_field(parts[0])
        memory_mb = _int_field(parts[-2])
        name = ",".join(parts[1:-2]).strip()
        if index is None or index < 0 or memory_mb is None or memory_mb < 0 or _na(name):
            log.warning("skipping unreadable nvidia-smi line %r", line.strip())
            continue
        uuid = None if _na(parts[-1]) else parts[-1].strip()
        gpus.setdefault(index, GpuInfo(index=index, name=name, memory_mb=memory_mb, uuid=uuid))
    return [gpus[i] for i in sorted(gpus)]


# --------------------------------------------------------------------------- telemetry


def sample_gpus(
    gpus: Sequence[GpuInfo],
    source: str,
    *,
    busy: Collection[int] = (),
    exclude_pids: Collection[int] = (),
    nvidia_smi: str = NVIDIA_SMI,
    timeout: float = NVIDIA_SMI_TIMEOUT,
    rng: random.Random | None = None,
) -> list[GpuSample]:
    """One telemetry sample per GPU in `gpus`, read the way `source` says.

    ``"fake"`` GPUs get plausible simulated values (`busy` indices look loaded) with
    ``simulated=True``.  ``"nvml"`` and ``"nvidia-smi"`` read the hardware; values a GPU
    does not support, or a failing read, give None rather than an exception.
    `foreign` lists the processes on each GPU minus `exclude_pids`; `memory_used_mb` is
    the memory in use without what the driver reserves for itself (as nvidia-smi shows it).
    """
    if source == "fake":
        return _sample_fake(gpus, busy, rng or random.Random())
    if source == "nvml":
        samples = _sample_nvml(gpus, exclude_pids)
        if samples is not None:
            return samples
        return [_empty_sample(g) for g in gpus]
    if source == "nvidia-smi":
        return _sample_nvidia_smi(gpus, exclude_pids, nvidia_smi, timeout)
    return [_empty_sample(g) for g in gpus]


def _empty_sample(gpu: GpuInfo) -> GpuSample:
    return GpuSample(
        index=gpu.index,
        utilization_pct=None,
        memory_used_mb=None,
        memory_total_mb=gpu.memory_mb,
        temperature_c=None,
        power_w=None,
        simulated=False,
    )


def _sample_fake(
    gpus: Sequence[GpuInfo], busy: Collection[int], rng: random.Random
) -> list[GpuSample]:
    samples = []
    for g in gpus:
        loaded = g.index in busy
        util = rng.uniform(70.0, 100.0) if loaded else rng.uniform(0.0, 2.0)
        mem_used = int(g.memory_mb * rng.uniform(0.3, 0.9)) if loaded else rng.randint(0, 8)
        samples.append(
            GpuSample(
                index=g.index,
                utilization_pct=round(util, 1),
                memory_used_mb=mem_used,
                memory_total_mb=g.memory_mb,
                temperature_c=round(32.0 + util * 0.4 + rng.uniform(-1.0, 1.0), 1),
                power_w=round(55.0 + util * 3.0 + rng.uniform(-2.0, 2.0), 1),
                simulated=True,
            )
        )
    return samples


def _sample_nvml(gpus: Sequence[GpuInfo], exclude_pids: Collection[int]) -> list[GpuSample] | None:
    nvml = _import_pynvml()
    if nvml is None:
        return None
    nvml_error = _nvml_error(nvml)
    errors = (nvml_error, OSError)
    try:
        nvml.nvmlInit()
    except errors as exc:
        log.warning("NVML is unavailable for telemetry: %s", exc)
        return None
    try:
        samples = []
        for g in gpus:
            try:
                physical = g.index if g.device_index is None else g.device_index
                handle = nvml.nvmlDeviceGetHandleByIndex(physical)
            except errors as exc:
                log.warning("NVML cannot reach GPU %d: %s", g.index, exc)
                samples.append(_empty_sample(g))
                continue
            s = _empty_sample(g)
            try:
                s.utilization_pct = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except errors:
                pass
            try:
                s.memory_used_mb, s.memory_total_mb = _nvml_memory(nvml, handle, errors)
            except errors:
                pass
            try:
                sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
                s.temperature_c = float(nvml.nvmlDeviceGetTemperature(handle, sensor))
            except errors:
                pass
            try:  # milliwatts
                s.power_w = float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0
            except errors:
                pass
            try:
                s.foreign = _without(_nvml_processes(nvml, handle, errors), exclude_pids)
            except errors:
                pass
            samples.append(s)
        return samples
    finally:
        try:
            nvml.nvmlShutdown()
        except errors:
            pass


def _nvml_memory(
    nvml: Any, handle: Any, errors: tuple[type[BaseException], ...]
) -> tuple[int, int]:
    """(used, total) MiB of a GPU, its used memory without the driver's reserve.

    The v2 query (driver >= 510) has the reserve apart; an older driver (or bindings without
    `nvmlMemory_v2`) gets the v1 query, whose `used` counts it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(mem.used) // _MIB, int(mem.total) // _MIB
        except errors:  # FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH: an older driver
            pass
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(mem.used) // _MIB, int(mem.total) // _MIB


def _nvml_processes(
    nvml: Any, handle: Any, errors: tuple[type[BaseException], ...]
) -> list[GpuProcess]:
    """Compute and graphics processes of a GPU (a process in both lists counted once).

    The compute list must be readable (it raises otherwise); the graphics list is not
    supported by every GPU or binding and is then left out."""
    found: dict[int, int | None] = {}
    lists = [nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    graphics = getattr(nvml, "nvmlDeviceGetGraphicsRunningProcesses", None)
    if graphics is not None:
        try:
            lists.append(graphics(handle))
        except errors:
            pass
    for procs in lists:
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            mb = int(used) // _MIB if used is not None else None
            pid = int(p.pid)
            found[pid] = mb if found.get(pid) is None else max(found[pid] or 0, mb or 0)
    return [GpuProcess(pid, mb) for pid, mb in found.items()]


def _without(procs: Sequence[GpuProcess], exclude_pids: Collection[int]) -> tuple[GpuProcess, ...]:
    """`procs` less the excluded pids, most memory first (then by pid)."""
    excluded = set(exclude_pids)
    kept = [p for p in procs if p.pid not in excluded]
    return tuple(sorted(kept, key=lambda p: (-(p.memory_mb or 0), p.pid)))


def _sample_nvidia_smi(
    gpus: Sequence[GpuInfo],
    exclude_pids: Collection[int],
    nvidia_smi: str,
    timeout: float,
) -> list[GpuSample]:
    out = _run_nvidia_smi(
        [nvidia_smi, f"--query-gpu={_SAMPLE_FIELDS}", "--format=csv,noheader,nounits"],
        timeout,
    )
    by_index: dict[int, GpuSample] = {}
    for line in (out or "").splitlines():
        parts = line.split(",")
        if len(parts) != 6:
            continue
        index = _int_field(parts[0])
        if index is None:
            continue
        by_index[index] = GpuSample(
            index=index,
            utilization_pct=_float_field(parts[1]),
            memory_used_mb=_int_field(parts[2]),
            memory_total_mb=_int_field(parts[3]),
            temperature_c=_float_field(parts[4]),
            power_w=_float_field(parts[5]),
            simulated=False,
        )

    apps = _run_nvidia_smi(
        [nvidia_smi, f"--query-compute-apps={_APPS_FIELDS}", "--format=csv,noheader,nounits"],
        timeout,
    )
    by_uuid = None if apps is None else parse_compute_apps(apps)
    samples = []
    for g in gpus:
        s = by_index.get(g.index) or _empty_sample(g)
        if g.uuid is not None and by_uuid is not None:
            s.foreign = _without(by_uuid.get(g.uuid, []), exclude_pids)
        samples.append(s)
    return samples


def parse_compute_apps(text: str) -> dict[str, list[GpuProcess]]:
    """GPU UUID -> its processes, from ``nvidia-smi --query-compute-apps=gpu_uuid,pid,
    used_memory --format=csv,noheader,nounits`` (MiB; ``[N/A]`` where it cannot say).  A
    line without the memory column (``gpu_uuid,pid`` alone) gives a process of unknown
    memory."""
    found: dict[str, dict[int, int | None]] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 2:
            continue
        pid = _int_field(parts[1])
        if pid is None:
            continue
        memory_mb = _int_field(parts[2]) if len(parts) > 2 else None
        found.setdefault(parts[0].strip(), {})[pid] = memory_mb
    return {uuid: [GpuProcess(p, mb) for p, mb in procs.items()] for uuid, procs in found.items()}
