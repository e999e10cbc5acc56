"""Following an srun step's output (`GET /api/sruns/{id}/output`) is follow.py's one loop
over its tasks' outputs: each record marked with its task, a reconnecting client's
records left out, and the end (with each task's) only after every task's output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from harness import Harness

from mgpu.master.control.jobctl import Actor
from mgpu.master.control.srun import SrunRequest
from mgpu.master.http import steps
from mgpu.master.http.deps import JobAccess


def test_a_steps_follower_gets_each_tasks_records_marked_then_the_end(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = h.submit("sleep 100", nodes=2, gpus_per_node=2, slurm={"batch": True})
    h.tick()
    if n1.port_requests():
        n1.port(job_id)
    n1.started(job_id)
    group, _ = h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["hostname"], env={}))
    h.settle()
    t0, t1 = group.tasks
    n1.output(t0.id, "zero-1\n", epoch=t0.epoch)  # the client has it (since=1)
    n1.output(t0.id, "zero-2\n", epoch=t0.epoch)

    async def main() -> list[dict[str, Any]]:
        owned = JobAccess(h.cl, Actor("alice", admin=False))
        answer = await steps.output(group.id, h.cl, owned, since="1")
        lines: list[dict[str, Any]] = []

        async def read() -> None:
            async for chunk in answer.body_iterator:
                text = chunk if isinstance(chunk, str) else bytes(chunk).decode()
                lines.extend(json.loads(t) for t in text.splitlines())

        async def until(seen: Callable[[dict[str, Any]], bool]) -> None:
            async with asyncio.timeout(10):
                while not any(map(seen, lines)):
                    await asyncio.sleep(0)  # a turn of the loop: the feed runs

        reader = asyncio.create_task(read())
        await until(lambda line: line.get("d") == "zero-2\n")
        n2.output(t1.id, "one\n", epoch=t1.epoch)
        await until(lambda line: line.get("d") == "one\n")
        n1.exited(t0.id, 0, epoch=t0.epoch)
        n2.exited(t1.id, 3, epoch=t1.epoch)
        await asyncio.wait_for(reader, timeout=10)
        return lines

    lines = asyncio.run(main())
    # (each with its node, and where its stream stands: mgpu.client.resume's marks)
    assert [{k: line[k] for k in ("s", "d", "t")} for line in lines[:2]] == [
        {"s": "o", "d": "zero-2\n", "t": 0},
        {"s": "o", "d": "one\n", "t": 1},
    ]
    end = lines[2]
    assert (end["end"], end["exit_code"], end["error"]) == (True, 3, None)
    assert [(t["task"], t["exit_code"]) for t in end["tasks"]] == [(0, 0), (1, 3)]
    assert len(lines) == 3
