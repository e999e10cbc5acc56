"""The dashboard's routes: its overview and its page of jobs, each answered with an ETag
(the views are monitor/dashboard.py's; a bad filter is its `BadFilter`, answered 400 by
errors.py)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from mgpu.master.http.deps import Ctl
from mgpu.master.monitor.dashboard import MAX_OPEN, PAGE_MAX, etagged, job_page, overview

__all__ = ["router"]

router = APIRouter()


@router.get("/api/dashboard/overview")
async def dashboard_overview(request: Request, cl: Ctl, open: str = "") -> Response:
    ids = [n for n in open.split(",") if n][:MAX_OPEN]
    return etagged(request, overview(cl, ids))


@router.get("/api/dashboard/jobs")
async def dashboard_jobs(
    request: Request,
    cl: Ctl,
    state: str = "active",
    user: str | None = None,
    q: str | None = Query(default=None, max_length=200),
    offset: int = Query(default=0, ge=0, le=10_000_000),
    limit: int = Query(default=50, ge=1, le=PAGE_MAX),
) -> Response:
    body = await job_page(cl, state, user or None, q, offset, limit)
    return etagged(request, body)
