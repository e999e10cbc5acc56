"""Each user's GPU usage with exponential decay, for fairshare (`Snapshot.usage`).

Usage is GPU-seconds, halved every `half_life` seconds (Slurm's PriorityDecayHalfLife); a
fractional job (`--gpu-share F`) is charged F x its time:
an attempt's GPU-seconds are added when it ends (`add`) and decay from then on, and running
attempts count their GPU-seconds so far, undecayed.  The master and the simulator both keep
one `UsageLedger`; they differ only in how running work reaches it: the master passes its
running jobs to `snapshot` (it lists them every pass anyway), the simulator registers them
as they `start` and `stop` (so a snapshot costs nothing per running job).

Decay is never a sweep.  Each user's ended usage is kept as its value as of a common `base`
time, `value · e^(k·(t − base))` for usage worth `value` at `t`, with k = ln 2 / half-life;
reading every user at `now` is then one multiplication each by e^(−k·(now − base)), one
`exp` in all.  The base moves forward before that factor could overflow.  Running work per
user is `gpus·now − Σ gpus·start`, both kept as jobs start and stop (GPUs in whole share
units, so that a user's running GPUs go back to exactly 0 however shares were added).

What a second of a job costs is `billing` (`types.BillingWeights`, Slurm's
TRESBillingWeights): by default 1 per GPU (GPU-seconds, as before CPUs and memory were
counted); with weights for CPUs and GiB of memory, a job is charged for those it holds too.
Running work keeps its CPUs and memory apart from its GPUs, so the weights apply when read.

Stored (`dumps`/`loads`) as `{"user": [value, as_of], ...}`: each user's usage as of
`as_of`, halved every half-life after it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from .types import GPU_BILLING, SHARE_UNITS, BillingWeights, RunningJob

__all__ = ["UsageLedger"]

_REBASE = 300.0
"""k·(now − base) beyond which the base moves (e^300 is far from overflow)."""


class UsageLedger:
    def __init__(self, half_life: float, billing: BillingWeights = GPU_BILLING) -> None:
        self.half_life = half_life
        self.billing = billing
        """What a second of a job costs (the master sets it from its config)."""
        self.k = math.log(2.0) / half_life
        self.base = 0.0
        self.as_of = 0.0
        """The latest time the ledger was changed or read at."""
        self._ended: dict[str, float] = {}  # as of `base`, see the module docstring
        self._units: dict[str, int] = {}  # share units of the user's registered running jobs
        self._started: dict[str, float] = {}  # Σ gpus·start of those jobs
        # Their CPUs and MiB, and Σ cpus·start, Σ mem·start (only users that hold any).
        self._held: dict[str, list[float]] = {}

    def _decay(self, now: float) -> float:
        """e^(−k·(now − base)), moving the base first if it got far behind."""
        if now > self.as_of:
            self.as_of = now
        exponent = self.k * (now - self.base)
        if exponent > _REBASE:
            shift = math.exp(-exponent)
            self._ended = {u: v * shift for u, v in self._ended.items()}
            self.base, exponent = now, 0.0
        return math.exp(-exponent)

    def _user(self, user: str) -> None:
        if user not in self._ended:
            self._ended[user] = 0.0
            self._units[user] = 0
            self._started[user] = 0.0

    def add(self, user: str, gpu_seconds: float, now: float) -> None:
        """Work that ended at `now`: it decays from then on."""
        self._user(user)
        decay = self._decay(now)  # first: it may rescale the ledger
        self._ended[user] += gpu_seconds / decay

    def charge(
        self, user: str, gpus: float, cpus: int, mem_mb: int, seconds: float, now: float
    ) -> None:
        """A job that held these for `seconds` ended at `now`: `add` what it costs."""
        self.add(user, self.billing.rate(gpus, cpus, mem_mb) * seconds, now)

    def start(self, user: str, gpus: float, now: float, cpus: int = 0, mem_mb: int = 0) -> None:
        """A job of `user` on `gpus` GPUs (F for a share), with `cpus` and `mem_mb`, started
        at `now` (counted until `stop`)."""
        self._user(user)
        self._units[user] += round(gpus * SHARE_UNITS)
        self._started[user] += gpus * now
        if cpus or mem_mb:
            held = self._held.setdefault(user, [0, 0, 0.0, 0.0])
            held[0] += cpus
            held[1] += mem_mb
            held[2] += cpus * now
            held[3] += mem_mb * now

    def stop(
        self, user: str, gpus: float, start: float, now: float, cpus: int = 0, mem_mb: int = 0
    ) -> None:
        """The job `start` registered ended at `now`: what it cost becomes ended work."""
        left = self._units[user] - round(gpus * SHARE_UNITS)
        self._units[user] = left
        # Reset to exactly 0 when idle so no rounding residue lingers.
        self._started[user] = self._started[user] - gpus * start if left else 0.0
        held = self._held.get(user)
        if held is not None and (cpus or mem_mb):
            held[0] -= cpus
            held[1] -= mem_mb
            held[2] -= cpus * start
            held[3] -= mem_mb * start
            if not (held[0] or held[1]):
                del self._held[user]
        self.charge(user, gpus, cpus, mem_mb, now - start, now)

    def snapshot(self, now: float, running: Iterable[RunningJob] = ()) -> dict[str, float]:
        """Each user's usage at `now`: ended work decayed, plus running work so far.

        `running` are jobs not registered with `start`; each counts GPUs × time since its
        start (none if it starts later than `now`).
        """
        decay = self._decay(now)
        units, started = self._units, self._started
        bill = self.billing
        if bill.gpu_only:
            usage = {
                u: v * decay + (units[u] / SHARE_UNITS * now - started[u])
                for u, v in self._ended.items()
            }
        else:
            usage = {
                u: v * decay + bill.gpu * (units[u] / SHARE_UNITS * now - started[u])
                for u, v in self._ended.items()
            }
            for u, (cpus, mem, cpu_start, mem_start) in self._held.items():
                usage[u] += bill.cpu * (cpus * now - cpu_start)
                usage[u] += bill.mem_gb / 1024 * (mem * now - mem_start)
        for r in running:
            rate = bill.rate(r.gpu_amount, r.cpus, r.mem_mb)
            usage[r.user] = usage.get(r.user, 0.0) + rate * max(0.0, now - r.start_time)
        return usage

    def dumps(self) -> str:
        """Ended usage as `{"user": [value, as_of]}` (running work is not stored)."""
        at = max(self.as_of, self.base)
        scale = math.exp(-self.k * (at - self.base))
        return json.dumps({u: [v * scale, at] for u, v in self._ended.items()})

    @classmethod
    def loads(cls, half_life: float, raw: str | None) -> UsageLedger:
        """A ledger from `dumps` output (or the older form, where each user has its own
        as-of time); None or "" is an empty ledger."""
        ledger = cls(half_life)
        if not raw:
            return ledger
        entries = {str(u): (float(v), float(t)) for u, (v, t) in json.loads(raw).items()}
        if entries:
            ledger.base = ledger.as_of = max(t for _, t in entries.values())
        for user, (value, since) in entries.items():
            ledger._user(user)
            ledger._ended[user] = value * math.exp(-ledger.k * (ledger.base - since))
        return ledger
