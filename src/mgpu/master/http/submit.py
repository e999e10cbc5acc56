"""`POST /api/jobs` without FastAPI's per-request machinery.

Submitting is the master's hottest request: FastAPI's dependency solving, its body
handling and its response wrapping cost about as much as the submit itself.  So the route
is a plain Starlette one: it reads the body (through `Guard`, which has already checked
the token and bounds the size), parses and checks it exactly as FastAPI does for a
`spec: JobSpec` parameter (`read_spec`: the same JSON parser, the same content-type rule,
the same validation in Python mode, the same errors, so the same one sentence), and
answers the same JSON.  Its OpenAPI entry is still FastAPI's, built from `documented`
(`_document`): the API's published shape does not change.
"""

from __future__ import annotations

import email.message
import json
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.responses import Response

from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.http.deps import cluster, submitter
from mgpu.master.http.queries import json_in_slices

__all__ = ["SUBMIT_PATH", "install_submit", "read_spec"]

SUBMIT_PATH = "/api/jobs"

SPEC: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)
"""Built once: what FastAPI's ModelField for a `JobSpec` body does per request."""


def _is_json(content_type: str) -> bool:
    """FastAPI's rule: application/json or application/*+json, parameters allowed."""
    if content_type == "application/json":  # what every client sends: no parsing
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


async def read_spec(request: Request) -> JobSpec:
    """The body as a checked `JobSpec`, or RequestValidationError / HTTPException(400) with
    the errors FastAPI gives for a `spec: JobSpec` body parameter (its strict content
    type included: a body not declared JSON is validated as bytes, and refused)."""
    body = await request.body()
    if not body:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    value: Any = body
    content_type = request.headers.get("content-type")
    if content_type and _is_json(content_type):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as e:
            error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error"}
            raise RequestValidationError([{**error, "input": {}, "ctx": {"error": e.msg}}]) from e
        except Exception as e:  # bytes that are not UTF-8 (nor UTF-16/32)
            raise HTTPException(400, "There was an error parsing the body") from e
    try:
        return SPEC.validate_python(value, from_attributes=True)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def install_submit(app: FastAPI) -> None:
    """Route POST /api/jobs to the lean endpoint; document it as the typed one."""

    async def submit(request: Request) -> Response:
        """Queue a job: `spec` is checked field by field (`mgpu.master.control.submit`)."""
        spec = await read_spec(request)
        cl = cluster(request)
        who = submitter(request, spec.user)  # NotAllowed: errors.py's 403, audited
        try:
            key = request.headers.get("idempotency-key")  # the same submit sent again
            result = await cl.submit(
                spec, who.user, address=who.address, allow_root=who.allow_root, key=key
            )
        except SubmitError as e:
            cl.audit("submit_refused", who.user, who.address, detail=str(e))
            raise
        if result.task_ids is None and not result.dropped_env and not result.warnings:
            text = json.dumps({"job_id": result.job_id})
        else:
            body: dict[str, Any] = {"job_id": result.job_id}
            if result.task_ids is not None:
                body["task_ids"] = result.task_ids  # a tuple: the collector leaves it alone
            if result.dropped_env:  # set by the scheduler itself: said once, not passed
                body["dropped_env"] = result.dropped_env
            if result.warnings:  # e.g. an unknown partition, ignored
                body["warnings"] = result.warnings
            text = await json_in_slices(body)  # 100,000 task ids are not encoded in one go
        return Response(text, status_code=201, media_type="application/json")

    app.add_route(SUBMIT_PATH, submit, methods=["POST"], include_in_schema=False)
    _document(app)


def _documented(spec: JobSpec, request: Request) -> Response:
    """Queue a job: `spec` is already checked field by field (`mgpu.master.control.submit`)."""
    raise NotImplementedError  # never routed: make_submit_route's endpoint answers


def _document(app: FastAPI) -> None:
    """The OpenAPI document as FastAPI would write it with the typed submit route in
    place of the lean one (built once, at the first request for it)."""
    documented = APIRoute(SUBMIT_PATH, _documented, methods=["POST"], name="submit")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            routes = list(app.routes)
            at = next(
                (i for i, r in enumerate(routes) if getattr(r, "path", None) == SUBMIT_PATH), 0
            )
            routes.insert(at, documented)
            app.openapi_schema = get_openapi(
                title=app.title,
                version=app.version,
                openapi_version=app.openapi_version,
                summary=app.summary,
                description=app.description,
                routes=routes,
                servers=app.servers,
                separate_input_output_schemas=app.separate_input_output_schemas,
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
