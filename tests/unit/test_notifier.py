"""Notifications (master/control/notify.py) without a network: which addresses are public,
IPv6 forms that embed an IPv4 address included (numeric addresses only, no name is ever
looked up), and the queues that keep one user's flood from delaying another's."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from mgpu import spec as specs
from mgpu.config import Notify
from mgpu.master.control import notify, notifytargets
from mgpu.master.control.notify import Delivery, Notifier
from mgpu.master.control.notifytargets import Target, check_target

EMBEDDED_PRIVATE = [
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:0:10.0.0.1",  # SIIT
    "64:ff9b::169.254.169.254",  # NAT64: the cloud metadata service
    "64:ff9b::7f00:1",
    "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
]
EMBEDDED_PUBLIC = ["::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1", "2606:4700::1111"]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
def test_an_ipv6_form_of_a_private_ipv4_address_is_refused(address: str) -> None:
    assert not notifytargets.is_public(address)
    with pytest.raises(specs.SpecError, match="loopback, link-local or private"):
        check_target(f"http://[{address}]/hook", Notify())
    assert check_target(f"http://[{address}]/hook", Notify(allowed_hosts=[address])) is not None


@pytest.mark.parametrize("address", EMBEDDED_PUBLIC)
def test_an_ipv6_form_of_a_public_ipv4_address_is_public(address: str) -> None:
    assert notifytargets.is_public(address)
    assert check_target(f"http://[{address}]/hook", Notify()) is not None


def test_a_delivery_checks_the_embedded_address_too() -> None:
    target = Target("webhook", "http://[::ffff:127.0.0.1]:9/x", "::ffff:127.0.0.1", 9)
    with pytest.raises(notify.RefusedTarget, match="not a public address"):
        asyncio.run(Notifier(Notify(), lambda _: 0, lambda *_: [])._addresses(target, True))


def test_httpx_lines_show_a_webhooks_scheme_and_host_only() -> None:
    import httpx

    url = httpx.URL("https://10.0.0.9:8443/services/T0/B1/s3cr3t?x=1")
    args = ("POST", url, "HTTP/1.1", 200, "OK")
    record = logging.LogRecord(
        "httpx", logging.INFO, __file__, 1, 'HTTP Request: %s %s "%s %d %s"', args, None
    )
    assert notify._ORIGIN_ONLY.filter(record)
    assert record.getMessage() == 'HTTP Request: POST https://10.0.0.9:8443 "HTTP/1.1 200 OK"'


# ---- queues ---------------------------------------------------------------------------


class Harness:
    """A notifier whose deliveries go nowhere: each waits until the test lets its receiver
    answer (`answer`), so who is being sent, in what order, is what the test sees."""

    def __init__(self) -> None:
        self.n = Notifier(Notify(), lambda _: 0, lambda *_: [])
        self.started: list[tuple[str, str]] = []
        self.answered: dict[str, asyncio.Event] = {}
        self.n.deliver = self._deliver  # type: ignore[method-assign]

    async def _deliver(self, delivery: Delivery, delays: Any = ()) -> bool:
        host = delivery.target.host
        self.started.append((delivery.user, host))
        await self.answered.setdefault(host, asyncio.Event()).wait()
        self.n.sent += 1
        return True

    def put(self, user: str, host: str, n: int = 1) -> int:
        target = Target("webhook", f"https://{host}/hook", host)
        kept = 0
        for i in range(n):
            kept += self.n.put(Delivery(target, {"job_id": f"{user}{i}", "user": user}))
        return kept

    def answer(self, host: str) -> None:
        self.answered.setdefault(host, asyncio.Event()).set()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_flood_to_a_silent_receiver_drops_only_its_own(caplog: Any) -> None:
    """2,100 of alice's to a receiver that never answers: hers past the bound are dropped
    (logged once), bob's is sent at once."""

    async def scenario() -> Harness:
        h = Harness()
        runner = asyncio.create_task(h.n.run())
        assert h.put("alice", "silent.example", 2100) == notify.MAX_PER_RECEIVER
        assert h.put("bob", "hooks.example") == 1
        await settle()
        assert ("bob", "hooks.example") in h.started
        h.answer("hooks.example")
        await settle()
        assert h.n.sent == 1
        alices = h.started.count(("alice", "silent.example"))
        assert alices == notify.ACTIVE_PER_RECEIVER  # the rest wait behind those
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return h

    with caplog.at_level(logging.WARNING, "mgpu.master"):
        h = asyncio.run(scenario())
    assert h.n.dropped == 2100 - notify.MAX_PER_RECEIVER
    (line,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "alice" in line and "silent.example" in line


def test_one_user_is_bounded_across_receivers_and_everyone_in_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(notify, "MAX_PENDING", notify.MAX_PER_USER + 10)
    h = Harness()
    kept = sum(h.put("alice", f"r{i}.example", 400) for i in range(4))
    assert kept == notify.MAX_PER_USER  # not 4 x 400
    assert h.put("bob", "hooks.example", 20) == 10  # the total bound
    assert h.n.dropped == 4 * 400 - notify.MAX_PER_USER + 10
    assert h.n.pending == notify.MAX_PENDING


def test_queues_take_turns() -> None:
    """Receivers answer at once: each round starts one of each queue, so bob's one
    delivery goes second, not after alice's hundred."""

    async def scenario() -> list[tuple[str, str]]:
        h = Harness()
        for host in ("a.example", "b.example", "hooks.example"):
            h.answer(host)
        h.put("alice", "a.example", 100)
        h.put("alice", "b.example", 100)
        h.put("bob", "hooks.example")
        runner = asyncio.create_task(h.n.run())
        while h.n.pending:
            await asyncio.sleep(0)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return h.started

    started = asyncio.run(scenario())
    assert len(started) == 201
    assert started.index(("bob", "hooks.example")) < 3
    assert started[:2] != [("alice", "a.example")] * 2  # alice's two receivers alternate


def test_a_users_active_deliveries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Silent receivers of one user's never take more than ACTIVE_PER_USER sends."""

    async def scenario() -> Harness:
        h = Harness()
        runner = asyncio.create_task(h.n.run())
        for i in range(3 * notify.ACTIVE_PER_USER):
            h.put("alice", f"r{i}.example", 2)
        h.put("bob", "hooks.example")
        await settle()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return h

    h = asyncio.run(scenario())
    alices = [s for s in h.started if s[0] == "alice"]
    assert len(alices) == notify.ACTIVE_PER_USER
    assert ("bob", "hooks.example") in h.started
