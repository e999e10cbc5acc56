"""One map from the controller's errors to HTTP answers: the same error, the same status,
on every route; the body is always `{"detail": ONE_SENTENCE}`.

| error | status | meaning |
| --- | --- | --- |
| `NotFound` | 404 | no such job, node, step or reservation |
| `NotAllowed` | 403 | not this asker's (audited as `denied`) |
| `Conflict` | 409 | not in the state the request needs (a job ended, a node busy) |
| `SubmitError`, `ReservationRequestError` | 400 | a request that cannot be honoured as asked |
| `BadQuery`, `BadFilter` | 400 | an accounting query or a dashboard filter typed wrong |
| `SpecError`, a pydantic `ValidationError`, `RequestValidationError` | 422 | a malformed value |
| `StoreUnavailable` (`StoreStalled`) | 503 | the database does not answer now; `Retry-After` |

Routes raise; `install` answers.  A WebSocket route, which cannot be answered by an
exception handler before its accept, sends `answer(...)` as its denial response.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from mgpu.master.control.cluster import Conflict, NotFound
from mgpu.master.control.jobctl import NotAllowed
from mgpu.master.control.reservations import ReservationRequestError
from mgpu.master.control.submit import SubmitError
from mgpu.master.http.deps import client_address, cluster, identity
from mgpu.master.http.sentences import validation_sentence
from mgpu.master.monitor.dashboard import BadFilter
from mgpu.master.monitor.observe import BadQuery
from mgpu.master.store.base import RETRY_AFTER_S, StoreUnavailable
from mgpu.spec import SpecError

__all__ = ["STATUS", "answer", "error", "install", "missing"]

STATUS: dict[type[Exception], int] = {
    NotFound: 404,
    NotAllowed: 403,
    Conflict: 409,
    SubmitError: 400,
    ReservationRequestError: 400,
    BadQuery: 400,
    BadFilter: 400,
    SpecError: 422,
    ValidationError: 422,
    RequestValidationError: 422,
    StoreUnavailable: 503,
}


def missing(what: str, name: str) -> NotFound:
    """NotFound saying what was looked for (the default: "no such job or node")."""
    return NotFound(name, what)


def error(status: int, detail: str) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _sentence(exc: Exception) -> str:
    if isinstance(exc, NotFound):
        what = exc.args[1] if len(exc.args) > 1 else "job or node"
        return f"no such {what}: {exc.args[0]}"
    if isinstance(exc, NotAllowed):
        return f"not authorised: {exc}"
    if isinstance(exc, RequestValidationError | ValidationError):
        return validation_sentence(exc)
    return str(exc)


def answer(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    """The answer to `exc` (one of STATUS's); a refusal is written to the audit log."""
    status = next(STATUS[kind] for kind in type(exc).__mro__ if kind in STATUS)
    if isinstance(exc, NotAllowed):
        cluster(conn).audit(
            "denied", identity(conn).user, client_address(conn), exc.target, str(exc)
        )
    return error(status, _sentence(exc))


def install(app: FastAPI) -> None:
    async def handler(conn: HTTPConnection, exc: Exception) -> JSONResponse:
        return answer(conn, exc)

    for kind in STATUS:
        app.add_exception_handler(kind, handler)
