"""Slow and idle clients cannot hold the master's connections (master/http/connections.py).

A real master with short bounds (1 s for a request's head, 16 connections per address, 4
agent hellos awaited at once): a connection that sends nothing, or its head a byte at a
time, is closed within the bound, a new one as well as one kept alive after an answer; a
body, a long poll and a followed log are not timed; an address at its cap is refused at
once while others are served; an agent connection beyond the hellos awaited is closed.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from helpers import LocalCluster, local_cluster, wait_for

HEADER_TIMEOUT = 1.0
PER_ADDRESS = 16
PENDING_HELLOS = 4
CONFIG = f"""
cluster:
  master:
    header_timeout: {HEADER_TIMEOUT}
    connections_per_address: {PER_ADDRESS}
    pending_hellos: {PENDING_HELLOS}
"""
CLOSED_WITHIN = 4.0
"""The bound plus room for a loaded machine: a connection still open then is held."""
OTHER_ADDRESS = "127.0.0.2"
"""Loopback too, but counted apart from 127.0.0.1 (the test's client and the agent)."""


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("slow"), agents=1, gpus=2, config=CONFIG) as c:
        yield c


def _connect(cluster: LocalCluster, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", cluster.port), timeout=10, source_address=(source, 0)
    )


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP answer with a Content-Length: its status and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(
        int(v)
        for k, _, v in (h.partition(": ") for h in lines[1:])
        if k.lower() == "content-length"
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "closed in the middle of an answer"
        body += chunk
    return int(lines[0].split()[1]), body


def _seconds_until_closed(sock: socket.socket, dribble: bytes = b"") -> float | None:
    """Send `dribble` a byte every 0.1 s (the pace of a slow client) until the master
    closes the connection: how long that took, or None if it was still open after
    CLOSED_WITHIN seconds."""
    t0 = time.monotonic()
    pending = list(dribble)
    while time.monotonic() - t0 < CLOSED_WITHIN:
        if pending:
            try:
                sock.send(bytes([pending.pop(0)]))
            except OSError:  # reset: the master closed it
                return time.monotonic() - t0
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                data = sock.recv(4096)
            except OSError:
                return time.monotonic() - t0
            assert not data, f"the master answered a request it has not had: {data!r}"
            return time.monotonic() - t0
    return None


ENDLESS_HEAD = b"GET /healthz HTTP/1.1\r\nHost: master\r\nX-Slow: " + b"a" * 100


@pytest.mark.parametrize("dribble", [b"", ENDLESS_HEAD], ids=["idle", "dribbling"])
@pytest.mark.parametrize("after_an_answer", [False, True], ids=["new", "kept-alive"])
def test_a_slow_head_is_closed_within_the_bound(
    slow: LocalCluster, dribble: bytes, after_an_answer: bool
) -> None:
    with _connect(slow) as sock:
        if after_an_answer:  # the bound starts again at the end of each answer
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: master\r\n\r\n")
            assert _answer(sock)[0] == 200
        took = _seconds_until_closed(sock, dribble)
    assert took is not None, f"still open after {CLOSED_WITHIN} s"
    assert took >= HEADER_TIMEOUT * 0.5, f"closed after {took:.2f} s, before the bound"


def _authorised_head(cluster: LocalCluster, method: str, path: str, length: int) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: master\r\nAuthorization: Bearer {cluster.admin_token}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_slow_body_is_not_cut(slow: LocalCluster) -> None:
    body = json.dumps({"ids": [], "timeout": 0}).encode()  # ~25 bytes: 2.5 s at 0.1 s each
    with _connect(slow) as sock:
        sock.sendall(_authorised_head(slow, "POST", "/api/wait", len(body)))
        t0 = time.monotonic()
        for byte in body:
            readable, _, _ = select.select([sock], [], [], 0.1)  # the slow client's pace
            assert not readable, "the master answered, or closed, before the body was in"
            sock.sendall(bytes([byte]))
        assert time.monotonic() - t0 > 2 * HEADER_TIMEOUT
        status, answer = _answer(sock)
    assert status == 200, answer


def test_a_long_poll_and_a_followed_log_are_not_cut(slow: LocalCluster) -> None:
    client = slow.client()
    waited = client.submit(["sleep", "2.5"])
    t0 = time.monotonic()
    assert client.wait(waited.id, timeout=60)["state"] == "completed"
    assert time.monotonic() - t0 > 2 * HEADER_TIMEOUT  # one request, answered at the end
    followed = client.submit(["sh", "-c", "echo first; sleep 2.5; echo second"])
    records = list(client.stream(followed.id, follow=True, read_timeout=30))
    text = "".join(r.get("d", "") for r in records)
    assert text == "first\nsecond\n"
    assert records[-1].get("end") and records[-1]["state"] == "completed"


def test_an_address_at_its_cap_is_refused_at_once(slow: LocalCluster) -> None:
    held: list[socket.socket] = []
    with contextlib.ExitStack() as stack:
        # WebSockets (agents waiting to say hello here) are not counted once upgraded.
        for _ in range(PENDING_HELLOS):
            stack.enter_context(_agent_socket(slow, OTHER_ADDRESS))
        # Requests whose body never comes: their heads are in, so only the cap ends them.
        for _ in range(PER_ADDRESS):
            sock = stack.enter_context(_connect(slow, OTHER_ADDRESS))
            sock.sendall(_authorised_head(slow, "POST", "/api/wait", 100) + b"{")
            held.append(sock)
        with _connect(slow, OTHER_ADDRESS) as extra:
            t0 = time.monotonic()
            status, answer = _answer(extra)
            assert time.monotonic() - t0 < HEADER_TIMEOUT  # refused, not timed out
            assert status == 503
            detail = json.loads(answer)["detail"]
            assert detail.startswith(f"too many connections from {OTHER_ADDRESS} (at most 16")
        # The held ones were all taken: a refusal would be in their socket by now.
        for sock in held:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        assert slow.client().nodes()  # 127.0.0.1 is counted apart
        held.pop().close()

        def served_again() -> bool:
            with _connect(slow, OTHER_ADDRESS) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: master\r\nConnection: close\r\n\r\n")
                return _answer(sock)[0] == 200

        wait_for(served_again, timeout=30, what="a connection once one of the cap closed")


def _agent_socket(cluster: LocalCluster, source: str = "127.0.0.1") -> ClientConnection:
    url = f"ws://127.0.0.1:{cluster.port}/api/agent"
    return ws_connect(url, sock=_connect(cluster, source), open_timeout=10)


def test_agent_connections_beyond_the_hellos_awaited_are_closed(slow: LocalCluster) -> None:
    with contextlib.ExitStack() as stack:
        waiting = [stack.enter_context(_agent_socket(slow)) for _ in range(PENDING_HELLOS)]
        # Each says nothing: the master waits for their hellos.
        with _agent_socket(slow) as extra:
            with pytest.raises(ConnectionClosed) as closed:
                extra.recv(timeout=CLOSED_WITHIN)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        waiting.pop().close()

        def heard() -> bool:  # a hello is read again: this one is refused, not closed
            with _agent_socket(slow) as ws:
                ws.send("{}")
                try:
                    return json.loads(ws.recv(timeout=CLOSED_WITHIN))["type"] == "refused"
                except ConnectionClosed:
                    return False

        wait_for(heard, timeout=30, what="a hello read once one of the waiting closed")
    assert slow.wait_node("node001", "online")  # the real agent was never disturbed
