"""An agent of several masters watches for the leader (mgpu.agent.link.watch_leader): while
linked to one master it asks the others' `/readyz`; once another leads it closes its link
and names it (its old master was cut off from the database: its lease ran out and another
took over), and while none leads (a paused database) it stays.  Stand-in masters on
loopback."""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from factories import http_server
from mgpu.agent import link
from mgpu.masters import Transport


class _Readyz(BaseHTTPRequestHandler):
    status: ClassVar[int] = 503

    def do_GET(self) -> None:
        data = json.dumps({"ready": self.status == 200}).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class Leader(_Readyz):
    status = 200


class Standby(_Readyz):
    status = 503


class _Ws:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link, "WATCH_EVERY", 0.05)


def test_the_link_is_left_for_the_master_that_leads_now() -> None:
    here = ("127.0.0.1", 9)  # never asked: the master it is linked to
    with http_server(Standby) as standby, http_server(Leader) as leader:
        masters = [here, _address(standby), _address(leader)]
        ws = _Ws()
        found = asyncio.run(
            asyncio.wait_for(
                link.watch_leader(here, masters, Transport("http", None), None, ws), 30
            )
        )
    assert found == _address(leader) and ws.closed


def test_while_no_other_master_leads_the_link_stays() -> None:
    here = ("127.0.0.1", 9)
    with http_server(Standby) as standby:
        ws = _Ws()

        async def watch() -> None:
            masters = [here, _address(standby)]
            await link.watch_leader(here, masters, Transport("http", None), None, ws)

        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(watch(), 1.0))  # some 20 askings
    assert not ws.closed
