"""A small WebSocket client (RFC 6455) on the client's own connections (mgpu.wire).

What `mgpu srun --pty` and `mgpu alloc` need and no more: the opening handshake on a
plain or TLS socket, masked frames out (text and binary), whole messages in (fragments
joined), pings answered, the closing handshake.  No extensions (no compression: a
keystroke is a few bytes).  It is driven by the caller's own `select` loop: `fileno()`
to wait on, `feed()` when readable.  The standard library has no WebSocket client, and
the CLI takes none from outside.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, BINARY, CLOSE, PING, PONG, CONTINUATION = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0
MAX_MESSAGE = 64 << 20
MAX_HEAD = 64 * 1024


class ProtocolError(ConnectionError):
    """The server answered, but not as a WebSocket server should."""


class HandshakeError(ProtocolError):
    """The server did not upgrade; `status` and `detail` say what it answered instead."""

    def __init__(
        self, status: int, detail: str, standby: bool = False, leader: str | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.standby = standby
        """A standby master refused it (503, `"role": "standby"`)."""
        self.leader = leader
        """Where that standby says the leader is (its `leader`, or `X-Mgpu-Leader`)."""


def _mask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    if not n:
        return payload
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


class WebSocket:
    def __init__(self, sock: Any, leftover: bytes = b"") -> None:
        self.sock = sock
        self._buffer = bytearray(leftover)
        self._parts: list[bytes] = []
        self._kind = 0
        self.closed = False

    @classmethod
    def open(cls, sock: Any, host: str, path: str, headers: dict[str, str]) -> WebSocket:
        """The opening handshake on a connected socket (blocking, under its timeout)."""
        import base64
        import hashlib

        key = base64.b64encode(os.urandom(16))
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket"]
        lines += ["Connection: Upgrade", f"Sec-WebSocket-Key: {key.decode()}"]
        lines += ["Sec-WebSocket-Version: 13", *(f"{k}: {v}" for k, v in headers.items())]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(4096)
            if not data:
                raise ConnectionError("the master closed the connection during the handshake")
            head += data
            if len(head) > MAX_HEAD:
                raise ProtocolError("the master's answer to the handshake is too long")
        head, _, rest = head.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError("the server did not answer in HTTP (is it an mgpu master?)")
        status = int(parts[1])
        fields = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if status != 101:
            detail, standby, leader = _refusal(sock, rest, fields, status)
            raise HandshakeError(status, detail, standby, leader)
        expected = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        if fields.get("sec-websocket-accept") != expected:
            raise ProtocolError("the master's WebSocket handshake is not valid")
        return cls(sock, rest)

    def fileno(self) -> int:
        return int(self.sock.fileno())

    def buffered(self) -> bool:
        """Is a message here already, which waiting on `fileno()` would not tell?  (Frames
        that came with the handshake's answer; bytes TLS decrypted ahead.)  The caller's
        loop must `feed()` without waiting while this is true."""
        pending = getattr(self.sock, "pending", None)
        return (pending is not None and pending() > 0) or self._whole_frame()

    def _whole_frame(self) -> bool:
        buf = self._buffer
        if len(buf) < 2:
            return False
        n, at = buf[1] & 0x7F, 2
        if n >= 126:
            at = 4 if n == 126 else 10
            if len(buf) < at:
                return False
            n = int.from_bytes(buf[2:at], "big")
        return len(buf) >= at + (4 if buf[1] & 0x80 else 0) + n

    # ---- out ------------------------------------------------------------------

    def _send(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytearray([0x80 | opcode])
        if n < 126:
            head.append(0x80 | n)
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        key = os.urandom(4)  # client frames are masked (RFC 6455 5.3)
        self.sock.sendall(bytes(head) + key + _mask(payload, key))

    def send_text(self, text: str) -> None:
        self._send(TEXT, text.encode())

    def send_binary(self, data: bytes) -> None:
        self._send(BINARY, data)

    def close(self) -> None:
        """Say goodbye (best effort) and close the socket."""
        if not self.closed:
            self.closed = True
            try:
                self._send(CLOSE, (1000).to_bytes(2, "big"))
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass

    # ---- in -------------------------------------------------------------------

    def feed(self) -> list[tuple[int, bytes]]:
        """Read what has arrived (call when `fileno()` is readable); returns the whole
        messages it completed as (TEXT or BINARY, payload).  After the server's close, or
        at the end of the connection, `closed` is set."""
        if self._whole_frame():  # what is here first: the socket may have nothing (blocking)
            return self._messages()
        try:
            data = self.sock.recv(65536)
            pending = getattr(self.sock, "pending", None)  # TLS: bytes already decrypted
            while pending is not None and pending():
                data += self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return self._messages()
        self._buffer += data
        return self._messages()

    def _messages(self) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while (frame := self._frame()) is not None:
            fin, opcode, payload = frame
            if opcode == PING:
                self._send(PONG, payload)
            elif opcode == CLOSE:
                self.close()
                break
            elif opcode == PONG:
                continue
            else:
                if opcode != CONTINUATION:
                    self._kind, self._parts = opcode, []
                self._parts.append(payload)
                if sum(len(p) for p in self._parts) > MAX_MESSAGE:
                    raise ProtocolError("the master sent a message that is too large")
                if fin:
                    out.append((self._kind, b"".join(self._parts)))
                    self._parts = []
        return out

    def _frame(self) -> tuple[bool, int, bytes] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        fin, opcode = bool(buf[0] & 0x80), buf[0] & 0x0F
        masked, n = bool(buf[1] & 0x80), buf[1] & 0x7F
        at = 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, at = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, at = int.from_bytes(buf[2:10], "big"), 10
        key = b""
        if masked:  # servers do not mask, but a frame that is must still parse
            key, at = bytes(buf[at : at + 4]), at + 4
        if len(buf) < at + n:
            return None
        payload = bytes(buf[at : at + n])
        del buf[: at + n]
        return fin, opcode, _mask(payload, key) if masked else payload


def _refusal(
    sock: Any, rest: bytes, fields: dict[str, str], status: int
) -> tuple[str, bool, str | None]:
    """The `detail` of a refusal's JSON body (else a phrase naming the status), whether a
    standby master said it, and where it says the leader is."""
    length = fields.get("content-length", "")
    body = rest
    if length.isdigit():
        want = min(int(length), MAX_HEAD)
        try:
            while len(body) < want:
                data = sock.recv(want - len(body))
                if not data:
                    break
                body += data
        except OSError:
            pass
    from mgpu.client import jsonlite as json

    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        payload = {}
    detail = payload.get("detail")
    leader = payload.get("leader")
    leader = leader if isinstance(leader, str) and leader else fields.get("x-mgpu-leader")
    standby = payload.get("role") in ("standby", "leader")  # a leader still opening too
    shown = detail if isinstance(detail, str) else f"the master answered HTTP {status}"
    return shown, standby, leader or None
