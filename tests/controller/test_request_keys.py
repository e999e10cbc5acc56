"""Job control answered once per idempotency key (master/control/requestkeys.py, the edge's
master/http/requestkeys.py), driven in process over ASGI: a cancel sent again with its key
gets the first answer, not "already ended", also from a master opened again on the same
store (as one that takes over); the key is its user's, and names one request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from factories import asgi_call, http_scope
from mgpu.config import ClusterConfig
from mgpu.master.control.jobctl import Actor
from mgpu.master.http.app import create_app

KEY = "0123456789abcdef0123456789abcdef"


async def _post(app: Any, path: str, token: str, key: str | None, body: Any = None) -> Any:
    data = b"" if body is None else json.dumps(body).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(data)),
        "authorization": f"Bearer {token}",
    }
    if key is not None:
        headers["idempotency-key"] = key
    return await asgi_call(app, http_scope(path, "POST", headers), data)


async def _held_job(app: Any, token: str) -> str:
    """A job submitted held (it stays queued): its id."""
    status, made = await asgi_call(
        app,
        http_scope(
            "/api/jobs",
            "POST",
            {"content-type": "application/json", "authorization": f"Bearer {token}"},
        ),
        b'{"command": "true", "gpus": 0, "hold": true}',
    )
    assert status == 201, made
    return str(made["job_id"])


def _run(tmp_path: Path, work: Any) -> Any:
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            token = (tmp_path / "admin-token").read_text().strip()
            return await work(app, token)

    return asyncio.run(main())


def test_a_cancel_sent_again_with_its_key_gets_the_first_answer(tmp_path: Path) -> None:
    async def first(app: Any, token: str) -> tuple[str, list[Any]]:
        job_id = await _held_job(app, token)
        path = f"/api/jobs/{job_id}/cancel"
        answers = [await _post(app, path, token, KEY), await _post(app, path, token, KEY)]
        answers.append(await _post(app, path, token, None))  # no key: asked anew
        answers.append(await _post(app, f"/api/jobs/{job_id}/hold", token, KEY))
        cl = app.state.cluster
        _, bobs = cl.create_token("bob", False, False, Actor("owner", True))
        answers.append(await _post(app, path, bobs, KEY))  # bob's key: his own request
        return job_id, answers

    job_id, answers = _run(tmp_path, first)
    once = (200, {"cancelled": [job_id], "already_ended": []})
    assert answers[0] == once
    assert answers[1] == once, "the request sent again was done again"
    assert answers[2] == (200, {"cancelled": [], "already_ended": [job_id]})
    assert answers[3] == (400, {"detail": "this Idempotency-Key was sent with another request"})
    assert answers[4][0] == 403  # not the owner's stored answer: bob may not cancel it

    async def again(app: Any, token: str) -> Any:  # a master opened on the same store
        return await _post(app, f"/api/jobs/{job_id}/cancel", token, KEY)

    assert _run(tmp_path, again) == once


def test_a_master_killed_once_the_cancel_is_written_has_its_answer_too(tmp_path: Path) -> None:
    """The answer is stored in the transaction that writes the cancel (state/keyhold.py):
    a master that dies right after that write (here: every write after it is lost) left
    the answer with it, and the cancel sent again to the next master gets it, not "already
    ended".  Written apart, the answer was lost with the master."""

    async def first(app: Any, token: str) -> tuple[str, Any]:
        job_id = await _held_job(app, token)
        store = app.state.cluster.store
        write = store._write_rows
        dead: list[bool] = []

        def dies_after_the_cancel(parts: Any) -> None:
            if dead:
                return  # the master is gone: nothing more reaches the database
            write(parts)
            if any(f"'{job_id}'" in str(rows) and "cancelled" in str(rows) for _, rows in parts):
                dead.append(True)

        store._write_rows = dies_after_the_cancel
        answer = await _post(app, f"/api/jobs/{job_id}/cancel", token, KEY)
        assert dead, "the cancel was not written"
        return job_id, answer

    job_id, answer = _run(tmp_path, first)
    once = (200, {"cancelled": [job_id], "already_ended": []})
    assert answer == once

    async def again(app: Any, token: str) -> Any:  # the master that takes over
        return await _post(app, f"/api/jobs/{job_id}/cancel", token, KEY)

    assert _run(tmp_path, again) == once
