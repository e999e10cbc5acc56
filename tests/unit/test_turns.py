"""Sharing the event loop's turns: a burst of requests and concurrent bulk work are spread
over turns (master/runtime/turns.py), so no turn carries them all."""

from __future__ import annotations

import asyncio
from collections import Counter

from mgpu.master.runtime.turns import RequestTurns, bulk_turn


class TurnCounter:
    """Counts the loop's turns: a task that goes round once a turn."""

    def __init__(self) -> None:
        self.turn = 0

    async def run(self) -> None:
        while True:
            self.turn += 1
            await asyncio.sleep(0)


def test_a_burst_of_requests_begins_a_few_a_turn_in_the_order_they_came() -> None:
    async def main() -> tuple[list[int], list[int]]:
        turns, counter = RequestTurns(per_turn=4), TurnCounter()
        ticker = asyncio.create_task(counter.run())
        await asyncio.sleep(0)
        began: list[int] = []
        at: list[int] = []

        async def request(i: int) -> None:
            await turns.enter()
            began.append(i)
            at.append(counter.turn)

        await asyncio.gather(*(request(i) for i in range(30)))
        ticker.cancel()
        return began, at

    began, at = asyncio.run(main())
    assert began == list(range(30))
    per_turn = Counter(at)
    assert max(per_turn.values()) <= 4 and len(per_turn) >= 30 // 4


def test_a_lone_request_begins_at_once() -> None:
    async def main() -> bool:
        turns = RequestTurns(per_turn=4)
        task = asyncio.ensure_future(turns.enter())
        await asyncio.sleep(0)  # one turn: it has begun
        return task.done()

    assert asyncio.run(main())


def test_concurrent_bulk_work_takes_turns() -> None:
    async def main() -> list[int]:
        counter = TurnCounter()
        ticker = asyncio.create_task(counter.run())
        slices: list[int] = []

        async def bulk() -> None:
            for _ in range(10):
                await bulk_turn()
                slices.append(counter.turn)  # a slice of synchronous work

        await asyncio.gather(bulk(), bulk(), bulk())
        ticker.cancel()
        return slices

    slices = asyncio.run(main())
    assert len(slices) == 30
    assert max(Counter(slices).values()) == 1  # never two slices in one turn
