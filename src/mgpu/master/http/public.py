"""The routes answered without a token (guard.OPEN_PATHS): health, readiness, metrics, the
cluster's CA and the dashboard's page and files."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse

from mgpu.master.http.deps import Edge, cluster, leadership
from mgpu.master.http.errors import missing
from mgpu.master.http.standby import standby_answer
from mgpu.master.monitor.metrics import render_metrics
from mgpu.master.monitor.observe import PAGE_HEADERS, STATIC, WEB_DIR

__all__ = ["router"]

router = APIRouter()

PAGE = WEB_DIR / "index.html"


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    """200 on every live master, with its role (several masters on one database: "leader"
    or "standby", and where the leader is)."""
    election = leadership(request)
    if election is None:
        return {"status": "ok", "role": "leader"}
    return {
        "status": "ok",
        "role": election.role,
        "leader": election.leader,
        "address": election.address,
        "generation": election.generation,
    }


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 on the leader once it schedules; 503 on a standby (and on a leader still
    opening the cluster), saying where the leader is."""
    election = leadership(request)
    if election is not None and not election.serving:
        answer, headers = standby_answer(election)
        return JSONResponse({**answer, "ready": False}, status_code=503, headers=dict(headers))
    body: dict[str, Any] = {"role": "leader", **cluster(request).readiness()}
    if election is not None:
        body["leader"] = election.address
        body["generation"] = election.generation
        body["lease_valid"] = election.may_send()
        body["ready"] = body["ready"] and body["lease_valid"]
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    election = leadership(request)
    role = (
        "# HELP mgpu_master_leader 1 on the master that leads (and schedules), else 0.\n"
        "# TYPE mgpu_master_leader gauge\n"
        f"mgpu_master_leader {0 if election is not None and not election.serving else 1}\n"
    )
    if election is not None and not election.serving:
        return PlainTextResponse(role, media_type="text/plain; version=0.0.4")
    text = render_metrics(cluster(request)) + role
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.get("/api/ca")
async def ca(edge: Edge) -> PlainTextResponse:
    """The cluster CA, for peers to check against the fingerprint in their token."""
    return PlainTextResponse((edge.state_dir / "ca.crt").read_text())


@router.get("/", response_class=HTMLResponse)
async def dashboard() -> HTMLResponse:
    if PAGE.exists():
        return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers=PAGE_HEADERS)
    return HTMLResponse("<h1>mgpu</h1><p>See <code>mgpu queue</code>.</p>", headers=PAGE_HEADERS)


@router.get("/web/{name}", include_in_schema=False)
async def static(name: str) -> FileResponse:
    media = STATIC.get(name)
    path = WEB_DIR / name
    if media is None or not path.is_file():
        raise missing("file", name)
    headers = {"Cache-Control": "no-cache", **PAGE_HEADERS}
    return FileResponse(path, media_type=media, headers=headers)
