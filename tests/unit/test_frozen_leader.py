"""A client of several masters and a leader that says nothing (stopped, frozen): the wait
for its answer is watched, and left as soon as another master leads (its /readyz), never
waited on for the whole timeout nor asked again on a new connection; a slow answer while
no other master leads is waited for as before; `logs -f` opens its stream again on the
new leader (mgpu.client.leaderwatch, against stand-in masters on loopback)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from factories import http_server
from mgpu.client import api, leaderwatch
from mgpu.client import leader as leader_cache
from mgpu.client.api import Client, NoAnswer
from mgpu.client.stream import print_logs


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MGPU_MASTER", raising=False)
    monkeypatch.delenv("MGPU_FAILOVER_WAIT", raising=False)
    monkeypatch.setenv("MGPU_TOKEN", "mgpu_test")
    monkeypatch.setattr(leader_cache, "_leaders", {})


@pytest.fixture
def stopped() -> Iterator[str]:
    """A master stopped with SIGSTOP, as its clients see it: connections complete (the
    kernel's backlog), nothing is ever read or answered."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"


class _Master(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class Taking(_Master):
    """A standby that leads once `lead` is set: its /readyz says which (each asking
    counted), and a request is answered only once it leads."""

    lead = threading.Event()
    readyz: ClassVar[int] = 0
    asked_with: ClassVar[set[str | None]] = set()
    """The Authorization headers /readyz was asked with."""
    posts: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.path == "/readyz":
            type(self).readyz += 1
            type(self).asked_with.add(self.headers.get("Authorization"))
            self._answer(200 if self.lead.is_set() else 503, {"role": "?"})
        elif self.lead.is_set():
            self._answer(200, {"jobs": [], "nodes": []})
        else:
            self._answer(503, {"detail": "a standby", "role": "standby", "leader": None})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts.append(self.path)
        self._answer(201, {"job_id": "1"})


@pytest.fixture
def taking() -> Iterator[str]:
    Taking.lead.clear()
    Taking.readyz, Taking.posts, Taking.asked_with = 0, [], set()
    with http_server(Taking) as address:
        yield address


def test_a_read_leaves_a_stopped_leader_once_another_leads(stopped: str, taking: str) -> None:
    """The stopped leader is the one remembered: the client asks it first, and once the
    standby leads it gets its answer there, seconds later, not after its 30 s timeout."""
    client = Client(f"http://{stopped},{taking}")  # the default timeout: 30 s
    assert client.address == stopped
    threading.Timer(1.5, Taking.lead.set).start()  # the standby takes over meanwhile
    began = time.monotonic()
    assert client.queue() == {"jobs": [], "nodes": []}
    took = time.monotonic() - began
    assert took < 15, f"{took:.1f} s"
    assert client.address == taking
    assert Taking.readyz >= 2  # asked while it stood by, and once it led
    assert Taking.asked_with == {None}  # asking carries no token


def test_a_slow_answer_is_waited_for_while_no_other_master_leads(taking: str) -> None:
    """Asking the others costs the slow leader nothing: its answer, 4 s late, is had."""

    class Slow(_Master):
        def do_GET(self) -> None:
            time.sleep(4)
            self._answer(200, {"jobs": ["slow"], "nodes": []})

    with http_server(Slow) as slow:
        client = Client(f"http://{slow},{taking}")
        assert client.queue() == {"jobs": ["slow"], "nodes": []}
        assert client.address == slow
    assert Taking.readyz >= 1  # it was watched, and not cut


def test_a_submit_to_a_stopped_leader_is_made_once_by_the_new_one(
    stopped: str, taking: str
) -> None:
    Taking.lead.set()
    client = Client(f"http://{stopped},{taking}")
    began = time.monotonic()
    assert client.submit("true", env={}, cwd="/").id == "1"
    assert time.monotonic() - began < 15
    assert Taking.posts == ["/api/jobs"]  # its idempotency key made it safe to send there


def test_a_request_left_unanswered_says_so_and_the_next_request_goes_to_the_leader(
    stopped: str, taking: str
) -> None:
    """A request that is not safe to send twice (a node's drain: no idempotency key) is not
    sent again: one sentence, soon, naming the master that leads now, where the next
    request goes."""
    Taking.lead.set()
    client = Client(f"http://{stopped},{taking}")
    began = time.monotonic()
    with pytest.raises(NoAnswer) as caught:
        client.drain("n1")
    assert time.monotonic() - began < 15
    assert str(caught.value) == (
        f"the mgpu master at {stopped} said nothing for 1 s and {taking} leads now: it may "
        "or may not have done POST /api/nodes/n1/drain (look before trying again)"
    )
    assert Taking.posts == []
    assert client.queue() == {"jobs": [], "nodes": []}
    assert client.address == taking


def test_a_cancel_left_unanswered_is_sent_to_the_new_leader_with_its_key(
    stopped: str, taking: str
) -> None:
    """A cancel carries an idempotency key (mgpu.idempotent): safe to send again, it is."""
    Taking.lead.set()
    client = Client(f"http://{stopped},{taking}")
    began = time.monotonic()
    client.cancel("5")
    assert time.monotonic() - began < 15
    assert Taking.posts == ["/api/jobs/5/cancel"]


class KeptAlive(_Master):
    """Answers its first request; every later one on the same connection, never."""

    stalled: ClassVar[int] = 0
    release = threading.Event()

    def do_GET(self) -> None:
        if getattr(self, "answered", False):
            type(self).stalled += 1
            self.release.wait(10)
            self.close_connection = True
            return
        self.answered = True
        self._answer(200, {"jobs": [], "nodes": []})


def test_a_pooled_connection_that_times_out_is_not_asked_again() -> None:
    """A master that said nothing in time on a kept-alive connection is not asked again on
    a new one: that would wait as long again (60 s for the Python Client's 30 s)."""
    KeptAlive.stalled = 0
    KeptAlive.release.clear()
    try:
        with http_server(KeptAlive) as master:
            client = Client(f"http://{master}", timeout=0.5)
            client.queue()  # leaves its connection in the pool
            with pytest.raises(NoAnswer, match="did not answer in time"):
                client.queue()
            assert KeptAlive.stalled == 1
    finally:
        KeptAlive.release.set()


class Quiet(_Master):
    """Job 7 runs: its stream sends three records, then nothing, the connection open (a
    leader stopped mid-stream)."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.startswith("/api/jobs/7?") or self.path == "/api/jobs/7":
            self._answer(200, {"id": "7", "state": "running", "allocation": []})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            _chunk(self, {"s": "o", "d": f"line {i}\n", "n": "n1"})
        self.release.wait(20)
        self.close_connection = True


class NewLeader(_Master):
    """The master that took over: it leads, and has job 7's six records and its end."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/readyz":
            self._answer(200, {"role": "leader"})
            return
        if path == "/api/jobs/7":
            self._answer(200, {"id": "7", "state": "completed", "allocation": []})
            return
        type(self).asked.append(query)
        since = int(dict(q.split("=") for q in query.split("&"))["since"])
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(since, 6):
            _chunk(self, {"s": "o", "d": f"line {i}\n", "n": "n1"})
        _chunk(self, {"end": True, "state": "completed", "exit_code": 0})
        self.wfile.write(b"0\r\n\r\n")


def _chunk(handler: BaseHTTPRequestHandler, rec: dict[str, Any]) -> None:
    data = json.dumps(rec).encode() + b"\n"
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def test_logs_follow_goes_on_on_the_new_leader_when_its_stream_goes_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(api, "STREAM_QUIET", 0.5)  # the master pings every 5 s
    NewLeader.asked = []
    Quiet.release.clear()
    try:
        with http_server(Quiet) as quiet, http_server(NewLeader) as new:
            began = time.monotonic()
            assert print_logs(Client(f"http://{quiet},{new}"), "7", follow=True) == 0
            took = time.monotonic() - began
    finally:
        Quiet.release.set()
    assert capsys.readouterr().out == "".join(f"line {i}\n" for i in range(6))
    assert [q.partition("&since=")[2] for q in NewLeader.asked] == ["3&marks=1"]
    assert took < api.FOLLOW_SILENCE, f"{took:.1f} s: it waited for the silence to end"


def test_a_lone_master_is_not_watched(stopped: str, taking: str) -> None:
    """One master: nowhere else to go, its connections are not watched (the wait is the
    timeout, as ever); several: each is."""
    lone = Client(f"http://{stopped}")._connect(1.0)
    several = Client(f"http://{stopped},{taking}")._connect(1.0)
    try:
        assert lone.watch is None
        assert isinstance(several.watch, leaderwatch.LeaderWatch)
    finally:
        lone.close()
        several.close()


class Lapsed(_Master):
    """A leader out of its lease (cut off from its database alone, or the database
    paused): it answers from its memory, with `X-Mgpu-Lease: lapsed`."""

    def do_GET(self) -> None:
        data = json.dumps({"jobs": ["stale"], "nodes": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Mgpu-Lease", "lapsed")
        self.end_headers()
        self.wfile.write(data)


def test_a_lapsed_leaders_read_goes_to_the_master_that_leads_now(taking: str) -> None:
    """Cut off from the database alone, the old leader's memory is stale (its nodes not
    connected, its output quiet): once another master leads, a read is asked there."""
    Taking.lead.set()
    with http_server(Lapsed) as lapsed:
        client = Client(f"http://{lapsed},{taking}")
        assert client.address == lapsed
        assert client.queue() == {"jobs": [], "nodes": []}
        assert client.address == taking


def test_a_lapsed_leaders_read_is_its_answer_while_none_other_leads(taking: str) -> None:
    """A paused database: no other master leads, the lapsed leader's memory is the best
    answer there is, and it is had at once."""
    with http_server(Lapsed) as lapsed:
        client = Client(f"http://{lapsed},{taking}")
        assert client.queue() == {"jobs": ["stale"], "nodes": []}
        assert client.address == lapsed
    assert Taking.readyz == 1  # asked once, whether it leads


class LapsedStream(_Master):
    """A leader out of its lease that still has job 7 running in its memory: its stream
    says `lapsed`, sends a stale record and stays open."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.partition("?")[0] == "/api/jobs/7":
            self._answer(200, {"id": "7", "state": "running", "allocation": []})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Mgpu-Lease", "lapsed")
        self.end_headers()
        _chunk(self, {"s": "o", "d": "stale\n", "n": "n1"})
        self.release.wait(20)
        self.close_connection = True


def test_logs_follow_opened_on_a_lapsed_leader_follows_the_one_that_leads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The stream a master out of its lease opens is closed unread once another master
    leads, and followed there from the start."""
    NewLeader.asked = []
    LapsedStream.release.clear()
    try:
        with http_server(LapsedStream) as lapsed, http_server(NewLeader) as new:
            client = Client(f"http://{lapsed},{new}")
            assert print_logs(client, "7", follow=True) == 0
    finally:
        LapsedStream.release.set()
    assert capsys.readouterr().out == "".join(f"line {i}\n" for i in range(6))
    assert [q.partition("&since=")[2].split("&")[0] for q in NewLeader.asked] == ["0"]
