"""The reservation routes (`mgpu reserve`): create, list and delete, admins only for changes.

The cluster does the work (master/control/reservations.py).  A request that cannot be
honoured gets one sentence and a 400 (errors.py), and nothing is stored; every change is
audited (in the same transaction as the change).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from mgpu.master.http.deps import Asker, Ctl
from mgpu.master.http.errors import missing

__all__ = ["ReservationRequest", "router"]


class ReservationRequest(BaseModel):
    """What `mgpu reserve create` sends; times as the contract writes them (`now`,
    `now+MINUTES`, an ISO time) or epoch seconds, the length as `duration` or `end`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    gpus: int = Field(ge=1, le=100000)
    nodelist: str | None = Field(default=None, max_length=65536)
    start: str | float = "now"
    end: str | float | None = None
    duration: str | None = Field(default=None, max_length=64)
    users: list[str] | str | None = None
    ignore_jobs: bool = False


router = APIRouter()


@router.get("/api/reservations")
async def reservation_list(cl: Ctl) -> dict[str, Any]:
    return {"reservations": cl.list_reservations()}


@router.post("/api/reservations")
async def reservation_create(body: ReservationRequest, cl: Ctl, actor: Asker) -> JSONResponse:
    actor.check_admin("reserve create")
    made = cl.create_reservation(body.model_dump(), actor=actor.user, address=actor.address)
    return JSONResponse(made, status_code=201)


@router.delete("/api/reservations/{name}")
async def reservation_delete(name: str, cl: Ctl, actor: Asker) -> JSONResponse:
    actor.check_admin("reserve delete")
    if not cl.delete_reservation(name, actor=actor.user, address=actor.address):
        raise missing("reservation", name)
    return JSONResponse({"deleted": name})
