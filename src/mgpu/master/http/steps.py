"""The routes of `srun` inside a job: Slurm's steps (master/control/srun.py).

`POST /api/jobs/{id}/srun` starts a step of tasks in the running job `id` (a batch job,
an allocation): 201 `{"step_id", "slurm_step": "ID.N", "tasks": [{"task", "node_id",
"host", "run_id"}], "warnings"}` (a task's `gpu_bind`: its `--gpu-bind=verbose,`
line); a step the job cannot hold is 400 with srun's sentence
(`Unable to create step for job 12: More processors requested than permitted`), a job
that is not running 409.

`GET /api/sruns/{step_id}/output` follows it, NDJSON: output records of its tasks as they
come (`{"s", "d", "t"}`, `t` the task's SLURM_PROCID), then `{"end": true, "exit_code",
"error", "tasks": [{"task", "host", "exit_code", "error"}]}`.  `POST /api/sruns/{step_id}/cancel`
kills its tasks (srun's Ctrl-C).  The job's owner or an admin.  `?since=N,M,...`: the
records of each task (in the order of `tasks`) the client already has, so that one that
reconnects (the master restarted, another took over) gets none twice.

`GET /api/sruns?jobs=ID,ID,...` lists the steps those jobs ran that ended (`sacct`'s
`ID.0`, `ID.1`, ...), read from the store (store/steps.py), so any master lists them:
`{"steps": {"ID": [{"number", "name", "start", "end", "exit_code", "state", "nodes",
"ntasks"}, ...]}}`, oldest first; jobs without any are left out.  Queue listings never
carry them; one job's detail (`GET /api/jobs/{id}`) does.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from mgpu import execspec
from mgpu.containeropts import ContainerOptions
from mgpu.master.control.cluster import Cluster
from mgpu.master.control.srun import SrunRequest
from mgpu.master.control.submit import PtySize
from mgpu.master.http.allocations import NodeList
from mgpu.master.http.deps import Ctl, JobAccess, OwnedJob
from mgpu.master.http.errors import missing
from mgpu.master.http.follow import SrunNews, Tail, follow_tails
from mgpu.master.state.steps import TaskStep

__all__ = ["router"]

MAX_TASKS = 4096
"""Tasks in one step: more than any job here holds GPUs or nodes for."""

Count = Annotated[int, Field(ge=1, le=MAX_TASKS)]

router = APIRouter()


class SrunBody(BaseModel):
    """`srun` inside a job: what to run, and its tasks' layout (srun's options)."""

    model_config = ConfigDict(extra="forbid")

    argv: Annotated[list[str], Field(min_length=1), AfterValidator(execspec.validate_argv)]
    env: Annotated[dict[str, str], AfterValidator(execspec.validate_env)] = Field(
        default_factory=dict
    )
    cwd: Annotated[str, AfterValidator(execspec.validate_cwd)] | None = None
    nodes: Count | None = None
    ntasks: Count | None = None
    ntasks_per_node: Count | None = None
    nodelist: NodeList = Field(default_factory=list)
    gpus_per_task: Annotated[int, Field(ge=1, le=1024)] | None = None
    cpus_per_task: Annotated[int, Field(ge=1, le=MAX_TASKS)] | None = None
    """`srun -c N`: each task's CPUs, within what the job holds on its node."""
    gpu_bind: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    kill_on_bad_exit: bool = False
    pty: bool = False
    pty_size: PtySize = None
    image: Annotated[str, AfterValidator(execspec.validate_image)] | None = None
    """The tasks run in this image (pyxis's `--container-image`), with `container`'s options."""
    container: ContainerOptions | None = None

    @model_validator(mode="after")
    def _container_needs_image(self) -> SrunBody:
        if self.container is not None and self.image is None:
            raise ValueError("container options need an image (--container-image)")
        if self.image is not None and self.pty:
            raise ValueError("--pty does not work with an image: container steps get no terminal")
        return self


@router.post("/api/jobs/{job_id}/srun")
async def start(job_id: str, body: SrunBody, cl: Ctl, owned: OwnedJob) -> JSONResponse:
    """`srun` inside the job: a step of tasks on its nodes and GPUs."""
    owned(job_id, "start a step in")
    req = SrunRequest(
        argv=body.argv,
        env=body.env,
        cwd=body.cwd,
        nodes=body.nodes,
        ntasks=body.ntasks,
        ntasks_per_node=body.ntasks_per_node,
        nodelist=body.nodelist,
        gpus_per_task=body.gpus_per_task,
        cpus_per_task=body.cpus_per_task,
        gpu_bind=body.gpu_bind,
        kill_on_bad_exit=body.kill_on_bad_exit,
        pty=body.pty,
        pty_size=body.pty_size,
        image=body.image,
        container=body.container,
    )
    group, warnings = cl.start_srun(job_id, req, owned.actor)
    tasks = [
        {"task": t.task, "node_id": t.node_id, "host": t.host, "run_id": t.id}
        | ({"gpu_bind": t.bind_note} if t.bind_note else {})
        for t in group.tasks
    ]
    answer = {
        "step_id": group.id,
        "slurm_step": f"{group.job_id}.{group.number}",
        "tasks": tasks,
        "warnings": warnings,
    }
    return JSONResponse(answer, status_code=201)


MAX_JOBS = 1000
"""Jobs one `GET /api/sruns` may name (sacct asks a slice at a time)."""


@router.get("/api/sruns")
async def ended(cl: Ctl, jobs: str = "") -> dict[str, Any]:
    """The ended srun steps of these jobs, oldest first (jobs with none left out)."""
    ids = [i for i in dict.fromkeys(jobs.split(",")) if i]
    if len(ids) > MAX_JOBS:
        raise HTTPException(400, f"jobs: at most {MAX_JOBS} ids per request ({len(ids)} given)")
    return {"steps": cl.job_steps(ids)}


def _group(cl: Cluster, owned: JobAccess, step_id: str, verb: str) -> TaskStep:
    group = cl.srun_step(step_id)
    if group is None or cl.get_job(group.job_id) is None:
        raise missing("step", step_id)
    owned(group.job_id, verb)
    return group


@router.get("/api/sruns/{step_id}/output")
async def output(step_id: str, cl: Ctl, owned: OwnedJob, since: str = "") -> StreamingResponse:
    group = _group(cl, owned, step_id, "read the output of")
    try:
        counts = [int(n) for n in since.split(",") if n.strip()] if since else []
    except ValueError:
        counts = [-1]
    if len(counts) > len(group.tasks) or any(n < 0 for n in counts):
        raise HTTPException(400, "since: one count of records per task, none negative")
    counts += [0] * (len(group.tasks) - len(counts))
    # Every task's records as they come, each marked with its task; then the end.
    tails = [
        Tail(t.id, n, functools.partial(_marked, task=t.task))
        for t, n in zip(group.tasks, counts, strict=True)
    ]
    feed = follow_tails(cl, tails, SrunNews(group))
    return StreamingResponse(feed, media_type="application/x-ndjson")


@router.post("/api/sruns/{step_id}/cancel")
async def cancel(step_id: str, cl: Ctl, owned: OwnedJob) -> dict[str, Any]:
    group = _group(cl, owned, step_id, "cancel")
    return {"cancelled": cl.cancel_srun(group, owned.actor)}


def _marked(chunk: bytes, task: int) -> bytes:
    """Stored records as the step's: each one's stream and text, and its task; with where
    its run's stream stands (`ep`, `n`, `at`, as the store has them), so that a client
    that reconnects to another master shows none of it twice (mgpu.client.resume)."""
    records = (json.loads(raw) for raw in chunk.splitlines())
    marked = (
        {"s": rec["s"], "d": rec["d"], "t": task}
        | {k: rec[k] for k in ("ep", "n", "at") if k in rec}
        for rec in records
    )
    return "".join(json.dumps(m, separators=(",", ":")) + "\n" for m in marked).encode()
