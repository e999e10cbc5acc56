"""The reservation routes (`mgpu reserve`): create, list and delete, admins only for changes.

`create_app` includes the router; the cluster does the work (master/control/reservations.py).  A
request that cannot be honoured gets one sentence and a 400, and nothing is stored; every
change is audited (in the same transaction as the change).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from mgpu.master.control.cluster import Cluster
from mgpu.master.control.reservations import ReservationRequestError
from mgpu.master.security.auth import Identity

__all__ = ["ReservationRequest", "make_reserve_router"]


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


def make_reserve_router(
    cluster: Callable[[], Cluster],
    require_admin: Callable[[Request, str], Identity],
    address: Callable[[Request], str],
) -> APIRouter:
    router = APIRouter()

    @router.get("/api/reservations")
    async def reservation_list() -> dict[str, Any]:
        return {"reservations": cluster().list_reservations()}

    @router.post("/api/reservations")
    async def reservation_create(body: ReservationRequest, request: Request) -> JSONResponse:
        ident = require_admin(request, "reserve create")
        try:
            made = cluster().create_reservation(
                body.model_dump(), actor=ident.user, address=address(request)
            )
        except ReservationRequestError as e:
            return JSONResponse({"detail": str(e)}, status_code=400)
        return JSONResponse(made, status_code=201)

    @router.delete("/api/reservations/{name}")
    async def reservation_delete(name: str, request: Request) -> JSONResponse:
        ident = require_admin(request, "reserve delete")
        if not cluster().delete_reservation(name, actor=ident.user, address=address(request)):
            return JSONResponse({"detail": f"no such reservation: {name}"}, status_code=404)
        return JSONResponse({"deleted": name})

    return router
