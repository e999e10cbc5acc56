"""A minimal HTTP/1.1 client for the one server it talks to: the mgpu master.

Why not `http.client`: it imports the `email` package to parse headers, which
costs about 40 ms — half of what `mgpu queue` may take in all (squeue answers in
well under 100 ms, and so must we).  The master is uvicorn, so the subset needed
is small and fixed: requests with a JSON body and Content-Length, responses with
Content-Length or chunked transfer encoding, keep-alive.  Anything else is an
error, not a guess.

Plain connections use `_socket` and `io` directly: the `socket` module imports `enum` and
`selectors` (about 2 ms of start-up).  TLS imports `ssl`, and `socket` with it, anyway.

A connection may be `watch`ed: each wait for the server's next bytes is then cut in slices,
and between two the watch is asked whether to go on waiting (it raises to give up: the
client of several masters looks whether another one leads meanwhile).  A slow answer that
comes is read as ever: nothing is cut but by the watch's raise or the socket's timeout.
"""

from __future__ import annotations

import _socket
import io

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    Watch = Callable[[float], float]
    """Called with the seconds waited so far for the server's next bytes (0: the wait
    begins): how long to wait before it is called again; raises to give the wait up."""

MAX_HEADER_LINE = 65536


class WireError(ConnectionError):
    """The connection broke or the server answered something this client does not speak."""


class Response:
    def __init__(self, status: int, headers: dict[str, str], conn: Connection) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self._left = None
        if length is not None:
            if not length.isdigit():
                raise WireError("bad Content-Length from the server")
            self._left = int(length)
        self.will_close = headers.get("connection", "").lower() == "close"

    def read(self) -> bytes:
        """The whole body."""
        if self.chunked:
            return b"".join(self._chunks())
        if self._left is None:
            data = self._conn.file.read()  # until the server closes
            self.will_close = True
            return data
        data = self._conn.file.read(self._left) if self._left else b""
        if len(data) != self._left:
            raise WireError("the master closed the connection mid-answer")
        self._left = 0
        return data

    def lines(self) -> Iterator[bytes]:
        """The body line by line, as it arrives (for streamed NDJSON)."""
        pending = b""
        source = self._chunks() if self.chunked else iter([self.read()])
        for chunk in source:
            pending += chunk
            while True:
                cut = pending.find(b"\n")
                if cut < 0:
                    break
                yield pending[: cut + 1]
                pending = pending[cut + 1 :]
        if pending:
            yield pending

    def _chunks(self) -> Iterator[bytes]:
        f = self._conn.file
        while True:
            size_line = f.readline(MAX_HEADER_LINE)
            if not size_line:
                raise WireError("the master closed the connection mid-answer")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise WireError("bad chunk size from the master") from None
            if size == 0:
                while f.readline(MAX_HEADER_LINE) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            data = f.read(size)
            f.read(2)  # CRLF after each chunk
            if len(data) != size:
                raise WireError("the master closed the connection mid-answer")
            yield data


class Connection:
    """One keep-alive connection; one request at a time (mgpu.Client pools them for threads)."""

    def __init__(
        self, host: str, port: int, connect_timeout: float, ssl_context: Any = None
    ) -> None:
        self.host = host
        self.port = port
        if ssl_context is None:
            sock: Any = _connect(host, port, connect_timeout)
        else:
            import socket

            sock = socket.create_connection((host, port), timeout=connect_timeout)
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self._reader = _SocketReader(sock)
        self.file = io.BufferedReader(self._reader)

    @property
    def watch(self) -> Watch | None:
        """Asked between slices of each wait for the server's bytes (see the module's text)."""
        return self._reader.watch

    @watch.setter
    def watch(self, watch: Watch | None) -> None:
        # Kept by the reader, which holds no reference back: a Connection dropped unclosed
        # is freed (its socket closed) at once, not left to the cycle collector.
        self._reader.watch = watch

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Response:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH", "DELETE"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.sendall(head + (body or b""))
        return self._response()

    def _response(self) -> Response:
        status_line = self.file.readline(MAX_HEADER_LINE)
        if not status_line:
            raise WireError("the master closed the connection without answering")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise WireError("the server did not answer in HTTP (is it an mgpu master?)")
        try:
            status = int(parts[1])
        except ValueError:
            raise WireError("bad HTTP status line from the server") from None
        headers: dict[str, str] = {}
        while True:
            line = self.file.readline(MAX_HEADER_LINE)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise WireError("the master closed the connection mid-answer")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return Response(status, headers, self)

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()


class _SocketReader(io.RawIOBase):
    """A socket as a raw stream, so that io.BufferedReader gives it readline and read: what
    `socket.makefile("rb")` does, for a `_socket.socket` as for an `ssl.SSLSocket`."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.watch: Watch | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.watch is not None:
            self._wait(self.watch)
        return int(self._sock.recv_into(buffer))

    def _wait(self, watch: Watch) -> None:
        """Until the socket has bytes to read: in slices as long as `watch` says, asking it
        between two (it raises to give up), within the socket's own timeout."""
        pending = getattr(self._sock, "pending", None)  # TLS: bytes already decrypted
        if pending is not None and pending():
            return
        import select
        import time

        limit = self._sock.gettimeout()
        began = time.monotonic()
        waited = 0.0
        while True:
            step = watch(waited)
            if limit is not None:
                step = min(step, limit - waited)
                if step <= 0:
                    raise TimeoutError("timed out")
            poller = select.poll()  # not select(): a descriptor past 1024 is fine here
            poller.register(self._sock, select.POLLIN)
            if poller.poll(step * 1000):
                return
            waited = time.monotonic() - began


def _connect(host: str, port: int, timeout: float) -> Any:
    """`socket.create_connection` on `_socket`: each address of `host` in turn."""
    error: OSError | None = None
    # An ASCII name as bytes: getaddrinfo would encode a str with the "idna" codec, whose
    # import (re, stringprep, enum) costs more than all the rest of `mgpu queue`.
    name = host.encode() if host.isascii() else host
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error or OSError(f"{host} has no address")
