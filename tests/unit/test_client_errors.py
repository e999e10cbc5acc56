"""The client against masters that misbehave on loopback, and its token table."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu.client.api import Client, MgpuError
from mgpu.client.render import render_tokens


class SlowPlainMaster:
    """A plain-HTTP server on loopback that answers a request only after `delay` seconds,
    and anything that is not HTTP at once with a 400, as uvicorn does to a TLS hello."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            first = conn.recv(65536)
            if not first.startswith(b"GET "):
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            if self.stop.wait(self.delay):
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n")
            conn.sendall(b'{"jobs": [], "nodes": []}')
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        for s in [self.sock, *self.conns]:
            s.close()


@pytest.fixture
def slow_master() -> Iterator[SlowPlainMaster]:
    server = SlowPlainMaster(delay=3.0)
    try:
        yield server
    finally:
        server.close()


def test_a_slow_answer_on_loopback_is_a_timeout_not_a_tls_failure(
    slow_master: SlowPlainMaster,
) -> None:
    token = "mgpu_x." + "ab" * 32  # names a CA: a switch to TLS would go on to try it
    client = Client(f"127.0.0.1:{slow_master.port}", token=token, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(MgpuError) as info:
        client.queue()
    assert time.monotonic() - t0 < 2.5
    assert (
        str(info.value) == f"the mgpu master at 127.0.0.1:{slow_master.port} did not answer in time"
    )
    assert client.tls is False  # still plain HTTP: the next call may well be answered
    slow_master.delay = 0.0
    assert client.queue() == {"jobs": [], "nodes": []}


def test_a_connection_closed_at_once_on_loopback_tries_tls() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def close_each() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()  # as a TLS-only master does with a plain HTTP request

    threading.Thread(target=close_each, daemon=True).start()
    try:
        client = Client(f"127.0.0.1:{port}", token="mgpu_no_fingerprint", timeout=5)
        with pytest.raises(MgpuError, match="uses TLS and no token names its CA"):
            client.queue()
        assert client.tls is True
    finally:
        srv.close()


def test_token_table_shows_owner_and_allow_root() -> None:
    base = {"kind": "user", "admin": False, "revoked": None, "created": 1.7e9}
    tokens = [
        {**base, "id": "t1", "user": "root", "admin": True, "owner": True, "allow_root": True},
        {**base, "id": "t2", "user": "bob", "owner": False, "allow_root": False},
        {**base, "id": "t3", "user": "ci", "owner": False, "allow_root": True},
    ]
    header, *rows = render_tokens(tokens).splitlines()
    columns = ["ID", "USER", "KIND", "ADMIN", "OWNER", "ALLOW ROOT", "CREATED", "REVOKED"]
    starts = [header.index(c) for c in columns]
    assert starts == sorted(starts)

    def cell(row: str, column: str) -> str:
        i = columns.index(column)
        end = starts[i + 1] if i + 1 < len(columns) else None
        return row[starts[i] : end].strip()

    shown = {cell(r, "ID"): (cell(r, "OWNER"), cell(r, "ALLOW ROOT")) for r in rows}
    assert shown == {"t1": ("yes", "yes"), "t2": ("", ""), "t3": ("", "yes")}


def test_an_id_with_a_slash_is_refused_before_it_reaches_the_master() -> None:
    # The server decodes %2F and matches no route: the user got a bare "Not Found".
    client = Client("127.0.0.1:9")  # nothing listens: refused before any connection
    for call in (client.show, client.cancel):
        with pytest.raises(MgpuError, match=r"no job, node, step or token is called '\.\./x'"):
            call("../x")


def test_an_advertise_ip_that_is_not_an_ip_is_one_line_before_the_agent_starts(
    tmp_path: Path,
) -> None:
    """The master refuses a hello whose ip is not an IP address: the agent says so at once."""
    argv = [str(Path(sys.executable).parent / "mgpu"), "node", "--node-id", "n1"]
    argv += ["--advertise-ip", "gpu01.lab", "--master-port", "1", "--state-dir", str(tmp_path)]
    res = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (res.returncode, res.stderr) == (
        2,
        "mgpu: error: --advertise-ip 'gpu01.lab' is not an IP address\n",
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)
def test_a_hostname_the_master_would_refuse_is_one_line_before_the_agent_starts(
    tmp_path: Path,
) -> None:
    """A hostname goes into MPI hostfiles, so the master refuses one with a space in it: the
    agent says so at once instead of retrying its hello for ever.  (A UTS namespace of its
    own gives the agent that hostname; the machine's is untouched.)"""
    mgpu = str(Path(sys.executable).parent / "mgpu")
    rename = "import socket, sys; socket.sethostname(sys.argv[1])"  # hostname(1) checks it
    script = f'"{sys.executable}" -c "{rename}" "gpu01 slots=99" && exec "$@"'
    argv = ["unshare", "--uts", "sh", "-c", script, "sh", mgpu, "node", "--node-id", "n1"]
    argv += ["--master-port", "1", "--state-dir", str(tmp_path)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2, res.stderr
    assert res.stderr == (
        "mgpu: error: this machine's hostname cannot join: 'gpu01 slots=99' is not a host name"
        " (letters, digits, '-', '.', '_')\n"
    )
