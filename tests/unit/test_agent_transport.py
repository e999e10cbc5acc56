"""An agent's guess of a loopback master's transport heals: a TLS guess made after a cut
handshake (a master re-executing itself) goes back to plain when the master answers a TLS
hello in plain HTTP, instead of failing every dial for ever."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from mgpu.agent.agent import Agent
from mgpu.agent.options import AgentOptions


@contextmanager
def plain_http_server() -> Iterator[int]:
    """A loopback port that answers anything, a TLS hello too, with an HTTP 400 (as a
    plain uvicorn does)."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=10)
        sock.close()


def _agent(tmp_path: Path, port: int) -> Agent:
    options = AgentOptions(
        node_id="n1", master_host="127.0.0.1", master_port=port, state_dir=tmp_path
    )
    return Agent(options)


def test_a_tls_guess_on_a_plain_loopback_master_goes_back_to_plain(tmp_path: Path) -> None:
    with plain_http_server() as port:
        agent = _agent(tmp_path, port)
        master = ("127.0.0.1", port)
        assert agent.transport.tls(master) is False and agent.transport.may_switch(master)
        agent.transport.switch(master, True)  # what a cut handshake leaves behind
        agent._ssl_context = ssl.create_default_context()  # the CA as fetched before
        with pytest.raises(ssl.SSLError):
            asyncio.run(agent._session())
        assert agent.transport.tls(master) is False  # the next dial is plain again


def test_a_certificate_that_is_not_the_clusters_never_makes_it_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _agent(tmp_path, 9)
    master = ("127.0.0.1", 9)
    agent.transport.switch(master, True)
    agent._choose_tls()

    @asynccontextmanager
    async def refused(*_: object, **__: object) -> AsyncIterator[None]:
        raise ssl.SSLCertVerificationError("certificate verify failed")
        yield

    agent._ssl_context = ssl.create_default_context()
    monkeypatch.setattr("mgpu.agent.agent.open_link", refused)
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(agent._session())
    assert agent.transport.tls(master) is True
