"""The edge's one way for every route (master/http/): each route is an edge module's, reads
who asks from deps.py, and its refusals are the guard's and errors.py's: the same status,
sentence and audit row whichever route refused.  Driven in process over ASGI."""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from factories import asgi_call, http_scope
from mgpu.config import ClusterConfig
from mgpu.master.http.app import create_app

# FastAPI's own pages (the OpenAPI document and its viewers).
FASTAPI_PATHS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}

MOVED = [
    "/api/dashboard/overview",
    "/api/dashboard/jobs",
    "/api/history",
    "/api/report",
    "/api/utilisation",
]
"""The routes that monitor/ built in closures before they joined the edge."""


async def _call(app: Any, method: str, path: str, token: str | None, body: bytes = b"") -> Any:
    """(status, JSON body) of one request (`token` None: none sent)."""
    headers = {"content-type": "application/json", "content-length": str(len(body))}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return await asgi_call(app, http_scope(path, method, headers), body)


def _leaves(routes: list[Any]) -> Iterator[Any]:
    """Every route with an endpoint, inside included routers too (FastAPI keeps an included
    router whole, as one route that holds it)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from _leaves(inner.routes) if inner is not None else [route]


def test_every_route_is_declared_by_an_edge_module(tmp_path: Path) -> None:
    """One place for routes: each endpoint is a function of a master/http module (none
    built in a closure elsewhere, with its own way to find the controller or refuse)."""
    app = create_app(tmp_path, ClusterConfig())
    homes = [
        (route.path, route.endpoint.__module__)
        for route in _leaves(app.routes)
        if route.path not in FASTAPI_PATHS
    ]
    assert set(MOVED) <= {path for path, _ in homes} and len(homes) > 40
    strays = [(path, home) for path, home in homes if not home.startswith("mgpu.master.http.")]
    assert strays == []


def test_the_moved_routes_refuse_as_every_other_route_does(tmp_path: Path) -> None:
    """Without a token: the guard's 401 and sentence, counted in the same `auth_failed`
    row as a refused queue listing; a bad value: errors.py's 400 with one sentence; a page
    file that is not there: its 404."""
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> dict[str, Any]:
        async with app.router.lifespan_context(app):
            admin = (tmp_path / "admin-token").read_text().strip()
            out: dict[str, Any] = {"queue": await _call(app, "GET", "/api/jobs", None)}
            out["moved"] = [await _call(app, "GET", path, None) for path in MOVED]
            out["bad"] = [
                await _call(app, "GET", "/api/history?since=yesterday", admin),
                await _call(app, "GET", "/api/history?state=running", admin),
                await _call(app, "GET", "/api/report?by=gpu", admin),
                await _call(app, "GET", "/api/dashboard/jobs?state=lost", admin),
            ]
            out["file"] = await _call(app, "GET", "/web/nosuch.js", None)
            _, audit = await _call(app, "GET", "/api/audit", admin)
            out["rows"] = [e for e in audit["events"] if e["kind"] == "auth_failed"]
            return out

    out = asyncio.run(main())
    assert out["queue"][0] == 401
    assert out["moved"] == [out["queue"]] * len(MOVED)
    (row,) = out["rows"]
    assert row["detail"] == f"{len(MOVED) + 1} refused requests: no token given"
    statuses = [status for status, _ in out["bad"]]
    details = [answer["detail"] for _, answer in out["bad"]]
    assert statuses == [400] * 4
    assert (
        details[0] == "--since 'yesterday' is not a duration (7d, 12h, 30m) or a date (2025-01-31)"
    )
    assert details[1].startswith("--state 'running' is not one of cancelled, completed")
    assert details[2] == "--by must be user or node, not 'gpu'"
    assert details[3].startswith("state 'lost' is not one of active, all")
    assert out["file"] == (404, {"detail": "no such file: nosuch.js"})


def test_a_submit_for_someone_else_is_refused_and_audited_as_any_refusal(tmp_path: Path) -> None:
    """Submitting as another user needs an admin token, and the owner's account needs the
    owner's (or a root grant): each refusal is errors.py's 403 with its `denied` row, as a
    cancel of another user's job is."""
    app = create_app(tmp_path, ClusterConfig())
    owner = getpass.getuser()

    async def main() -> dict[str, Any]:
        async with app.router.lifespan_context(app):
            admin = (tmp_path / "admin-token").read_text().strip()
            _, bob = await _call(app, "POST", "/api/tokens", admin, b'{"user": "bob"}')
            body = b'{"user": "carol", "admin": true}'
            _, carol = await _call(app, "POST", "/api/tokens", admin, body)
            out: dict[str, Any] = {}
            spec = json.dumps({"command": "true", "user": "alice"}).encode()
            out["bob"] = await _call(app, "POST", "/api/jobs", bob["token"], spec)
            spec = json.dumps({"command": "true", "user": owner}).encode()
            out["carol"] = await _call(app, "POST", "/api/jobs", carol["token"], spec)
            spec = json.dumps({"command": "true", "user": "alice"}).encode()
            out["as_alice"] = await _call(app, "POST", "/api/jobs", carol["token"], spec)
            _, audit = await _call(app, "GET", "/api/audit", admin)
            out["denied"] = [
                (e["actor"], e["target"], e["detail"])
                for e in audit["events"]
                if e["kind"] == "denied"
            ]
            return out

    out = asyncio.run(main())
    assert out["bob"] == (403, {"detail": "not authorised: bob may not submit as alice"})
    status, answer = out["carol"]
    reserved = (
        f"{owner} is the master's own account: only the owner's admin-token or an "
        f"--allow-root token may submit as {owner}"
    )
    assert status == 403 and answer["detail"] == f"not authorised: {reserved}"
    assert out["as_alice"][0] == 201  # an admin may submit for another user
    assert out["denied"] == [  # newest first
        ("carol", "submit", reserved),
        ("bob", "submit", "bob may not submit as alice"),
    ]
