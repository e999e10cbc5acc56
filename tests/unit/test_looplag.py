"""The event loop's hold monitor (master/runtime/looplag.py): holds are measured, and it looks
often only while the loop is busy (each wake-up costs CPU on an idle master)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from mgpu.master.runtime import looplag
from mgpu.master.runtime.looplag import IDLE_INTERVAL, INTERVAL, LoopLag


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_it_looks_often_while_the_loop_is_busy_and_rarely_while_it_idles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        await real_sleep(seconds)

    monkeypatch.setattr(looplag, "asyncio", SimpleNamespace(sleep=sleep))

    async def scenario() -> tuple[list[float], list[float]]:
        monitor = asyncio.create_task(LoopLag().run())
        await real_sleep(0.35)  # idle
        idle = list(asked)
        # Busy: the loop's thread runs most of the time, until the monitor has looked
        # often five times (a loaded machine gives the thread less of each second: a
        # bound of wall time would measure the machine, not the monitor).
        end = time.monotonic() + 30
        while asked[len(idle) :].count(INTERVAL) < 5 and time.monotonic() < end:
            _burn(0.004)
            await real_sleep(0)
        busy = asked[len(idle) :]
        monitor.cancel()
        return idle, busy

    idle, busy = asyncio.run(scenario())
    assert IDLE_INTERVAL in idle[1:] and INTERVAL not in idle[2:]
    assert busy.count(INTERVAL) >= 5


def test_a_hold_is_measured_even_when_it_begins_in_an_idle_stretch() -> None:
    lag = LoopLag()
    held = 0.0

    async def scenario() -> None:
        nonlocal held
        monitor = asyncio.create_task(lag.run())
        await asyncio.sleep(0.25)  # idle: the monitor looks every IDLE_INTERVAL
        start = time.monotonic()
        _burn(0.3)  # one callback holds the loop (longer than 0.3 s on a loaded machine)
        held = time.monotonic() - start
        await asyncio.sleep(0.1)
        monitor.cancel()

    asyncio.run(scenario())
    # The hold, less the part of an idle interval that had passed when it began; never
    # the idle sleeps around it (generous slack: a loaded machine may wake the loop late).
    assert held - IDLE_INTERVAL - 0.01 <= lag.max < held + 2.0
    # Its CPU time is the loop thread's own: about the burn, not the wall clock around it.
    assert 0.2 <= lag.running_max < held + 0.5
