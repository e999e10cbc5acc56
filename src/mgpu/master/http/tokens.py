"""Who am I, the token routes and the audit log (admins; `mgpu token`, `mgpu audit`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from mgpu.master.control.jobctl import NotAllowed
from mgpu.master.http.deps import Asker, Ctl, Edge, Ident
from mgpu.master.http.errors import error, missing
from mgpu.safetext import escape_optional

__all__ = ["router"]

router = APIRouter()


class TokenRequest(BaseModel):
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
    admin: bool = False
    allow_root: bool = False


@router.get("/api/whoami")
async def whoami(ident: Ident) -> dict[str, Any]:
    return {"user": ident.user, "admin": ident.admin}


@router.post("/api/tokens")
async def token_create(body: TokenRequest, cl: Ctl, ident: Ident, actor: Asker) -> JSONResponse:
    actor.check_admin("token create")
    if body.allow_root:
        if not ident.owner:
            raise NotAllowed("only the owner's admin-token grants root", "token create")
        if not cl.config.security.allow_root_jobs:
            return error(
                400,
                "root grants are off: set security.allow_root_jobs: true in the cluster "
                "config to allow --allow-root tokens",
            )
    elif (reserved := cl.root_name(body.user)) is not None:
        why = f"{body.user} is {reserved}: a token for it needs --allow-root (owner only)"
        raise NotAllowed(why, "token create")
    token_id, token = cl.create_token(body.user, body.admin, body.allow_root, actor)
    return JSONResponse({"user": body.user, "token": token, "id": token_id}, status_code=201)


@router.get("/api/tokens")
async def token_list(cl: Ctl, actor: Asker) -> dict[str, Any]:
    actor.check_admin("token list")
    return {"tokens": cl.list_tokens()}


@router.delete("/api/tokens/{token_id}")
async def token_revoke(token_id: str, cl: Ctl, ident: Ident, actor: Asker) -> dict[str, Any]:
    actor.check_admin("token revoke")
    guarded = cl.token_guarded(token_id)
    if guarded is not None and not ident.owner:
        why = f"only the cluster's owner may revoke {guarded}"
        raise NotAllowed(why, f"token revoke {token_id}")
    if not cl.revoke_token(token_id, actor):
        raise missing("job or node", token_id)
    return {"revoked": token_id}


@router.get("/api/audit")
async def audit(
    cl: Ctl, edge: Edge, actor: Asker, since: float = Query(default=0.0, ge=0)
) -> dict[str, Any]:
    actor.check_admin("audit")
    edge.flush()  # the refused logins and hellos counted so far, written now
    return {"events": [_shown_event(e) for e in cl.audit_events(since)]}


AUDIT_TEXT_FIELDS = ("actor", "address", "target", "detail")


def _shown_event(event: dict[str, Any]) -> dict[str, Any]:
    """An audit row with its text escaped (mgpu.safetext): a refused request's path, a
    node's id or a refusal's sentence is whatever a client sent (`GET /%1b]0;x%07`), and
    an admin reads these in a terminal, through `jq -r` as well as `mgpu audit`."""
    for key in AUDIT_TEXT_FIELDS:
        event[key] = escape_optional(event[key])
    return event
