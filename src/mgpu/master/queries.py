"""Queries whose cost does not hold the event loop, however long the queue.

`GET /api/jobs` (what `mgpu queue` reads) and `GET /api/jobs/ARRAY_ID` can name 100,000
jobs.  Both are rendered here a slice at a time, straight to JSON text, with the loop free
between slices; both take a page size (`limit`), a cursor (`after`: the last job id of the
previous page) and filters (`state`, `user`), so a client can ask for what it shows.
Asked without a limit, `/api/jobs` still lists every job, as the contract says.

`fold` gives the queue as `mgpu queue` prints it: the queued tasks of an array as one entry
(the first of them, with `array_tasks`: their indices as ranges, and `array_count`), as
squeue does; the JSON of `mgpu queue --json` is never folded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mgpu.master import arrays
from mgpu.model import Job, JobState

if TYPE_CHECKING:
    from mgpu.master.cluster import Cluster

__all__ = ["JobFilter", "array_answer", "queue_answer"]

SLICE = 500
"""Jobs rendered per turn of the event loop (a few milliseconds)."""
ARRAY_TASKS_SHOWN = 1000
"""Tasks `GET /api/jobs/ARRAY_ID` lists unless asked for another number (0: all)."""


@dataclass(frozen=True)
class JobFilter:
    states: frozenset[str] = frozenset()
    """Only jobs in these states (empty: any)."""
    user: str | None = None

    def __call__(self, job: Job) -> bool:
        if self.states and job.state.value not in self.states:
            return False
        return self.user is None or job.user == self.user


def _position(job: Job) -> tuple[float, int]:
    """Where a job stands in submit order (the tasks of an array share a submit time)."""
    return job.submit_time, -1 if job.array_task_id is None else job.array_task_id


def _after(cl: Cluster, jobs: Sequence[Job], cursor: str | None) -> int:
    """Index in `jobs` (the active ones, in submit order) just after the cursor job; a
    cursor job that has ended since is placed by its submit time."""
    if not cursor:
        return 0
    for i, job in enumerate(jobs):
        if job.id == cursor:
            return i + 1
    gone = cl.get_job(cursor)
    if gone is None:
        return 0
    key = _position(gone)
    return next((i for i, job in enumerate(jobs) if _position(job) > key), len(jobs))


async def _render(cl: Cluster, jobs: Sequence[Job], public: Callable[[Job], Any]) -> str:
    """Jobs as the text of a JSON list's items, a slice at a time."""
    parts = []
    for i in range(0, len(jobs), SLICE):
        part = json.dumps([public(j) for j in jobs[i : i + SLICE]])[1:-1]
        if part:
            parts.append(part)
        await asyncio.sleep(0)
    return ", ".join(parts)


def _fold(jobs: Iterable[Job]) -> tuple[list[Job], dict[str, list[int]]]:
    """Queued tasks of an array as one entry (their first), with the indices folded in."""
    out: list[Job] = []
    folded: dict[str, list[int]] = {}
    for job in jobs:
        array_id = job.array_job_id
        if array_id is not None and job.state == JobState.QUEUED:
            indices = folded.get(array_id)
            if indices is not None:
                indices.append(job.array_task_id or 0)
                continue
            folded[array_id] = [job.array_task_id or 0]
        out.append(job)
    return out, folded


async def queue_answer(
    cl: Cluster,
    include_finished: bool,
    limit: int,
    after: str | None,
    flt: JobFilter,
    fold: bool = False,
) -> str:
    """The JSON text of `GET /api/jobs`: {"jobs": [...], "nodes": [...]}, and "next" (the
    cursor for the next page) when `limit` cut the list short."""
    active = list(cl.jobs.values())
    start = _after(cl, active, after)
    chosen: list[Job] = []
    more = False
    for i in range(start, len(active), SLICE):
        chosen += filter(flt, active[i : i + SLICE])
        if limit and len(chosen) > limit:
            more = True
            break
        await asyncio.sleep(0)
    del chosen[limit if limit and more else len(chosen) :]
    listed = {j.id for j in chosen}
    folded: dict[str, list[int]] = {}
    if fold:
        chosen, folded = _fold(chosen)

    def public(job: Job) -> dict[str, Any]:
        out = cl.public_job(job)
        indices = folded.get(job.array_job_id or "") if job.state == JobState.QUEUED else None
        if indices is not None:
            out["array_tasks"] = arrays.encode_indices(sorted(indices))
            out["array_count"] = len(indices)
        return out

    text = await _render(cl, chosen, public)
    if include_finished and not more:
        # A job that ended while the list above was rendered is listed there already.
        finished = cl.finished_jobs(lambda j: j.id not in listed and flt(j))
        ended = await _render(cl, finished, lambda j: j.to_public())
        text = ", ".join(p for p in (text, ended) if p)
    body = f'{{"jobs": [{text}], "nodes": {json.dumps(cl.nodes_public())}'
    if more:
        body += f', "next": {json.dumps(chosen[-1].id)}'
    return body + "}"


async def array_answer(cl: Cluster, array_id: str, limit: int, flt: JobFilter) -> str | None:
    """The JSON text of `GET /api/jobs/ARRAY_ID`: {"array_job_id", "counts" (tasks by
    state), "tasks" (the first `limit` that pass the filter, 0 = all), "more" (how many
    more pass it)}; None if there is no such array."""
    states: dict[str, str] = {}  # task id -> state, in index order
    for rows in cl.array_pages(array_id, 5000):
        for task_id, stored, _ in rows:
            job = cl.active_job(task_id)
            states[task_id] = job.state.value if job is not None else stored
        await asyncio.sleep(0)
    if not states:
        return None
    unknown = [t for t, s in states.items() if not s]  # ended tasks of a one-row array
    if unknown:
        stored_states: dict[str, str] = {}
        after = ""
        while rows := cl.store.job_rows_with_prefix(array_id + "_", after, 5000):
            stored_states.update((r[0], r[1]) for r in rows)
            after = rows[-1][0]
            await asyncio.sleep(0)
        for task_id in unknown:
            states[task_id] = stored_states.get(task_id, "unknown")
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    wanted = [t for t, s in states.items() if not flt.states or s in flt.states]
    shown = wanted if not limit else wanted[:limit]
    jobs: list[Job] = []
    for i in range(0, len(shown), SLICE):
        found = cl.get_jobs(shown[i : i + SLICE])
        jobs += (found[t] for t in shown[i : i + SLICE] if t in found)
        await asyncio.sleep(0)
    text = await _render(cl, jobs, cl.public_job)
    counts_text = json.dumps(dict(sorted(counts.items())))
    return (
        f'{{"array_job_id": {json.dumps(array_id)}, "counts": {counts_text}, '
        f'"tasks": [{text}], "more": {len(wanted) - len(shown)}}}'
    )
