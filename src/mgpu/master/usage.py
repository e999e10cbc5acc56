"""Each user's GPU usage with exponential decay, for fairshare.

Usage is GPU-seconds, halved every `half_life` seconds (Slurm's
PriorityDecayHalfLife).  Stored as (value, as-of time) per user, so decaying is
a multiplication when read, never a periodic sweep.
"""

from __future__ import annotations

import json
import math


class UsageLedger:
    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._entries: dict[str, tuple[float, float]] = {}

    def _decayed(self, value: float, since: float, now: float) -> float:
        return value * math.pow(0.5, max(0.0, now - since) / self.half_life)

    def add(self, user: str, gpu_seconds: float, now: float) -> None:
        value, since = self._entries.get(user, (0.0, now))
        self._entries[user] = (self._decayed(value, since, now) + gpu_seconds, now)

    def snapshot(self, now: float) -> dict[str, float]:
        return {u: self._decayed(v, t, now) for u, (v, t) in self._entries.items()}

    def dumps(self) -> str:
        return json.dumps(self._entries)

    @classmethod
    def loads(cls, half_life: float, raw: str | None) -> UsageLedger:
        ledger = cls(half_life)
        if raw:
            for user, (value, since) in json.loads(raw).items():
                ledger._entries[str(user)] = (float(value), float(since))
        return ledger
