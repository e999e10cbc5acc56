"""How long the master's event loop is held: a task that measures its own oversleep.

`LoopLag.run` sleeps again and again; each time it wakes later than asked, the
difference is how long something else held the loop (a callback, a request, a pass) or, on
a busy machine, how long the process waited for a CPU.  Every hold is observed in a
Prometheus histogram (`mgpu_event_loop_hold_seconds`) and the longest one since start is a
gauge (`mgpu_event_loop_hold_max_seconds`), both in /metrics; a hold of `SLOW` or more is
logged with its time and how much of it the loop's thread spent running (its CPU time):
the rest it waited, for a CPU on a busy machine or for the GIL held by a worker thread.
The most CPU time of one hold is a gauge too (`mgpu_event_loop_hold_running_max_seconds`):
what the loop's own work cost, which a loaded machine does not stretch (tests bound it;
the wall-clock figures are the benchmarks').
A request that queues behind others (a flood of connections) shows as latency elsewhere;
a callback that holds the loop shows here.

Each wake-up costs ~0.2 ms of CPU on this kind of VM (the timer, not Python), so the
monitor looks every `INTERVAL` (10 ms: holds measured to 10 ms) only while the loop's
thread is busy — it ran `BUSY` of the last look's time or more — and every `IDLE_INTERVAL`
while it idles (an idle 1,000-node master would otherwise spend ~2 % of a core on it).  A
hold that begins in an idle stretch is measured short by at most IDLE_INTERVAL; the
master is busy after its first look inside the hold.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry, Gauge, Histogram

__all__ = ["IDLE_INTERVAL", "INTERVAL", "SLOW", "LoopLag"]

log = logging.getLogger("mgpu.master")

INTERVAL = 0.01
"""Seconds the monitor sleeps between two looks while the loop is busy."""
IDLE_INTERVAL = 0.1
"""Seconds it sleeps while the loop idles."""
BUSY = 0.05
"""The share of a look's time the loop's thread must have run for the loop to be busy."""
SLOW = 0.1
"""A hold this long or longer is logged (seconds): the master's target is none."""
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LoopLag:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.holds = Histogram(
            "mgpu_event_loop_hold_seconds",
            "How long the event loop was held past the monitor's sleep, each time it was",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.longest = Gauge(
            "mgpu_event_loop_hold_max_seconds",
            "The longest the event loop was held since the master started",
            registry=self.registry,
        )
        self.running_longest = Gauge(
            "mgpu_event_loop_hold_running_max_seconds",
            "The most CPU time the loop's thread spent in one hold since the master started "
            "(a hold's share that was not waiting for a CPU)",
            registry=self.registry,
        )
        self.max = 0.0
        self.running_max = 0.0

    def observe(self, held: float, running: float | None = None) -> None:
        self.holds.observe(held)
        if held >= SLOW:
            ran = "" if running is None else f" ({running * 1000:.0f} ms of it running)"
            log.warning("event loop held for %d ms%s", held * 1000, ran)
        if held > self.max:
            self.max = held
            self.longest.set(held)
        if running is not None and running > self.running_max:
            self.running_max = running
            self.running_longest.set(running)

    async def run(self) -> None:
        clock, cpu = time.perf_counter, time.thread_time
        interval = INTERVAL
        while True:
            before, ran = clock(), cpu()
            await asyncio.sleep(interval)
            took, running = clock() - before, cpu() - ran
            held = took - interval
            if held > 0.001:  # under a millisecond is the loop's own granularity
                self.observe(held, running)
            interval = INTERVAL if running >= BUSY * took else IDLE_INTERVAL
