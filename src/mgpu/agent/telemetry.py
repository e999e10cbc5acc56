"""The GPU telemetry an agent sends with each heartbeat.

Real GPUs are read with `sample_gpus` (NVML or nvidia-smi).  Foreign use, meaning use of
a GPU by processes mgpu did not start, is reported as `foreign` (each process's pid, owner
and memory; `foreign_processes` has the pids alone) and `foreign_memory_mb`: for a GPU no
job of this agent holds, the memory of the processes on it (the memory the driver reserves
for itself is no process's: an idle H200 shows 615 MiB used and no process).  Where the
driver does not say a process's memory, or cannot list the processes, all the memory in
use counts.  For a held GPU the master knows it is busy anyway.

Simulated (`--fake-gpus`) GPUs report plausible values marked `simulated`; a GPU held by
a job looks loaded.  For demos and tests the simulation takes, in increasing precedence:

* `mgpu node --fake-foreign 0:4096[,1:512]` or `MGPU_FAKE_FOREIGN=0:4096`: GPU 0 has
  4096 MB in use by a process outside mgpu (pid 0, no owner);
* `MGPU_FAKE_UTIL=0` (or `0:0,1:80` per GPU): the utilisation held GPUs report
  (0 makes their jobs look idle);
* a JSON file `fake-telemetry.json` in the agent's node directory
  (`STATE_DIR/node-ID/`), re-read at every heartbeat:
  `{"util": 0, "foreign": {"0": 4096}}` (`util` may also map GPU index to value; a
  foreign value may also say who: `{"mb": 3072, "pid": 679, "user": "bob"}`).
  Keys present in the file override the environment; delete it to go back.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from mgpu.agent.gpus import GpuInfo, GpuProcess, GpuSample, sample_gpus
from mgpu.protocol import MAX_FOREIGN_PROCESSES, ForeignProcess, GpuTelemetry

log = logging.getLogger("mgpu.agent")

FAKE_FILE = "fake-telemetry.json"
FAKE_FOREIGN_PID = 0
"""PID reported for simulated foreign use (no real process)."""


def parse_gpu_values(text: str, what: str) -> dict[int, float]:
    """`0:4096,1:512` -> {0: 4096.0, 1: 512.0}; raises ValueError with one sentence."""
    out: dict[int, float] = {}
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        index, sep, value = part.partition(":")
        try:
            if not sep:
                raise ValueError
            gpu, amount = int(index), float(value)
        except ValueError:
            raise ValueError(f"{what} {part!r} is not GPU_INDEX:VALUE") from None
        if gpu < 0 or amount < 0:
            raise ValueError(f"{what} {part!r} must not be negative")
        out[gpu] = amount
    return out


@dataclass(frozen=True)
class FakeForeign:
    """Simulated use of a GPU outside mgpu."""

    memory_mb: int
    pid: int = FAKE_FOREIGN_PID
    user: str | None = None


def _fake_foreign(value: Any) -> FakeForeign:
    """A fake file's foreign value: MB, or {"mb": MB, "pid": PID, "user": NAME}."""
    if isinstance(value, dict):
        user = value.get("user")
        return FakeForeign(
            int(value.get("mb", 0)),
            int(value.get("pid", FAKE_FOREIGN_PID)),
            str(user) if user is not None else None,
        )
    return FakeForeign(int(float(value)))


class FakeOverrides:
    """What simulated GPUs are told to show (see the module's docstring)."""

    def __init__(self, node_dir: Path, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.file = node_dir / FAKE_FILE
        self.foreign: dict[int, FakeForeign] = {}
        self.util: dict[int, float] | float | None = None
        try:
            values = parse_gpu_values(env.get("MGPU_FAKE_FOREIGN", ""), "MGPU_FAKE_FOREIGN")
            self.foreign = {gpu: FakeForeign(int(mb)) for gpu, mb in values.items()}
            raw = env.get("MGPU_FAKE_UTIL", "").strip()
            if raw:
                self.util = parse_gpu_values(raw, "MGPU_FAKE_UTIL") if ":" in raw else float(raw)
        except ValueError as e:
            log.warning("ignoring simulated telemetry settings: %s", e)

    def current(self) -> tuple[dict[int, FakeForeign], dict[int, float] | float | None]:
        foreign, util = self.foreign, self.util
        try:
            data: Any = json.loads(self.file.read_text())
        except FileNotFoundError:
            return foreign, util
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", self.file, e)
            return foreign, util
        if not isinstance(data, dict):
            return foreign, util
        if isinstance(data.get("foreign"), dict):
            try:
                foreign = {int(k): _fake_foreign(v) for k, v in data["foreign"].items()}
            except (TypeError, ValueError) as e:
                log.warning("ignoring the foreign use in %s: %s", self.file, e)
        if "util" in data:
            u = data["util"]
            util = {int(k): float(v) for k, v in u.items()} if isinstance(u, dict) else u
        return foreign, util


class TelemetrySampler:
    def __init__(
        self,
        gpus: list[GpuInfo],
        source: str,
        node_dir: Path,
        shares_enforced: Callable[[], bool] | None = None,
    ) -> None:
        self.gpus = gpus
        self.source = source
        self.fake = FakeOverrides(node_dir) if source == "fake" else None
        self.shares_enforced = shares_enforced
        """Whether shares are held to their limits (MPS: mgpu.agent.mps), asked each sample."""
        self.rng = random.Random()
        self._env_cache: dict[int, set[int]] = {}

    def sample(self, job_pids: Iterable[int]) -> list[GpuTelemetry]:
        """One GpuTelemetry per GPU; `job_pids` are the agent's running job shims."""
        pids = list(job_pids)
        busy = self._busy_gpus(pids)
        own = self._own_pids(pids) if self.source in ("nvml", "nvidia-smi") else set()
        samples = sample_gpus(self.gpus, self.source, busy=busy, exclude_pids=own, rng=self.rng)
        for s in samples:
            if s.foreign:
                s.foreign = tuple(p for p in s.foreign if not mps_server(p.pid))
        enforced = self.shares_enforced() if self.shares_enforced is not None else None
        return [self._telemetry(s, s.index in busy, enforced) for s in samples]

    def _telemetry(self, s: GpuSample, held: bool, enforced: bool | None) -> GpuTelemetry:
        tel = GpuTelemetry(
            index=s.index,
            utilization_pct=s.utilization_pct,
            memory_used_mb=s.memory_used_mb,
            memory_total_mb=s.memory_total_mb,
            temperature_c=s.temperature_c,
            power_w=s.power_w,
            simulated=s.simulated,
            shares_enforced=enforced,
        )
        if self.fake is None:
            procs = list(s.foreign or ())[:MAX_FOREIGN_PROCESSES]
            tel.foreign = [
                ForeignProcess(pid=p.pid, user=owner(p.pid), memory_mb=p.memory_mb) for p in procs
            ]
            tel.foreign_processes = [p.pid for p in procs]
            if not held:
                tel.foreign_memory_mb = foreign_memory(s)
            return tel
        foreign, util = self.fake.current()
        tel.foreign_memory_mb = 0
        fake = foreign.get(s.index)
        if fake is not None and fake.memory_mb:
            mb = fake.memory_mb
            tel.foreign_memory_mb = mb
            tel.foreign_processes = [fake.pid]
            tel.foreign = [ForeignProcess(pid=fake.pid, user=fake.user, memory_mb=mb)]
            total = tel.memory_total_mb or mb
            tel.memory_used_mb = min(total, (tel.memory_used_mb or 0) + mb)
        value = util.get(s.index) if isinstance(util, dict) else util
        if held and value is not None:
            tel.utilization_pct = float(value)
            if s.temperature_c is not None:
                tel.temperature_c = round(32.0 + float(value) * 0.4, 1)
        return tel

    def _busy_gpus(self, pids: list[int]) -> set[int]:
        """GPU indices held by the agent's jobs, read from each job's MGPU_GPU_IDS (also
        right for jobs re-adopted after an agent restart)."""
        busy: set[int] = set()
        for pid in pids:
            ids = self._env_cache.get(pid)
            if ids is None:
                try:
                    raw = psutil.Process(pid).environ().get("MGPU_GPU_IDS", "")
                except (psutil.Error, OSError):
                    continue  # gone, or not readable yet: try again at the next heartbeat
                ids = {int(x) for x in raw.split(",") if x.strip().isdigit()}
                self._env_cache[pid] = ids
            busy |= ids
        for pid in list(self._env_cache):
            if pid not in pids:
                del self._env_cache[pid]
        return busy

    @staticmethod
    def _own_pids(pids: list[int]) -> set[int]:
        own: set[int] = set()
        for pid in pids:
            try:
                p = psutil.Process(pid)
                own.add(pid)
                own.update(c.pid for c in p.children(recursive=True))
            except psutil.Error:
                continue
        return own


def foreign_memory(s: GpuSample) -> int | None:
    """MiB used on a GPU no job holds by processes mgpu did not start: the sum of theirs,
    or all the memory in use where a process's is not said or the list could not be read
    (the reserve the driver keeps is left out either way: `memory_used_mb` has none)."""
    procs: tuple[GpuProcess, ...] | None = s.foreign
    if procs is not None and all(p.memory_mb is not None for p in procs):
        return sum(p.memory_mb or 0 for p in procs)
    return s.memory_used_mb


MPS_SERVER = "nvidia-cuda-mps-server"


def mps_server(pid: int) -> bool:
    """The process is an MPS server: it runs the shared jobs' kernels (NVML lists it, not
    them), and lingers a moment after they end; its memory is theirs, not use outside."""
    try:
        return psutil.Process(pid).name() == MPS_SERVER
    except (psutil.Error, OSError):
        return False


def owner(pid: int) -> str | None:
    """The account name of the process's owner (its uid where the node has no name for it,
    as psutil reads /proc/PID/status), or None when it is gone or hidden."""
    try:
        return psutil.Process(pid).username()
    except (psutil.Error, OSError):
        return None
