"""A leader whose database is away (paused, cut, restarting) answers at once with a 503,
one sentence and `Retry-After` (issue 32, item 4); the client asks again after that wait,
for as long as it waits for a failover, a request that does no harm asked twice: a read,
a submit with its idempotency key.  Never a request that could be done twice, and with
one master (no $MGPU_FAILOVER_WAIT) the 503 is the answer, at once."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from factories import http_server
from mgpu.client import leader as leader_cache
from mgpu.client.api import Client, RequestError

STALLED = "the database does not answer (paused or cut): try again"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MGPU_MASTER", raising=False)
    monkeypatch.delenv("MGPU_FAILOVER_WAIT", raising=False)
    monkeypatch.setenv("MGPU_TOKEN", "mgpu_test")
    monkeypatch.setattr(leader_cache, "_leaders", {})


@pytest.fixture
def dead() -> Iterator[str]:
    with socket.socket() as s:  # bound, not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


class Paused(BaseHTTPRequestHandler):
    """A leader whose database answers again after `refusals` requests: 503s till then."""

    protocol_version = "HTTP/1.1"
    refusals: ClassVar[int] = 0
    asked: ClassVar[list[tuple[str, str, str | None]]] = []
    """(method, path, Idempotency-Key) of each request."""

    def _handle(self, method: str) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        cls.asked.append((method, self.path, self.headers.get("Idempotency-Key")))
        if len(cls.asked) <= cls.refusals:
            self._answer(503, {"detail": STALLED}, {"Retry-After": "0"})
        elif method == "POST":
            self._answer(201, {"job_id": "1"})
        else:
            self._answer(200, {"jobs": [], "nodes": []})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def paused(refusals: int) -> type[Paused]:
    Paused.refusals, Paused.asked = refusals, []
    return Paused


def test_a_read_is_asked_again_until_the_database_answers(dead: str) -> None:
    with http_server(paused(2)) as leader:
        assert Client(f"http://{leader},{dead}").queue() == {"jobs": [], "nodes": []}
    assert [a[0] for a in Paused.asked] == ["GET"] * 3


def test_a_submit_is_sent_again_with_its_key(dead: str) -> None:
    with http_server(paused(2)) as leader:
        assert Client(f"http://{leader},{dead}").submit("true", env={}, cwd="/").id == "1"
    keys = {key for _, _, key in Paused.asked}
    assert len(Paused.asked) == 3 and len(keys) == 1 and None not in keys  # one key


def test_a_request_that_could_be_done_twice_is_not_sent_again(dead: str) -> None:
    with (
        http_server(paused(1)) as leader,
        pytest.raises(RequestError, match=r"^the database does not answer \(paused or cut\)"),
    ):
        Client(f"http://{leader},{dead}").create_token("bob")
    assert len(Paused.asked) == 1


def test_one_master_answers_its_503_at_once() -> None:
    with http_server(paused(1)) as leader, pytest.raises(RequestError) as caught:
        Client(f"http://{leader}").queue()
    assert caught.value.status == 503 and str(caught.value) == STALLED
    assert len(Paused.asked) == 1


def test_the_wait_is_bounded_and_said(dead: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGPU_FAILOVER_WAIT", "1.5")
    began = time.monotonic()
    with http_server(paused(10**6)) as leader, pytest.raises(RequestError) as caught:
        Client(f"http://{leader}").queue()  # one master, the wait set: waited too
    assert time.monotonic() - began < 10
    assert str(caught.value) == f"{STALLED} (still so after 1.5 s)"
    assert 2 <= len(Paused.asked) <= 5


def test_with_several_masters_another_that_leads_is_asked() -> None:
    """The master asked is cut off from the database (its 503), another took over: the
    request goes there, not to the cut one again and again for the failover wait."""
    from test_multiaddr import Leader

    with http_server(paused(10**6)) as cut, http_server(Leader) as leader:
        client = Client(f"http://{cut},{leader}")
        began = time.monotonic()
        assert client.queue() == {"jobs": [], "nodes": []}
        assert time.monotonic() - began < 5  # not the 30 s failover wait on the cut one
        assert client.address == leader
    assert len(Paused.asked) == 1
