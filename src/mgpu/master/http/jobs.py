"""The job routes: the queue, one job or array, waiting for jobs, cancel, output.

`POST /api/jobs` (submit) is the lean route of submit.py; hold, release, requeue and
update are jobctl.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import orjson
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from mgpu.master.control.cluster import Cluster, NotFound
from mgpu.master.http.deps import Asker, Ctl, OwnedJob
from mgpu.master.http.follow import JobNews
from mgpu.master.http.follow import follow as follow_output
from mgpu.master.http.queries import (
    ARRAY_TASKS_SHOWN,
    JobFilter,
    array_answer,
    json_in_slices,
    queue_answer,
    states_of,
)
from mgpu.master.runtime.turns import bulk_turn
from mgpu.model import Job
from mgpu.spec import SpecError

__all__ = ["router"]

WAIT_MAX_IDS = 1000
"""Jobs one /api/wait may name (the client splits a longer list into several requests)."""
LOOKUP_SLICE = 100
"""Jobs read or rendered per loop turn by a request that names many."""

router = APIRouter()


class WaitRequest(BaseModel):
    ids: list[str]
    timeout: float = Field(default=30.0, ge=0, le=3600)


@router.get("/api/jobs")
async def queue(
    cl: Ctl,
    all: bool = False,
    limit: int = Query(default=0, ge=0),
    after: str | None = None,
    state: str | None = None,
    user: str | None = None,
    fold: bool = False,
) -> Response:
    """Every active job (`all`: and the last 1,000 ended), in submit order; `limit`
    jobs a page from just `after` the cursor, only those in `state`(s) of `user`."""
    flt = JobFilter(states_of(state), user or None)
    chunks = queue_answer(cl, all, limit, after, flt, fold)
    return StreamingResponse(chunks, media_type="application/json")


@router.get("/api/jobs/{job_id}")
async def show(
    job_id: str,
    cl: Ctl,
    limit: int = Query(default=ARRAY_TASKS_SHOWN, ge=0),
    state: str | None = None,
) -> Response:
    """One job, with the srun steps it ran (`steps`, from the store: queue listings leave
    them out); an array id gives {"array_job_id", "counts" by state, "tasks": the first
    `limit` (0: every one) in `state`(s), "more": how many are not listed}."""
    job = cl.get_job(job_id)
    if job is None:
        text = await array_answer(cl, job_id, limit, JobFilter(states_of(state)))
        if text is None:
            raise NotFound(job_id)
        return Response(text, media_type="application/json")
    body = cl.public_job(job)
    body["steps"] = cl.job_steps([job.id]).get(job.id, [])
    return _json_response(body)


@router.get("/api/jobs/{job_id}/wait")
async def wait(job_id: str, cl: Ctl, timeout: float = Query(default=30.0, ge=0, le=3600)) -> Any:
    """Answer once the job has ended (or after `timeout` seconds, whatever its state)."""
    deadline = time.monotonic() + timeout
    while True:
        job = cl.get_job(job_id)
        if job is None:
            raise NotFound(job_id)
        left = deadline - time.monotonic()
        if job.terminal or left <= 0:
            return _json_response(cl.public_job(job))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cl.job_event(job.id).wait(), timeout=left)


@router.post("/api/wait")
async def wait_many(body: WaitRequest, cl: Ctl) -> Response:
    """Answer once every listed job has ended (or after `timeout` seconds)."""
    if len(body.ids) > WAIT_MAX_IDS:
        raise SpecError(
            f"at most {WAIT_MAX_IDS} job ids per wait ({len(body.ids)} given): "
            "wait for them in several requests"
        )
    deadline = time.monotonic() + body.timeout
    jobs = await _lookup(cl, body.ids)
    # Ended jobs stay ended: only the others are looked at again, in memory.
    waited = [j.id for j in jobs.values() if not j.terminal]
    active = list(waited)
    while active:
        job = cl.get_job(active[-1])
        left = deadline - time.monotonic()
        if job is not None and not job.terminal:
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cl.job_event(job.id).wait(), timeout=left)
            continue
        active.pop()
    jobs.update(await _lookup(cl, waited))
    # Rendered a slice at a time, straight to JSON: FastAPI's own encoder would walk
    # 1,000 jobs in Python in one go.
    parts = []
    for i in range(0, len(body.ids), LOOKUP_SLICE):
        part = [cl.public_job(jobs[j]) for j in body.ids[i : i + LOOKUP_SLICE]]
        parts.append(_json_bytes(part)[1:-1])
        await bulk_turn()
    body_bytes = b'{"jobs": [' + b",".join(p for p in parts if p) + b"]}"
    return Response(body_bytes, media_type="application/json")


@router.post("/api/jobs/{job_id}/cancel")
async def cancel(job_id: str, cl: Ctl, actor: Asker) -> Response:
    # A job, or every task of an array (control/bulk.py).
    done = await cl.cancel_job(job_id, actor)
    if not done.array:
        return JSONResponse(
            {"cancelled": list(done.cancelled), "already_ended": list(done.already_ended)}
        )
    body = {"cancelled": done.cancelled, "already_ended": done.already_ended}
    return Response(await json_in_slices(body), media_type="application/json")


@router.get("/api/jobs/{job_id}/output")
async def output(
    job_id: str,
    cl: Ctl,
    owned: OwnedJob,
    follow: bool = False,
    since: int = Query(default=0, ge=0),
    marks: bool = False,
) -> StreamingResponse:
    # JSON lines (follow.py): its output; `follow`: then its state as it changes, its end.
    # `marks`: and how far its records are stored for good ({"stored": N}: where a client
    # reopens after a failover, client/resume.py).
    job_id = owned(job_id, "read the output of").id  # a task's own number: the task's id
    news = JobNews(cl, job_id) if follow else None
    stream = follow_output(cl, job_id, news, since, ping=b'{"ping":1}\n', stored=marks)
    return StreamingResponse(stream, media_type="application/x-ndjson")


def _json_bytes(body: Any) -> bytes:
    """Jobs as JSON: orjson (ten times quicker than json on them; FastAPI's encoder walks
    each value in Python first); json for what orjson refuses (a lone surrogate)."""
    try:
        return orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(body).encode()


def _json_response(body: Any) -> Response:
    return Response(_json_bytes(body), media_type="application/json")


async def _lookup(cluster: Cluster, ids: list[str]) -> dict[str, Job]:
    """Jobs by id, a slice at a time (one store query each) with the loop free between."""
    found: dict[str, Job] = {}
    for i in range(0, len(ids), LOOKUP_SLICE):
        found.update(cluster.get_jobs(ids[i : i + LOOKUP_SLICE]))
        await bulk_turn()
    for job_id in ids:
        if job_id not in found:
            raise NotFound(job_id)
    return found
