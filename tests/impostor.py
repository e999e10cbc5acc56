"""A plain-HTTP impostor on a master's port: what any local account could bind while the
master is down.  It records every byte each connection sends it (a WebSocket's messages
unmasked), answers an HTTP request as a master would, and accepts an agent's WebSocket:
reads its hello and answers with the frames it was given (a Welcome, a Launch).

A TLS client's first bytes (a ClientHello) are recorded and the connection closed: the
impostor has no certificate of the cluster's CA to offer.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
from typing import Any

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
QUEUE = json.dumps({"jobs": [], "nodes": []}).encode()


class Impostor:
    def __init__(self, port: int = 0, frames: list[dict[str, Any]] | None = None) -> None:
        self.frames = frames or []
        self.received: list[bytes] = []
        """Per connection: everything it sent (WebSocket payloads unmasked)."""
        self.tls_hellos = 0
        """Connections that opened with a TLS handshake."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        self.port = int(self._sock.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._closing = False
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    def __enter__(self) -> Impostor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def everything(self) -> bytes:
        with self._lock:
            return b"".join(self.received)

    def connections(self) -> int:
        with self._lock:
            return len(self.received)

    def wait_connections(self, count: int, timeout: float = 60.0) -> None:
        """Until `count` connections were recorded in all (AssertionError after timeout)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(f"the impostor saw {len(self.received)} connections")

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=10)

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
                index = len(self.received)
                self.received.append(b"")
            thread = threading.Thread(target=self._serve, args=(conn, index), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _record(self, index: int, data: bytes) -> None:
        with self._changed:
            self.received[index] += data
            self._changed.notify_all()

    def _serve(self, conn: socket.socket, index: int) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
                self._record(index, data)
                if head[:1] == b"\x16":  # a TLS ClientHello: no certificate to answer with
                    with self._lock:
                        self.tls_hellos += 1
                    return
            if b"upgrade: websocket" not in head.lower():
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(QUEUE), QUEUE)
                )
                return
            self._websocket(conn, index, head)

    def _websocket(self, conn: socket.socket, index: int, head: bytes) -> None:
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        self._record(index, _read_frame(conn))  # the hello
        for frame in self.frames:
            payload = json.dumps(frame).encode()
            conn.sendall(_frame_header(len(payload)) + payload)
        while True:  # whatever the agent says next (a Started, output...)
            self._record(index, _read_frame(conn))


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _read_frame(conn: socket.socket) -> bytes:
    """One client frame's payload, unmasked."""
    _, second = _read_exact(conn, 2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", _read_exact(conn, 2))
    elif length == 127:
        (length,) = struct.unpack("!Q", _read_exact(conn, 8))
    mask = _read_exact(conn, 4) if second & 0x80 else b"\0\0\0\0"
    data = _read_exact(conn, length)
    return bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _frame_header(length: int) -> bytes:
    """A server's unmasked text frame header."""
    if length < 126:
        return bytes([0x81, length])
    if length < 65536:
        return bytes([0x81, 126]) + struct.pack("!H", length)
    return bytes([0x81, 127]) + struct.pack("!Q", length)
