"""The client's small WebSocket (mgpu.client.websocket) against a canned server on a
socket pair: the handshake, frames that arrive with it, masking, fragments, ping, close."""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Iterator

import pytest

from mgpu.client.websocket import BINARY, GUID, TEXT, HandshakeError, WebSocket


def frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A server frame (unmasked)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        return head + bytes([n]) + payload
    if n < 1 << 16:
        return head + bytes([126]) + n.to_bytes(2, "big") + payload
    return head + bytes([127]) + n.to_bytes(8, "big") + payload


def unmask(data: bytes) -> tuple[int, bytes]:
    """(opcode, payload) of one client frame, which must be masked."""
    assert data[1] & 0x80, "client frames are masked"
    n, at = data[1] & 0x7F, 2
    if n == 126:
        n, at = int.from_bytes(data[2:4], "big"), 4
    key, body = data[at : at + 4], data[at + 4 : at + 4 + n]
    return data[0] & 0x0F, bytes(b ^ key[i % 4] for i, b in enumerate(body))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    client, server = socket.socketpair()
    client.settimeout(5)
    server.settimeout(5)
    yield client, server
    client.close()
    server.close()


def accept(server: socket.socket, extra: bytes = b"") -> None:
    """Read the client's handshake and answer it, `extra` in the same write."""
    request = b""
    while b"\r\n\r\n" not in request:
        request += server.recv(4096)
    key = next(
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    accept_key = base64.b64encode(hashlib.sha1(key + GUID).digest())
    answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    server.sendall(answer + b"Sec-WebSocket-Accept: " + accept_key + b"\r\n\r\n" + extra)


def open_ws(client: socket.socket, server: socket.socket, extra: bytes = b"") -> WebSocket:
    import threading

    t = threading.Thread(target=accept, args=(server, extra))
    t.start()
    ws = WebSocket.open(client, "h:1", "/x", {})
    t.join()
    return ws


def test_frames_sent_with_the_handshake_are_not_left_waiting(
    pair: tuple[socket.socket, ...],
) -> None:
    client, server = pair
    ws = open_ws(client, server, frame(TEXT, b'{"attached": "j"}\n') + frame(TEXT, b"two"))
    # The socket has nothing more to read: a loop that waited on it would wait for ever.
    assert ws.buffered()
    client.settimeout(0.2)
    assert ws.feed() == [(TEXT, b'{"attached": "j"}\n'), (TEXT, b"two")]
    assert not ws.buffered() and not ws.closed


def test_a_partial_frame_is_not_buffered_until_its_rest_arrives(
    pair: tuple[socket.socket, ...],
) -> None:
    client, server = pair
    whole = frame(BINARY, b"x" * 300)  # a 16-bit length
    ws = open_ws(client, server, whole[:100])
    assert not ws.buffered()
    server.sendall(whole[100:])
    assert ws.feed() == [(BINARY, b"x" * 300)]


def test_fragments_are_joined_pings_answered_and_frames_masked(
    pair: tuple[socket.socket, ...],
) -> None:
    client, server = pair
    ws = open_ws(client, server)
    server.sendall(frame(TEXT, b"he", fin=False) + frame(0x9, b"p") + frame(0x0, b"llo"))
    assert ws.feed() == [(TEXT, b"hello")]
    assert unmask(server.recv(4096)) == (0xA, b"p")  # the pong, masked
    ws.send_binary(b"\x03")
    assert unmask(server.recv(4096)) == (BINARY, b"\x03")
    server.sendall(frame(0x8, (1000).to_bytes(2, "big")))
    assert ws.feed() == [] and ws.closed


def test_a_refused_handshake_says_why(pair: tuple[socket.socket, ...]) -> None:
    client, server = pair
    body = b'{"detail": "not authorised: no token given"}'
    head = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n" % len(body)
    server.sendall(head + body)
    with pytest.raises(HandshakeError) as e:
        WebSocket.open(client, "h:1", "/x", {})
    assert (e.value.status, e.value.detail) == (401, "not authorised: no token given")
