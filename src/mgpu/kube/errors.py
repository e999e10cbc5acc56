"""What a Kubernetes API call that failed becomes: one exception, one sentence.

The API server answers a refused call with a `Status` object (`reason`, `message`, `code`,
and for invalid objects `details.causes`); a call that never reached it fails in httpx.
Both are turned into a :class:`KubeError` subclass here, so callers catch the cases they
handle (a 409 on create, a 410 on a watch) by type and show the rest as they are."""

from __future__ import annotations

from typing import Any

from mgpu.errors import MgpuError


class KubeError(MgpuError):
    """A Kubernetes API call failed; `str()` is one sentence.  `code` is the HTTP status
    (None: no answer), `reason` the Status reason (`Forbidden`, `AlreadyExists`, ...)."""

    code: int | None = None

    def __init__(self, message: str, reason: str = "", causes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.reason = reason
        self.causes = causes


class KubeUnreachable(KubeError):
    """No answer: connection refused or reset, TLS failure, timeout."""


class KubeUnauthorized(KubeError):
    """401: the credentials were not accepted."""

    code = 401


class KubeForbidden(KubeError):
    """403: authenticated, but RBAC (or an admission plugin) refuses the call."""

    code = 403


class KubeNotFound(KubeError):
    """404: no such object (or namespace)."""

    code = 404


class KubeConflict(KubeError):
    """409: the object already exists, or a write raced another one."""

    code = 409


class KubeGone(KubeError):
    """410: a watch's resourceVersion is too old; list again."""

    code = 410


class KubeInvalid(KubeError):
    """422: the object was refused by validation; `causes` has one sentence per field."""

    code = 422


_BY_CODE: dict[int, type[KubeError]] = {
    cls.code: cls
    for cls in (KubeUnauthorized, KubeForbidden, KubeNotFound, KubeConflict, KubeGone, KubeInvalid)
    if cls.code is not None
}


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith(".") else text + "."


def from_status(code: int, status: Any, doing: str) -> KubeError:
    """The exception for an HTTP error answer whose body is `status` (a decoded Status
    object, or anything else when the server sent none); `doing` names the call."""
    cls = _BY_CODE.get(code, KubeError)
    reason, message = "", ""
    causes: tuple[str, ...] = ()
    if isinstance(status, dict):
        reason = str(status.get("reason") or "")
        message = str(status.get("message") or "")
        details = status.get("details") or {}
        raw_causes = details.get("causes") if isinstance(details, dict) else None
        if isinstance(raw_causes, list):
            causes = tuple(
                _sentence(f"{c.get('field', '')}: {c.get('message', '')}".lstrip(": "))
                for c in raw_causes
                if isinstance(c, dict)
            )
    if not message:
        message = f"HTTP {code}"
    error = cls(_sentence(f"Kubernetes refused to {doing}: {message}"), reason, causes)
    if cls is KubeError:
        error.code = code
    return error


def _refused(exc: BaseException | None) -> bool:
    """Whether a connection was refused somewhere in `exc`'s chain of causes."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ConnectionRefusedError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def unreachable(server: str, doing: str, exc: BaseException) -> KubeUnreachable:
    """The exception for a call that got no answer from `server`."""
    what = str(exc).strip() or type(exc).__name__
    lowered = what.lower()
    if _refused(exc) or "connection refused" in lowered:
        what = "connection refused"
    elif "timed out" in lowered or "timeout" in type(exc).__name__.lower():
        what = "no answer in time"
    return KubeUnreachable(
        _sentence(f"Cannot {doing}: the Kubernetes API server at {server} gave no answer ({what})")
    )
