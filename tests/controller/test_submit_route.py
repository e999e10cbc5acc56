"""The lean submit route reads and checks a body exactly as FastAPI does for a typed
`spec: JobSpec` parameter (master/http/submit.py): the same answer for every body and
content type, refusals and accepted specs alike, and the same OpenAPI entry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factories import asgi_call, http_scope
from mgpu.config import ClusterConfig
from mgpu.master.control.submit import JobSpec
from mgpu.master.http.app import create_app
from mgpu.master.http.sentences import validation_sentence
from mgpu.master.http.submit import read_spec


def _apps() -> tuple[FastAPI, list[JobSpec], list[JobSpec]]:
    """One app with both routes: /typed (FastAPI's body handling), /lean (read_spec)."""
    app = FastAPI()
    typed: list[JobSpec] = []
    lean: list[JobSpec] = []

    @app.exception_handler(RequestValidationError)
    async def _refused(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_sentence(exc)}, status_code=422)

    @app.post("/typed")
    async def _typed(spec: JobSpec) -> dict[str, bool]:
        typed.append(spec)
        return {"ok": True}

    async def _lean(request: Request) -> JSONResponse:
        lean.append(await read_spec(request))
        return JSONResponse({"ok": True})

    app.add_route("/lean", _lean, methods=["POST"])
    return app, typed, lean


async def _post(app: FastAPI, path: str, body: bytes, content_type: str | None) -> Any:
    headers = {"content-length": str(len(body))}
    if content_type is not None:
        headers["content-type"] = content_type
    return await asgi_call(app, http_scope(path, "POST", headers), body)


def _both(body: bytes, content_type: str | None = "application/json") -> tuple[Any, Any]:
    app, typed, lean = _apps()

    async def main() -> tuple[Any, Any]:
        return (
            await _post(app, "/typed", body, content_type),
            await _post(app, "/lean", body, content_type),
        )

    typed_answer, lean_answer = asyncio.run(main())
    assert typed == lean  # the same spec, field by field, when one was accepted
    return typed_answer, lean_answer


GOOD = b'{"argv": ["true"], "gpus": 1, "env": {"A": "1"}, "cwd": "/tmp"}'

BODIES = [
    b"",
    b"[]",
    b"true",
    b"null",
    b"7",
    b'"text"',
    b'{"command": "true",}',
    b'{"command": "caf\xe9"}',  # not UTF-8
    b'{"command": "\\ud800"}',
    b'{"command": "true", "bogus": 1}',
    b'{"command": "true", "gpus": true}',
    b'{"command": "true", "gpus": NaN}',
    b'{"command": "true", "gpu_share": Infinity}',
    b'{"command": "true", "time": "1:00:00", "priority": "5"}',
    b'{"argv": ["echo", "a\\u0000"]}',
    b'{"command": "true", "env": {"A=B": "x"}}',
    b'{"command": "true", "env": {"path": 3}}',
    b'{"command": "true", "array": "0-3%2"}',
    '{"command": "true"}'.encode("utf-16"),
    GOOD,
]

CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=utf-8",
    "Application/JSON",
    "application/vnd.mgpu+json",
    "application/jsonx",
    "text/plain",
    "multipart/form-data; boundary=x",
    "",
]


def test_every_body_and_content_type_is_answered_as_fastapi_does() -> None:
    for content_type in CONTENT_TYPES:
        for body in BODIES:
            typed, lean = _both(body, content_type)
            assert lean == typed, (content_type, body)
    # The cases are not all alike: some are accepted, some refused for each reason.
    typed, _ = _both(GOOD)
    assert typed == (200, {"ok": True})
    statuses = {_both(body)[0][0] for body in BODIES}
    assert statuses == {200, 400, 422}


FIELDS = ["command", "argv", "gpus", "env", "time", "array", "name", "gpu_share", "nodes"]
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), VALUES, max_size=4) | VALUES
)
def test_any_json_gets_the_answer_fastapi_gives(body: Any) -> None:
    text = json.dumps(body).encode()
    typed, lean = _both(text)
    assert lean == typed, body


def test_the_openapi_document_still_describes_the_typed_submit(tmp_path: Path) -> None:
    schema = create_app(tmp_path, ClusterConfig()).openapi()
    post = schema["paths"]["/api/jobs"]["post"]
    assert post["operationId"] == "submit_api_jobs_post"
    body = post["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/JobSpec"}
    assert "gpus" in schema["components"]["schemas"]["JobSpec"]["properties"]
    assert "get" in schema["paths"]["/api/jobs"]  # the queue, beside it
