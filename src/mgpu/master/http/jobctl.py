"""The job-control routes: hold, release, requeue and update of a job, or of every queued
or running task of an array (`mgpu hold|release|requeue|update`; master/control/jobctl.py).

`POST /api/jobs/{id}/hold|release|requeue` and `POST /api/jobs/{id}/update` with
`{"time", "priority", "gpus", "name"}`, and `POST /api/jobs/{id}/signal` with `{"signal":
"USR1" or 10, "batch_only": bool, "full": bool}` (Slurm's `scancel --signal`, `-b`, `-f`)
answer `{"jobs": [{"job_id", "changed",
"message"}]}`: `changed` false is a no-op said in `message` (a queued job requeued, a job
not held released).  A job's owner or an admin; a refusal is 409 (the job's state), 400 (an
impossible update, as submit says it), 422 (a malformed value) or 403, one sentence each
(errors.py).  An array's tasks are changed by control/bulk.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool

from mgpu.master.control.jobctl import Change, JobControl, SignalAsked, signal_number
from mgpu.master.http.deps import Asker, Ctl

__all__ = ["router"]

router = APIRouter()


class UpdateRequest(BaseModel):
    """Raw values, checked by the submit rules (so the sentences are submit's)."""

    model_config = ConfigDict(extra="forbid")
    time: Any = None
    priority: Any = None
    gpus: Any = None
    name: Any = None
    begin: Any = None
    """Not started before this epoch time (`scontrol update StartTime=`; the client reads
    Slurm's time forms)."""


def _answer(done: list[Change]) -> JSONResponse:
    rows = [{"job_id": c.job_id, "changed": c.changed, "message": c.message} for c in done]
    return JSONResponse({"jobs": rows})


@router.post("/api/jobs/{job_id}/hold")
async def hold(job_id: str, cl: Ctl, actor: Asker) -> JSONResponse:
    return _answer(await cl.control_job(job_id, "hold", actor))


@router.post("/api/jobs/{job_id}/release")
async def release(job_id: str, cl: Ctl, actor: Asker) -> JSONResponse:
    return _answer(await cl.control_job(job_id, "release", actor))


@router.post("/api/jobs/{job_id}/requeue")
async def requeue(job_id: str, cl: Ctl, actor: Asker) -> JSONResponse:
    return _answer(await cl.control_job(job_id, "requeue", actor))


@router.post("/api/jobs/{job_id}/update")
async def update(job_id: str, body: UpdateRequest, cl: Ctl, actor: Asker) -> JSONResponse:
    new = JobControl.parse_update(body.time, body.priority, body.gpus, body.name, body.begin)
    return _answer(await cl.control_job(job_id, "update", actor, new))


class SignalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: str | int
    batch_only: StrictBool = False
    full: StrictBool = False


@router.post("/api/jobs/{job_id}/signal")
async def signal(job_id: str, body: SignalRequest, cl: Ctl, actor: Asker) -> JSONResponse:
    asked = SignalAsked(signal_number(body.signal), body.batch_only, body.full)
    return _answer(await cl.signal_job(job_id, asked, actor))
