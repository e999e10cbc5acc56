"""The job-control routes: hold, release, requeue and update of a job, or of every queued
or running task of an array (`mgpu hold|release|requeue|update`; master/control/jobctl.py).

`POST /api/jobs/{id}/hold|release|requeue` and `POST /api/jobs/{id}/update` with
`{"time", "priority", "gpus", "name"}` answer `{"jobs": [{"job_id", "changed",
"message"}]}`: `changed` false is a no-op said in `message` (a queued job requeued, a job
not held released).  A job's owner or an admin; a refusal is 409 (the job's state), 400 (an
impossible update, as submit says it), 422 (a malformed value) or 403, one sentence each.
An array's tasks are changed a slice at a time, each slice in one transaction, the
request's one audit event written with the first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from mgpu import spec as specs
from mgpu.master.control.cluster import Cluster, Conflict, NotFound
from mgpu.master.control.jobctl import Actor, Change, NotAllowed
from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.http.sentences import validation_sentence
from mgpu.master.runtime.turns import bulk_turn
from mgpu.master.security.auth import Identity
from mgpu.model import Job

__all__ = ["make_jobctl_router"]

SLICE = 100
"""Tasks of an array changed per transaction, the loop free in between."""


class UpdateRequest(BaseModel):
    """Raw values, checked by the submit rules (so the sentences are submit's)."""

    model_config = ConfigDict(extra="forbid")
    time: Any = None
    priority: Any = None
    gpus: Any = None
    name: Any = None


Action = Callable[[Job, Actor], Awaitable[Change]]


def make_jobctl_router(
    get_cluster: Callable[[], Cluster],
    who: Callable[[Request], Identity],
    deny: Callable[[Request, str, str], HTTPException],
) -> APIRouter:
    router = APIRouter()

    def targets(request: Request, job_id: str, verb: str) -> tuple[list[Job], bool]:
        """The job, or an array's active tasks (and whether it was an array)."""
        cl = get_cluster()
        ident = who(request)
        job = cl.get_job(job_id)
        jobs = [job] if job else cl.active_tasks(job_id) if specs.may_be_array_id(job_id) else []
        if not jobs:
            if job_id and cl.array_tasks(job_id):
                raise Conflict(f"array {job_id} has no queued or running task to {verb}")
            raise NotFound(job_id)
        for j in jobs:
            if not ident.admin and j.user != ident.user:
                raise deny(request, f"{verb} {j.id}", f"job {j.id} belongs to {j.user}")
        return jobs, job is None

    async def act(request: Request, job_id: str, kind: str, action: Action) -> JSONResponse:
        ident = who(request)
        address = request.client.host if request.client else "?"
        done: list[Change] = []
        try:
            jobs, array = targets(request, job_id, kind)
            actor = Actor(ident.user, ident.admin, address, audit=not array)
            for i, job in enumerate(jobs):
                try:
                    done.append(await action(job, actor))
                except Conflict as e:
                    if not array:
                        raise
                    done.append(Change(job.id, False, str(e)))
                if array and (i % SLICE == SLICE - 1 or i == len(jobs) - 1):
                    first = i < SLICE
                    detail = next((c.detail for c in done if c.detail), "")
                    event = (kind, ident.user, address, job_id) if first else None
                    get_cluster().uow.flush(
                        event=event, detail=f"every task of the array {detail}".strip()
                    )
                    await bulk_turn()
        except NotAllowed as e:
            raise deny(request, f"{kind} {job_id}", str(e)) from None
        except Conflict as e:
            return JSONResponse({"detail": str(e)}, status_code=409)
        except SubmitError as e:
            return JSONResponse({"detail": str(e)}, status_code=400)
        rows = [{"job_id": c.job_id, "changed": c.changed, "message": c.message} for c in done]
        return JSONResponse({"jobs": rows})

    @router.post("/api/jobs/{job_id}/hold")
    async def hold(job_id: str, request: Request) -> JSONResponse:
        async def one(job: Job, actor: Actor) -> Change:
            return get_cluster().jobctl.hold(job, actor)

        return await act(request, job_id, "hold", one)

    @router.post("/api/jobs/{job_id}/release")
    async def release(job_id: str, request: Request) -> JSONResponse:
        async def one(job: Job, actor: Actor) -> Change:
            return get_cluster().jobctl.release(job, actor)

        return await act(request, job_id, "release", one)

    @router.post("/api/jobs/{job_id}/requeue")
    async def requeue(job_id: str, request: Request) -> JSONResponse:
        async def one(job: Job, actor: Actor) -> Change:
            return get_cluster().jobctl.requeue(job, actor)

        return await act(request, job_id, "requeue", one)

    @router.post("/api/jobs/{job_id}/update")
    async def update(job_id: str, body: UpdateRequest, request: Request) -> JSONResponse:
        cl = get_cluster()
        try:
            new: JobSpec = cl.jobctl.parse_update(body.time, body.priority, body.gpus, body.name)
        except ValidationError as e:
            return JSONResponse({"detail": validation_sentence(e)}, status_code=422)
        except specs.SpecError as e:
            return JSONResponse({"detail": str(e)}, status_code=422)

        async def one(job: Job, actor: Actor) -> Change:
            return await cl.jobctl.update(job, new, actor)

        return await act(request, job_id, "update", one)

    return router
