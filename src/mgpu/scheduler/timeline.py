"""Per-node GPU timelines for the planner (`plan.py`): who uses each GPU until when, with
the CPUs and memory held beside them, admin reservation windows, and the bookkeeping that
keeps a job's searches short."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

from .reservations import RESERVATION_PREFIX
from .types import SHARE_UNITS

State = tuple[int, tuple[int, ...], int, int]
"""One stretch of a node's timeline: (bitmask of GPUs in use, units used per GPU, CPUs
held, memory held in MiB)."""


class Line:
    """One node's timeline: `segs[i]` holds from `times[i]` to `times[i + 1]` (the last one
    forever); `ends[p]`/`whos[p]` say who uses GPU `p` until when (sorted by that end),
    `blocks` are the reservation windows on its GPUs."""

    __slots__ = ("blocks", "ends", "gpus", "pos", "segs", "times", "whos")

    def __init__(
        self,
        now: float,
        gpus: tuple[int, ...],
        state: State,
        blocks: list[tuple[float, float, int, str]],
    ) -> None:
        self.gpus = gpus
        self.pos = {g: i for i, g in enumerate(gpus)}
        self.times = [now]
        self.segs = [state]
        self.blocks = blocks
        self.ends: list[list[float]] = [[] for _ in gpus]
        self.whos: list[list[str]] = [[] for _ in gpus]

    def split(self, t: float) -> int:
        """The index of the segment starting at `t`, splitting one if needed."""
        times = self.times
        i = bisect_right(times, t) - 1
        if times[i] == t:
            return i
        times.insert(i + 1, t)
        self.segs.insert(i + 1, self.segs[i])
        return i + 1

    def add(
        self,
        t0: float,
        t1: float,
        positions: Sequence[int],
        units: int,
        holder: str,
        cpus: int = 0,
        mem_mb: int = 0,
    ) -> None:
        """`holder` uses `units` of each GPU at `positions`, and `cpus` and `mem_mb`, during
        [t0, t1)."""
        if t1 <= t0:
            return
        for p in positions:
            k = bisect_right(self.ends[p], t1)
            self.ends[p].insert(k, t1)
            self.whos[p].insert(k, holder)
        i0 = self.split(t0)
        i1 = self.split(t1) if math.isfinite(t1) else len(self.times)
        segs = self.segs
        # Stretches that shared a state share the new one (the memo keeps the old objects
        # too, so that no id is reused meanwhile).
        states: dict[int, tuple[State, State]] = {}
        for k in range(i0, i1):
            old = segs[k]
            memo = states.get(id(old))
            if memo is None:
                mask, used, held_cpus, held_mem = old
                u = list(used)
                for p in positions:
                    u[p] = min(SHARE_UNITS, u[p] + units)
                    mask |= 1 << p
                new = (mask, tuple(u), held_cpus + cpus, held_mem + mem_mb)
                memo = states[id(old)] = (old, new)
            segs[k] = memo[1]

    def free_for(self, t: float, end: float, own: str | None, allowed: int, need: int) -> int:
        """Bitmask of the `allowed` GPUs free for all of [t, end), or 0 if fewer than `need`
        (given up as soon as too few are left: most checks fail on the first stretch)."""
        times, segs = self.times, self.segs
        i = bisect_right(times, t) - 1
        n = len(times)
        free = allowed
        while i < n and times[i] < end:
            free &= ~segs[i][0]
            if free.bit_count() < need:
                return 0
            i += 1
        for bs, be, bmask, name in self.blocks:
            if bs < end and be > t and name != own:
                free &= ~bmask
        return free if free.bit_count() >= need else 0

    def peak(self, t: float, end: float, own: str | None) -> list[int]:
        """Each GPU's highest use during [t, end) (a reservation window counts as full)."""
        times, segs = self.times, self.segs
        i = bisect_right(times, t) - 1
        n = len(times)
        peak = [0] * len(self.gpus)
        while i < n and times[i] < end:
            for p, u in enumerate(segs[i][1]):
                if u > peak[p]:
                    peak[p] = u
            i += 1
        for bs, be, bmask, name in self.blocks:
            if bs < end and be > t and name != own:
                for p in range(len(peak)):
                    if bmask >> p & 1:
                        peak[p] = SHARE_UNITS
        return peak

    def room_peak(self, t: float, end: float) -> tuple[int, int]:
        """The most CPUs, and the most memory, held at once during [t, end)."""
        times, segs = self.times, self.segs
        i = bisect_right(times, t) - 1
        n = len(times)
        cpus = mem = 0
        while i < n and times[i] < end:
            seg = segs[i]
            if seg[2] > cpus:
                cpus = seg[2]
            if seg[3] > mem:
                mem = seg[3]
            i += 1
        return cpus, mem

    def until(
        self, t: float, positions: Iterable[int], own: str | None, limit: int
    ) -> dict[str, float]:
        """Who uses these GPUs before `t` and lets go of them by then, with when (on each GPU
        the last `limit`); and the reservations (as `reservation:NAME`, until their window
        ends) that keep them."""
        out: dict[str, float] = {}
        wanted = 0
        for p in positions:
            wanted |= 1 << p
            ends, whos = self.ends[p], self.whos[p]
            k = bisect_right(ends, t)
            for j in range(k - 1, max(k - limit, 0) - 1, -1):
                who = whos[j]
                if ends[j] > out.get(who, -math.inf):
                    out[who] = ends[j]
        for bs, be, bmask, name in self.blocks:
            if bs < t and bmask & wanted and name != own:
                out[RESERVATION_PREFIX + name] = be
        return out


class Staircase:
    """No start before `floor(d)` for a run of `d` seconds: the latest start found for a run
    at most that long (entries: durations ascending, starts strictly ascending)."""

    __slots__ = ("durations", "now", "starts")

    def __init__(self, now: float) -> None:
        self.now = now
        self.durations: list[float] = []
        self.starts: list[float] = []

    def floor(self, duration: float) -> float:
        k = bisect_right(self.durations, duration)
        return self.starts[k - 1] if k else self.now

    def add(self, duration: float, start: float) -> None:
        if start <= self.floor(duration):
            return  # a shorter run already proved as much
        k = bisect_left(self.durations, duration)
        end = k
        while end < len(self.starts) and self.starts[end] <= start:
            end += 1  # longer runs proven no later: this entry covers them
        self.durations[k:end] = [duration]
        self.starts[k:end] = [start]


def mask_positions(mask: int, limit: int | None = None) -> list[int]:
    """The set bits of `mask`, lowest first (at most `limit`)."""
    out: list[int] = []
    p = 0
    while mask and (limit is None or len(out) < limit):
        if mask & 1:
            out.append(p)
        mask >>= 1
        p += 1
    return out
