"""The master's API in front of the controller, driven in process over ASGI (no server):
a step's argv is checked as a submit's is, and refused agent hellos are counted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Harness

from factories import asgi_call, http_scope, websocket_scope
from mgpu.config import ClusterConfig
from mgpu.master.control.cluster import Cluster
from mgpu.master.http.app import create_app
from mgpu.master.http.follow import JobNews, follow
from mgpu.master.http.guard import MAX_REASONS, FailedLogins
from mgpu.protocol import Hello, encode


async def _call(app: Any, method: str, path: str, token: str, body: bytes = b"") -> Any:
    """(status, JSON body) of one request."""
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "authorization": f"Bearer {token}",
    }
    return await asgi_call(app, http_scope(path, method, headers), body)


async def _refused_hello(app: Any, hello: Hello) -> str:
    """One agent connection that says `hello` and is refused: the reason it was given."""
    inbox = [{"type": "websocket.receive", "text": encode(hello)}]
    (text,) = await _agent_connection(app, inbox, hold=False)
    return str(json.loads(text)["reason"])


# (case, argv as JSON, the sentence)
BAD_STEPS = [
    ("a NUL byte", '["echo", "a\\u0000b"]', "--argv[1] contains a NUL byte"),
    ("a lone surrogate", '["echo", "\\ud800"]', "--argv[1] is not valid"),
    ("an empty command", '[" "]', "the command is empty"),
]


@pytest.mark.parametrize(
    ("argv", "sentence"), [c[1:] for c in BAD_STEPS], ids=[c[0] for c in BAD_STEPS]
)
def test_a_steps_argv_is_checked_like_a_submits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: str, sentence: str
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(Cluster, "start_step", lambda self, *args: started.append(args))
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> tuple[int, Any]:
        async with app.router.lifespan_context(app):
            token = (tmp_path / "admin-token").read_text().strip()
            body = f'{{"host": "node001", "argv": {argv}}}'.encode()
            return await _call(app, "POST", "/api/jobs/a1b2c3d4/steps", token, body)

    status, answer = asyncio.run(main())
    assert status == 422
    assert answer["detail"].startswith(sentence)
    assert started == []  # never reached the controller, let alone an agent


def test_refused_hellos_are_counted_in_one_audit_row(tmp_path: Path) -> None:
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> tuple[list[str], list[dict[str, Any]]]:
        async with app.router.lifespan_context(app):
            token = (tmp_path / "admin-token").read_text().strip()
            hello = Hello(node_id="n1", hostname="h", ip="10.1.2.3", gpus=[], token="bad")
            reasons = [await _refused_hello(app, hello) for _ in range(3)]
            other = Hello(node_id="n2", hostname="h", ip="10.1.2.3", gpus=[], token=None)
            reasons.append(await _refused_hello(app, other))
            status, audit = await _call(app, "GET", "/api/audit", token)
            assert status == 200
            return reasons, audit["events"]

    reasons, events = asyncio.run(main())
    assert reasons[:3] == ["not authorised: wrong join token"] * 3
    rows = sorted(
        (e["actor"], e["address"], e["detail"]) for e in events if e["kind"] == "agent_refused"
    )
    assert rows == [
        ("n1", "10.1.2.3", "3 refused hellos: not authorised: wrong join token"),
        (
            "n2",
            "10.1.2.3",
            "1 refused hello: not authorised: no join token given (mgpu node --token, "
            "or $MGPU_JOIN_TOKEN)",
        ),
    ]


def test_a_refusal_row_names_a_few_reasons_however_many_there_were() -> None:
    rows: list[Any] = []
    hellos = FailedLogins(rows.extend, kind="agent_refused", noun="hello")
    for i in range(MAX_REASONS + 20):
        hellos.failed("10.0.0.9", None, f"reason {i}", actor="n1")
    hellos.flush()
    ((kind, actor, address, target, detail),) = rows
    assert (kind, actor, address, target) == ("agent_refused", "n1", "10.0.0.9", None)
    named = ", ".join(f"reason {i}" for i in range(MAX_REASONS))
    assert detail == f"{MAX_REASONS + 20} refused hellos: {named}, ..."


def test_audit_rows_escape_what_a_client_sent(tmp_path: Path) -> None:
    """A refused request's path is stored as the client sent it; the audit API gives it
    escaped, so an admin's terminal (`mgpu audit`, `jq -r`) never obeys it."""
    app = create_app(tmp_path, ClusterConfig())
    path = "/api/jobs/\x1b]0;owned\x07\x9b2J\u202e"

    async def main() -> list[dict[str, Any]]:
        async with app.router.lifespan_context(app):
            token = (tmp_path / "admin-token").read_text().strip()
            status, _ = await _call(app, "GET", path, "not-a-token")
            assert status == 401
            status, audit = await _call(app, "GET", "/api/audit", token)
            assert status == 200
            return list(audit["events"])

    events = asyncio.run(main())
    (row,) = [e for e in events if e["kind"] == "auth_failed"]
    assert row["target"] == "/api/jobs/\\x1b]0;owned\\x07\\x9b2J\\u202e"
    for event in events:
        for value in event.values():
            assert not isinstance(value, str) or value.isprintable(), event


@pytest.mark.parametrize("name", [".", "..", "a/b", "a\x00b"])
def test_a_script_name_that_is_not_a_file_name_is_refused_and_nothing_stored(
    tmp_path: Path, name: str
) -> None:
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> tuple[int, Any, Any]:
        async with app.router.lifespan_context(app):
            token = (tmp_path / "admin-token").read_text().strip()
            body = json.dumps({"script": "#!/bin/sh\ntrue\n", "script_name": name}).encode()
            status, answer = await _call(app, "POST", "/api/jobs", token, body)
            _, queue = await _call(app, "GET", "/api/jobs", token)  # a stored one: queued
            return status, answer, queue

    status, answer, queue = asyncio.run(main())
    assert status == 422
    detail = answer["detail"]
    assert "\n" not in detail and detail.isprintable()
    assert detail.startswith(("the job script's name", repr(name)))
    assert queue["jobs"] == []


async def _agent_connection(app: Any, inbox: list[dict[str, Any]], hold: bool) -> list[str]:
    """One agent connection fed `inbox` (then nothing, if `hold`: a peer that stays
    silent; else a disconnect); the texts the master sent, once the app returned."""
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "websocket.connect"}, *inbox]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        if hold:
            await asyncio.Event().wait()  # never: only the master's own timeout ends this
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = websocket_scope(client=("10.1.2.3", 50000))
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return [m["text"] for m in sent if m["type"] == "websocket.send"]


def test_a_hello_is_bounded_in_time_and_size_before_it_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone who reaches the port may open an agent connection: one that never says hello
    is refused and closed after HELLO_TIMEOUT, one whose hello is over HELLO_LIMIT is
    refused without being parsed."""
    from mgpu.master.http import agents as app_module

    monkeypatch.setattr(app_module, "HELLO_TIMEOUT", 0.2)
    parsed: list[int] = []
    real_parse = app_module.parse_hello
    monkeypatch.setattr(
        app_module, "parse_hello", lambda raw: parsed.append(len(raw)) or real_parse(raw)
    )
    app = create_app(tmp_path, ClusterConfig())
    huge = '{"type": "hello", "pad": "' + "x" * app_module.HELLO_LIMIT + '"}'

    async def main() -> tuple[list[str], list[str], list[str]]:
        async with app.router.lifespan_context(app):
            silent = await _agent_connection(app, [], hold=True)
            big = await _agent_connection(
                app, [{"type": "websocket.receive", "text": huge}], hold=False
            )
            binary = await _agent_connection(
                app, [{"type": "websocket.receive", "bytes": b"{}"}], hold=False
            )
            return silent, big, binary

    silent, big, binary = asyncio.run(main())
    assert [json.loads(t) for t in silent] == [
        {"type": "refused", "reason": "no hello within 0.2 s"}
    ]
    (reason,) = [json.loads(t)["reason"] for t in big]
    assert reason == f"the hello is {len(huge)} characters long; at most {app_module.HELLO_LIMIT}"
    (reason,) = [json.loads(t)["reason"] for t in binary]
    assert reason == "the first message must be hello (it is not text)"
    assert parsed == []


async def _headers(app: Any, path: str) -> tuple[int, dict[str, str]]:
    """(status, response headers) of an unauthenticated GET."""
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await asyncio.Event().wait()  # the client stays: a file response listens for it
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = http_scope(path)
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


def test_the_dashboard_cannot_be_framed(tmp_path: Path) -> None:
    """The page acts with its user's token (cancel): no other site may put it in a frame
    and trick a click.  Its files say so too."""
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> list[tuple[int, dict[str, str]]]:
        async with app.router.lifespan_context(app):
            return [await _headers(app, p) for p in ("/", "/web/app.js", "/web/style.css")]

    for status, headers in asyncio.run(main()):
        assert status == 200
        assert headers["x-frame-options"] == "DENY"
        policy = [d.strip() for d in headers["content-security-policy"].split(";")]
        assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"


def test_the_dashboard_runs_only_its_own_files(tmp_path: Path) -> None:
    """Defence in depth behind app.js's escaping: the page and each of its files carry the
    whole policy: nothing by default, then scripts, the style sheet, images and fetches from
    the master only (no inline script or handler, no eval, no style="...")."""
    app = create_app(tmp_path, ClusterConfig())
    paths = ("/", "/web/app.js", "/web/heatmap.js", "/web/style.css", "/web/favicon.svg")

    async def main() -> list[tuple[int, dict[str, str]]]:
        async with app.router.lifespan_context(app):
            return [await _headers(app, p) for p in paths]

    for status, headers in asyncio.run(main()):
        assert status == 200
        assert headers["content-security-policy"] == (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
            "connect-src 'self'; frame-ancestors 'none'; object-src 'none'; base-uri 'none'; "
            "form-action 'self'"
        )


def test_one_error_gets_one_status_on_every_route_and_a_refusal_is_audited(
    tmp_path: Path,
) -> None:
    """errors.py: a request the controller cannot honour (SubmitError) is a 400 whichever
    route raised it; another user's job is a 403 with a `denied` row naming the action."""
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> dict[str, Any]:
        async with app.router.lifespan_context(app):
            admin = (tmp_path / "admin-token").read_text().strip()
            out: dict[str, Any] = {}
            status, made = await _call(app, "POST", "/api/jobs", admin, b'{"command": "true"}')
            assert status == 201
            job_id = made["job_id"]
            body = b'{"host": "node001", "argv": ["true"]}'
            out["rsh"] = await _call(app, "POST", f"/api/jobs/{job_id}/steps", admin, body)
            body = b'{"argv": ["true"]}'
            out["srun"] = await _call(app, "POST", f"/api/allocations/{job_id}/steps", admin, body)
            bad = b'{"command": "true", "reservation": "nosuch"}'
            out["submit"] = await _call(app, "POST", "/api/jobs", admin, bad)
            _, bob = await _call(app, "POST", "/api/tokens", admin, b'{"user": "bob"}')
            out["denied"] = await _call(app, "POST", f"/api/jobs/{job_id}/cancel", bob["token"])
            out["missing"] = await _call(app, "POST", "/api/steps/nosuch/cancel", admin)
            _, audit = await _call(app, "GET", "/api/audit", admin)
            out["audit"] = [
                (e["actor"], e["target"]) for e in audit["events"] if e["kind"] == "denied"
            ]
            out["job_id"] = job_id
            return out

    out = asyncio.run(main())
    job_id = out["job_id"]
    assert out["rsh"] == (400, {"detail": f"job {job_id} is not running"})
    assert out["srun"] == (400, {"detail": f"job {job_id} is not an allocation (mgpu alloc)"})
    assert out["submit"][0] == 400 and "nosuch" in out["submit"][1]["detail"]
    assert out["denied"][0] == 403
    assert out["denied"][1]["detail"].startswith(f"not authorised: job {job_id} belongs to ")
    assert out["missing"] == (404, {"detail": "no such step: nosuch"})
    assert out["audit"] == [("bob", f"cancel {job_id}")]


def test_a_follower_gets_the_output_then_the_state_then_the_end(h: Harness) -> None:
    """follow.py: the one skeleton of `logs -f` and attach; woken by the output and (attach)
    by the job's changes, it says the state once per change and ends with the job."""
    agent = h.agent("n1", gpus=1)
    job_id = h.start("echo hi")

    async def main() -> list[Any]:
        lines: list[Any] = []
        feed = follow(h.cl, job_id, JobNews(h.cl, job_id, attach=True))

        async def read() -> None:
            async for chunk in feed:
                lines.extend(json.loads(t) for t in chunk.decode().splitlines())

        async def until(seen: Callable[[dict[str, Any]], bool]) -> None:
            async with asyncio.timeout(5):
                while not any(map(seen, lines)):
                    await asyncio.sleep(0)  # a turn of the loop: the feed runs

        reader = asyncio.create_task(read())
        await until(lambda line: "started" in line)
        agent.output(job_id, "hi\n")
        await until(lambda line: line.get("d") == "hi\n")
        agent.exited(job_id, 0)
        await asyncio.wait_for(reader, timeout=5)
        return lines

    lines = asyncio.run(main())
    assert lines[0] == {"status": "running", "reason": None}
    assert lines[1] == {"started": True, "allocation": [{"node_id": "n1", "gpu_ids": [0]}]}
    assert [line["d"] for line in lines if "d" in line] == ["hi\n"]
    assert lines[-1] == {"end": True, "state": "completed", "exit_code": 0, "reason": None}
    assert len(lines) == 4


def test_a_follower_is_pinged_only_while_its_master_holds_the_lease(h: Harness) -> None:
    """A quiet job's follower gets a ping each tick, so its client knows the master lives;
    out of its lease (cut off from the database) the master pings no more, so a client of
    several masters asks the others whether one leads now (mgpu.client.leaderwatch)."""
    h.agent("n1", gpus=1)
    job_id = h.start("sleep 100")
    holds = [True]
    h.cl.node_admin.holds_lease = lambda: holds[0]

    async def pings(ticks: int) -> int:
        news = JobNews(h.cl, job_id, tick=0.01)
        feed = follow(h.cl, job_id, news, ping=b'{"ping":1}\n')
        got = 0
        async with asyncio.timeout(30):
            async for chunk in feed:
                got += chunk.count(b'"ping"')
                ticks -= 1
                if ticks <= 0:
                    break
        await feed.aclose()  # type: ignore[attr-defined]
        return got

    assert asyncio.run(pings(5)) >= 3

    async def quiet() -> bool:
        holds[0] = False
        news = JobNews(h.cl, job_id, tick=0.01)
        feed = follow(h.cl, job_id, news, ping=b'{"ping":1}\n')
        first = await anext(feed)  # the status line
        assert b'"status"' in first
        try:
            async with asyncio.timeout(0.5):  # 50 ticks without a word
                await anext(feed)
        except TimeoutError:
            return True
        finally:
            await feed.aclose()  # type: ignore[attr-defined]
        return False

    assert asyncio.run(quiet())
