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

import json
from array import array
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from mgpu.master.runtime.turns import bulk_turn
from mgpu.master.store import arrays
from mgpu.model import Job, JobState
from mgpu.spec import SpecError

if TYPE_CHECKING:
    from mgpu.master.control.cluster import Cluster

__all__ = [
    "JobFilter",
    "array_answer",
    "json_in_slices",
    "queue_answer",
    "states_of",
]

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


def _after(cl: Cluster, ids: tuple[str, ...], cursor: str | None) -> int:
    """Index in `ids` (the active jobs, in submit order) just after the cursor job; a
    cursor job that has ended since is placed by its submit time."""
    if not cursor:
        return 0
    try:
        return ids.index(cursor) + 1
    except ValueError:
        pass
    gone = cl.get_job(cursor)
    if gone is None:
        return 0
    key = _position(gone)
    for i, job_id in enumerate(ids):
        job = cl.active_job(job_id)
        if job is not None and _position(job) > key:
            return i
    return len(ids)


def _render(jobs: list[Job], public: Callable[[Job], Any]) -> str:
    """Jobs as the text of a JSON list's items (orjson: ten times quicker than json; what it
    refuses, json writes)."""
    items = [public(j) for j in jobs]
    try:
        return orjson.dumps(items).decode()[1:-1]
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(items)[1:-1]


async def _folds(cl: Cluster, ids: tuple[str, ...], flt: JobFilter) -> dict[str, array[int]]:
    """The queued tasks of each array among `ids` (their indices), a slice at a time."""
    folded: dict[str, array[int]] = {}  # array.array: no references, nothing for the collector
    for i in range(0, len(ids), SLICE):
        for job in map(cl.active_job, ids[i : i + SLICE]):
            if job is None or job.array_job_id is None or job.state != JobState.QUEUED:
                continue
            if flt(job):
                folded.setdefault(job.array_job_id, array("q")).append(job.array_task_id or 0)
        await bulk_turn()
    return folded


async def queue_answer(
    cl: Cluster,
    include_finished: bool,
    limit: int,
    after: str | None,
    flt: JobFilter,
    fold: bool = False,
) -> AsyncIterator[bytes]:
    """The JSON of `GET /api/jobs`, streamed a slice at a time: {"jobs": [...], "nodes":
    [...]}, and "next" (the cursor for the next page) when `limit` cut the list short.
    Streamed, so that the master holds a slice, not the whole answer (76 MB for 100,000
    jobs), and a slow reader slows only its own answer.

    What is kept across the slices is ids, never a list of 100,000 jobs: the cyclic
    collector walks every list it tracks (ids in a tuple, it stops tracking)."""
    ids = cl.active_ids()
    ids = ids[_after(cl, ids, after) :]
    folded = await _folds(cl, ids, flt) if fold else {}
    shown: set[str] = set()  # arrays whose folded entry is out

    def public(job: Job) -> dict[str, Any]:
        out = cl.public_job(job)
        indices = folded.get(job.array_job_id or "") if job.state == JobState.QUEUED else None
        if indices is not None:
            out["array_tasks"] = arrays.encode_indices(sorted(indices))
            out["array_count"] = len(indices)
        return out

    def keep(job: Job) -> bool:
        if not flt(job):
            return False
        if fold and job.state == JobState.QUEUED and job.array_job_id in folded:
            if job.array_job_id in shown:
                return False
            shown.add(job.array_job_id)
        return True

    yield b'{"jobs": ['
    first = True
    listed: dict[str, None] = {}  # str keys only: not tracked by the collector either
    more = False
    for i in range(0, len(ids), SLICE):
        jobs = [j for j in map(cl.active_job, ids[i : i + SLICE]) if j is not None and keep(j)]
        if limit and len(listed) >= limit:
            more = bool(jobs)
            if more:
                break
            await bulk_turn()
            continue
        if limit and len(listed) + len(jobs) > limit:
            jobs = jobs[: limit - len(listed)]
            more = True
        if jobs:
            yield (b"" if first else b", ") + _render(jobs, public).encode()
            first = False
            listed.update(dict.fromkeys(j.id for j in jobs))
        await bulk_turn()
        if more:
            break
    if include_finished and not more:
        # A job that ended while the list above was rendered is listed there already.
        finished = cl.finished_jobs(lambda j: j.id not in listed and flt(j))
        for i in range(0, len(finished), SLICE):
            yield (b"" if first else b", ") + _render(
                finished[i : i + SLICE], lambda j: j.to_public()
            ).encode()
            first = False
            await bulk_turn()
    end = f'], "nodes": {json.dumps(cl.nodes_public())}'
    if more:
        end += f', "next": {json.dumps(next(reversed(listed)))}'
    yield (end + "}").encode()


async def array_answer(cl: Cluster, array_id: str, limit: int, flt: JobFilter) -> str | None:
    """The JSON text of `GET /api/jobs/ARRAY_ID`: {"array_job_id", "counts" (tasks by
    state), "tasks" (the first `limit` that pass the filter, 0 = all), "more" (how many
    more pass it)}; None if there is no such array."""
    states: dict[str, str] = {}  # task id -> state, in index order (untracked: strings)
    for rows in cl.array_pages(array_id, 5000):
        for task_id, stored, _ in rows:
            job = cl.active_job(task_id)
            states[task_id] = job.state.value if job is not None else stored
        await bulk_turn()
    if not states:
        return None
    if "" in states.values():  # ended tasks of an array stored as one row: their rows say
        after = ""
        while rows := cl.task_rows(array_id, after, 5000):
            for task_id, stored, _ in rows:
                if states.get(task_id) == "":
                    states[task_id] = stored
            after = rows[-1][0]
            await bulk_turn()
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    wanted = tuple(t for t, s in states.items() if not flt.states or s in flt.states)
    shown = wanted if not limit else wanted[:limit]
    parts = []
    for i in range(0, len(shown), SLICE):
        found = cl.get_jobs(list(shown[i : i + SLICE]))
        parts.append(_render([found[t] for t in shown[i : i + SLICE] if t in found], cl.public_job))
        await bulk_turn()
    text = ", ".join(p for p in parts if p)
    counts_text = json.dumps(dict(sorted(counts.items())))
    return (
        f'{{"array_job_id": {json.dumps(array_id)}, "counts": {counts_text}, '
        f'"tasks": [{text}], "more": {len(wanted) - len(shown)}}}'
    )


def states_of(text: str | None) -> frozenset[str]:
    """`state=queued,running` as a set; an unknown state is refused with one sentence."""
    states = frozenset(filter(None, (text or "").split(",")))
    known = {s.value for s in JobState}
    for name in sorted(states - known):
        raise SpecError(f"state {name!r:.40} is not one of {', '.join(sorted(known))}")
    return states


async def json_in_slices(body: dict[str, Any], size: int = 10000) -> str:
    """`body` as JSON, its lists (of strings) a slice at a time with the loop free between."""
    parts = []
    for key, value in body.items():
        if not isinstance(value, list | tuple):
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
            continue
        pieces = []
        for i in range(0, len(value), size):
            pieces.append(json.dumps(list(value[i : i + size]))[1:-1])
            await bulk_turn()
        parts.append(f"{json.dumps(key)}: [{', '.join(p for p in pieces if p)}]")
    return "{" + ", ".join(parts) + "}"
