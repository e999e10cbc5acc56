"""The routes answered without a token (guard.OPEN_PATHS): health, readiness, metrics, the
cluster's CA and the dashboard's page."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from mgpu.master.http.deps import Ctl, Edge
from mgpu.master.monitor.metrics import render_metrics
from mgpu.master.monitor.observe import PAGE_HEADERS

__all__ = ["router"]

router = APIRouter()

PAGE = Path(__file__).resolve().parents[2] / "web" / "index.html"


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(cl: Ctl) -> JSONResponse:
    body = cl.readiness()
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


@router.get("/metrics")
async def metrics(cl: Ctl) -> PlainTextResponse:
    return PlainTextResponse(render_metrics(cl), media_type="text/plain; version=0.0.4")


@router.get("/api/ca")
async def ca(edge: Edge) -> PlainTextResponse:
    """The cluster CA, for peers to check against the fingerprint in their token."""
    return PlainTextResponse((edge.state_dir / "ca.crt").read_text())


@router.get("/", response_class=HTMLResponse)
async def dashboard() -> HTMLResponse:
    if PAGE.exists():
        return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers=PAGE_HEADERS)
    return HTMLResponse("<h1>mgpu</h1><p>See <code>mgpu queue</code>.</p>", headers=PAGE_HEADERS)
