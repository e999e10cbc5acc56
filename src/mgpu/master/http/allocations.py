"""The routes of the steps of a running job: `mgpu rsh HOST ARGV` into a job,
`mgpu srun` inside an allocation (`mgpu alloc`), a step's output and its cancel, and an
allocation's end, said by its client (master/control/allocations.py).  The client's one
connection to a terminal or an allocation is attach.py's.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema

from mgpu import execspec, spec
from mgpu.master.control.allocations import StepRequest as AllocStep
from mgpu.master.control.cluster import Conflict
from mgpu.master.control.submit import PtySize
from mgpu.master.http.deps import Asker, Ctl, OwnedJob
from mgpu.master.http.errors import missing
from mgpu.master.http.follow import StepNews, follow

__all__ = ["NodeList", "node_names", "router"]

router = APIRouter()


def _step_host(text: str) -> str:
    spec.validate_text(text, "the step's host")
    return text


class StepRequest(BaseModel):
    """`mgpu rsh HOST ARGV`: argv is checked as a submit's is (UTF-8 without NUL, sizes)."""

    host: Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_step_host)]
    argv: Annotated[list[str], Field(min_length=1), AfterValidator(execspec.validate_argv)]


def node_names(value: Any) -> list[str]:
    """-w: `a,b` or a Slurm host list (`node[001-002]`); none: every node (or the step picks)."""
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise spec.SpecError("--nodelist must be text such as node001,node002")
    spec.validate_text(value, "--nodelist")
    if len(value) > 64 * 1024:
        raise spec.SpecError("--nodelist is too long")
    try:
        return list(spec.parse_node_list(value))
    except spec.SpecError as e:
        raise spec.SpecError(f"--nodelist: {e}") from None


NodeList = Annotated[list[str], PlainValidator(node_names), WithJsonSchema({"type": "string"})]
"""A `--nodelist` field of a request body, given as text."""


class AllocStepBody(BaseModel):
    """`mgpu srun` inside an allocation: what to run, where, and how (checked as a
    submit's fields are)."""

    model_config = ConfigDict(extra="forbid")

    argv: Annotated[list[str], Field(min_length=1), AfterValidator(execspec.validate_argv)]
    env: Annotated[dict[str, str], AfterValidator(execspec.validate_env)] = Field(
        default_factory=dict
    )
    cwd: Annotated[str, AfterValidator(execspec.validate_cwd)] | None = None
    nodelist: NodeList = Field(default_factory=list)
    """Only these of the allocation's nodes (`-w`, a,b or node[001-002]); none: all."""
    pty: bool = False
    pty_size: PtySize = None


class EndBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int = Field(ge=0, le=255)


@router.post("/api/jobs/{job_id}/steps")
async def start_step(job_id: str, body: StepRequest, cl: Ctl, owned: OwnedJob) -> JSONResponse:
    """Start a process inside a running job's allocation (used by `mgpu rsh`)."""
    owned(job_id, "rsh into")
    step = cl.start_step(job_id, body.host, body.argv)
    return JSONResponse({"step_id": step.id}, status_code=201)


@router.get("/api/steps/{step_id}/output")
async def step_output(
    step_id: str, cl: Ctl, owned: OwnedJob, since: int = Query(default=0, ge=0)
) -> StreamingResponse:
    # JSON lines: its output, then {"end": true, "exit_code": ...}.  `since`: the records a
    # client that reconnects (another master took over) already has.
    step = cl.step(step_id)
    if step is None:
        raise missing("job or node", step_id)
    owned(step.job_id, "read the output of")
    stream = follow(cl, step.id, StepNews(step), since=since)
    return StreamingResponse(stream, media_type="application/x-ndjson")


@router.post("/api/steps/{step_id}/cancel")
async def cancel_step(step_id: str, cl: Ctl, actor: Asker) -> JSONResponse:
    step = cl.step(step_id)
    job = cl.get_job(step.job_id) if step is not None else None
    if step is None or job is None:
        raise missing("step", step_id)
    actor.owns(job, "cancel")
    return JSONResponse({"cancelled": cl.cancel_step(step, actor)})


@router.post("/api/allocations/{job_id}/steps", name="start_step")
async def start_alloc_step(
    job_id: str, body: AllocStepBody, cl: Ctl, owned: OwnedJob
) -> JSONResponse:
    """`mgpu srun` inside an allocation: a step on its nodes and GPUs."""
    actor = owned.actor
    owned(job_id, "start a step in")
    req = AllocStep(
        argv=body.argv,
        env=body.env,
        cwd=body.cwd,
        nodes=body.nodelist,
        pty=body.pty,
        pty_size=body.pty_size,
    )
    step = cl.start_alloc_step(job_id, req, actor)
    return JSONResponse({"step_id": step.id, "nodes": step.on_nodes}, status_code=201)


@router.post("/api/allocations/{job_id}/end")
async def end(job_id: str, body: EndBody, cl: Ctl, actor: Asker) -> JSONResponse:
    """The allocation's command ended (its client says so, with the exit code)."""
    job = cl.get_job(job_id)
    if job is None:
        raise missing("job or node", job_id)
    if job.kind != "allocation":
        raise Conflict(f"job {job_id} is not an allocation (mgpu alloc)")
    actor.owns(job, "end")
    ended = cl.end_allocation(job, body.exit_code, actor)
    job = cl.get_job(job_id) or job
    return JSONResponse({"ended": ended, "state": job.state.value})
