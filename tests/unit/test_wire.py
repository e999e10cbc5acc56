"""The client's minimal HTTP/1.1 transport against canned server answers."""

from __future__ import annotations

import socket
import threading

import pytest

from mgpu.wire import Connection, WireError


def run_server(replies: list[bytes]) -> tuple[int, list[bytes], threading.Thread]:
    """A one-connection server: answers each request with the next canned reply (then
    closes) and records the raw requests it got."""
    seen: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            for reply in replies:
                data = b""
                while b"\r\n\r\n" not in data:
                    part = conn.recv(65536)
                    if not part:
                        return
                    data += part
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(rest) < length:
                    rest += conn.recv(65536)
                seen.append(head + b"\r\n\r\n" + rest)
                conn.sendall(reply)
        srv.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv.getsockname()[1], seen, thread


def test_content_length_keep_alive_and_request_format() -> None:
    port, seen, thread = run_server(
        [
            b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\ncontent-type: x\r\n\r\n{"a":1}',
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}",
        ]
    )
    conn = Connection("127.0.0.1", port, 5)
    r = conn.request("POST", "/api/jobs", b'{"x":2}', {"Authorization": "Bearer t"})
    assert (r.status, r.read()) == (200, b'{"a":1}')
    assert r.headers["content-type"] == "x"
    r2 = conn.request("GET", "/api/jobs/1", None, {})  # same connection
    assert (r2.status, r2.read()) == (404, b"{}")
    conn.close()
    thread.join(5)
    first = seen[0].decode()
    assert first.startswith("POST /api/jobs HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in first
    assert "Authorization: Bearer t\r\n" in first
    assert "Content-Length: 7\r\n" in first and first.endswith('{"x":2}')
    assert "Content-Length" not in seen[1].decode()  # a GET without a body


def test_chunked_body_and_lines_across_chunks() -> None:
    body = b'5\r\n{"a":\r\n6\r\n1}\n{"b\r\n5\r\n":2}\n\r\n0\r\n\r\n'
    port, _, thread = run_server([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body])
    conn = Connection("127.0.0.1", port, 5)
    r = conn.request("GET", "/stream", None, {})
    assert list(r.lines()) == [b'{"a":1}\n', b'{"b":2}\n']
    conn.close()
    thread.join(5)


@pytest.mark.parametrize(
    "reply",
    [
        b"",  # closed without answering
        b"SSH-2.0-OpenSSH\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # closed mid-answer
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk size
    ],
)
def test_broken_answers_are_errors(reply: bytes) -> None:
    port, _, thread = run_server([reply])
    conn = Connection("127.0.0.1", port, 5)
    with pytest.raises(WireError):
        r = conn.request("GET", "/", None, {})
        r.read()
    conn.close()
    thread.join(5)


def test_a_connection_dropped_unclosed_closes_its_socket_at_once() -> None:
    """No reference cycle keeps it: a Client made per call and never closed (a script's
    loop, a test's poll) must not leave its connections open on the master until the cycle
    collector runs, where they count against the per-address cap."""
    import gc

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    with srv:
        conn = Connection("127.0.0.1", srv.getsockname()[1], 5)
        conn.watch = lambda waited: 0.1  # the watch a leader-watched wait sets
        accepted, _ = srv.accept()
        with accepted:
            accepted.settimeout(5)
            gc.disable()
            try:
                del conn
                assert accepted.recv(1) == b""  # closed from the client's side
            finally:
                gc.enable()
