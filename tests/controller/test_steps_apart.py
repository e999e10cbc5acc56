"""A srun step's end is one row of its own (store/steps.py), not a rewrite of its job's
record: the job's row is not written at a step's end, queue listings carry no steps, and
a master that takes over reads them back and numbers on from them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harness import Harness

from mgpu.master.control.srun import SrunRequest
from mgpu.master.http.queries import JobFilter, queue_answer
from mgpu.master.store.steps import STEPS_KEPT


def _batch(h: Harness) -> str:
    """A batch job on n1 and n2, started (its script on n1)."""
    job_id = h.submit("sleep 100", nodes=2, gpus_per_node=2, slurm={"batch": True})
    h.tick()
    if h.agents["n1"].port_requests():
        h.agents["n1"].port(job_id)
    h.agents["n1"].started(job_id)
    return job_id


def _step(h: Harness, job_id: str, code: int = 0) -> Any:
    """One srun step of a task a node, run to its end with `code`."""
    group, _ = h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["hostname"], env={}))
    h.settle()
    for task in group.tasks:
        h.agents[task.node_id].exited(task.id, code, epoch=task.epoch)
    assert group.done
    return group


def _jobs_written(h: Harness) -> list[str]:
    """The ids of every job row the store writes from now on."""
    written: list[str] = []
    save_jobs = h.store.save_jobs

    def counting(jobs: list[Any], *args: Any, **kw: Any) -> None:
        written.extend(job.id for job in jobs)
        save_jobs(jobs, *args, **kw)

    h.store.save_jobs = counting  # type: ignore[method-assign]
    return written


def _listing(h: Harness) -> bytes:
    async def main() -> bytes:
        chunks = queue_answer(h.cl, True, 0, None, JobFilter())
        return b"".join([chunk async for chunk in chunks])

    return asyncio.run(main())


def test_a_steps_end_is_a_row_of_its_own_and_listings_leave_steps_out(h: Harness) -> None:
    h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    written = _jobs_written(h)
    for i in range(30):
        _step(h, job_id, code=i % 2)
    assert job_id not in written  # 30 step ends, and the job's row never written again
    steps = h.cl.job_steps([job_id])[job_id]
    assert [(s["number"], s["exit_code"], s["state"]) for s in steps[:2]] == [
        (0, 0, "completed"),
        (1, 1, "failed"),
    ]
    assert [s["number"] for s in steps] == list(range(30))
    ((record,),) = h.sql("SELECT record FROM jobs WHERE id=?", (job_id,))
    assert "steps" not in json.loads(record)
    listing = json.loads(_listing(h))
    (listed,) = [j for j in listing["jobs"] if j["id"] == job_id]
    assert "steps" not in listed and "steps" not in h.cl.public_job(h.job(job_id))


def test_a_master_that_takes_over_lists_the_steps_and_numbers_on(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    for _ in range(3):
        _step(h, job_id)
    h.crash()  # another master on the same store: what it knows of the steps is stored
    n1.hello([n1.running(job_id)])
    n2.hello([])
    assert [s["number"] for s in h.cl.job_steps([job_id])[job_id]] == [0, 1, 2]
    assert _step(h, job_id).number == 3  # not 0 again: sacct's ID.3
    assert [s["number"] for s in h.cl.job_steps([job_id])[job_id]] == [0, 1, 2, 3]


def test_a_job_keeps_its_last_steps_only(h: Harness) -> None:
    h.agent("n1"), h.agent("n2")
    job_id = _batch(h)
    rows = [(job_id, {"number": n, "name": "x"}) for n in range(STEPS_KEPT)]
    h.store.save_steps(rows)
    _step(h, job_id)  # numbered on from the stored ones, the oldest pruned
    numbers = [s["number"] for s in h.cl.job_steps([job_id])[job_id]]
    assert numbers == list(range(1, STEPS_KEPT + 1))
