"""Master <-> agent messages: typed parsing, and many messages to a frame."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from factories import websocket_scope
from helpers import until
from mgpu.config import ClusterConfig
from mgpu.master.control.cluster import Cluster
from mgpu.master.state.registry import AgentLink, Unsendable
from mgpu.protocol import (
    PROTOCOL_VERSION,
    Exited,
    Forget,
    Heartbeat,
    Hello,
    HelloError,
    Kill,
    Started,
    batch_frames,
    encode,
    parse_agent_messages,
    parse_hello,
    parse_master_messages,
)


def test_a_single_message_and_a_batch_parse_alike() -> None:
    started = Started(job_id="a1b2c3d4", epoch=1, pid=42, hostname="h", ip="1.2.3.4", time=1.0)
    exited = Exited(job_id="a1b2c3d4", epoch=1, exit_code=3, time=2.0)
    (one,) = parse_agent_messages(encode(started))
    assert one == started
    frames = batch_frames([encode(started), encode(exited), encode(Heartbeat())])
    assert len(frames) == 1 and frames[0].startswith("[")
    assert parse_agent_messages(frames[0]) == [started, exited, Heartbeat()]
    forget = Forget(job_id="a1b2c3d4", epoch=1)
    assert parse_master_messages(batch_frames([encode(forget)] * 2)[0]) == [forget, forget]


def test_batches_respect_the_frame_limit_and_keep_order() -> None:
    items = [encode(Exited(job_id=f"{i:08x}", epoch=1, exit_code=0, time=0.0)) for i in range(50)]
    frames = batch_frames(items, limit=500)
    assert len(frames) > 1
    assert all(len(f) <= 500 + max(map(len, items)) for f in frames)
    flat = [m for f in frames for m in parse_agent_messages(f)]
    assert [m.job_id for m in flat] == [json.loads(i)["job_id"] for i in items]


def test_unknown_or_malformed_messages_are_refused() -> None:
    with pytest.raises(ValidationError):
        parse_agent_messages('{"type": "launch_missiles"}')
    with pytest.raises(ValidationError):
        parse_agent_messages('[{"type": "exited", "job_id": "x"}]')  # fields missing


# ---- one bad message costs only itself ---------------------------------------


def test_one_invalid_message_in_a_frame_is_skipped_and_the_rest_kept() -> None:
    good = [Heartbeat(), Exited(job_id="a1b2c3d4", epoch=1, exit_code=0, time=1.0)]
    frame = (
        "["
        + ",".join(
            [
                encode(good[0]),
                '{"type": "launch_missiles"}',
                '{"type": "exited", "job_id": "x"}',  # fields missing
                '{"type": "output", "job_id": "\\ud800", "epoch": 1, "stream": "o", "data": ""}',
                encode(good[1]),
            ]
        )
        + "]"
    )
    errors: list[str] = []
    assert parse_agent_messages(frame, errors) == good
    assert len(errors) == 3
    assert errors[0].startswith("message 1 (launch_missiles): ")
    assert errors[1].startswith("message 2 (exited): ") and "epoch" in errors[1]
    with pytest.raises(ValueError):
        parse_agent_messages("[not json", [])


class FakeWebSocket:
    """Collects what a link would send."""

    def __init__(self) -> None:
        self.frames: list[str] = []
        self.closed = False

    async def send_text(self, text: str) -> None:
        text.encode()  # as a real WebSocket: text must be valid UTF-8
        self.frames.append(text)

    async def close(self) -> None:
        self.closed = True


def _sent(link: AgentLink) -> list[Any]:
    out = []
    while not link.outbox.empty():
        item = link.outbox.get_nowait()
        assert item is not None
        out += parse_master_messages(item)
    return out


def test_a_message_that_cannot_be_encoded_is_refused_alone() -> None:
    link = AgentLink("n1", FakeWebSocket())
    with pytest.raises(Unsendable, match="lone surrogate"):
        link.send(Kill(job_id="a1b2c3d4", reason="bad \ud800"))
    link.send(Forget(job_id="a1b2c3d4", epoch=1))
    assert _sent(link) == [Forget(job_id="a1b2c3d4", epoch=1)]
    assert not link.closed


def test_acknowledgements_alone_wait_for_the_next_message_to_share_its_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Forget waits (at most ACK_WAIT) for the next message to the agent, and both go in
    one frame; a Forget with nothing after it still goes out on its own."""
    from mgpu.master.state import registry
    from mgpu.master.state.registry import ACK

    monkeypatch.setattr(registry, "ACK_WAIT", 0.5)  # ample on a loaded machine

    forget = Forget(job_id="a1b2c3d4", epoch=1)
    assert encode(forget).startswith(ACK)  # how the link tells an acknowledgement
    kill = Kill(job_id="e5f6a7b8", reason="cancelled")

    async def main() -> tuple[list[str], list[str]]:
        ws = FakeWebSocket()
        link = AgentLink("n1", ws)
        writer = asyncio.create_task(link.writer())
        link.send(forget)
        await asyncio.sleep(0.02)
        assert ws.frames == []  # still waiting for company
        link.send(kill)
        await until(lambda: len(ws.frames) == 1, timeout=30, what="the shared frame")
        together = list(ws.frames)
        link.send(forget)
        await until(lambda: len(ws.frames) == 2, timeout=30, what="the lone Forget's frame")
        link.close()
        await asyncio.wait_for(writer, 5)
        return together, ws.frames[1:]

    together, alone = asyncio.run(main())
    assert [parse_master_messages(f) for f in together] == [[forget, kill]]
    assert [parse_master_messages(f) for f in alone] == [[forget]]


def test_the_agent_channel_survives_a_bad_message_and_a_failing_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Driven through the master's ASGI app: in one frame, a message whose handling raises,
    an invalid one and a valid one; the first two are logged, the third handled, and the
    connection stays open."""
    from mgpu.master.http.app import create_app

    original = Cluster.agent_message

    def agent_message(self: Cluster, node_id: str, msg: Any) -> None:
        if isinstance(msg, Heartbeat) and msg.telemetry == []:
            raise RuntimeError("a bug in a handler")
        original(self, node_id, msg)

    monkeypatch.setattr(Cluster, "agent_message", agent_message)
    app = create_app(tmp_path, ClusterConfig())
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[dict[str, Any]] = []
    scope = websocket_scope()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def texts(n: int) -> list[Any]:
        async def enough() -> None:
            while len([m for m in sent if m["type"] == "websocket.send"]) < n:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(enough(), timeout=10)
        return [parse_master_messages(m["text"]) for m in sent if m["type"] == "websocket.send"]

    async def main() -> None:
        async with app.router.lifespan_context(app):
            join = (tmp_path / "join-token").read_text().strip()
            hello = Hello(node_id="n1", hostname="h", ip="127.0.0.1", gpus=[], token=join)
            await inbox.put({"type": "websocket.connect"})
            await inbox.put({"type": "websocket.receive", "text": encode(hello)})
            channel = asyncio.create_task(app(scope, inbox.get, send))  # type: ignore[arg-type]
            assert (await texts(1))[0][0].type == "welcome"
            started = Started(
                job_id="a1b2c3d4", epoch=3, pid=1, hostname="h", ip="10.0.0.1", time=1.0
            )
            frame = f'[{encode(Heartbeat())},{{"type": "bogus"}},{encode(started)}]'
            await inbox.put({"type": "websocket.receive", "text": frame})
            (reply,) = (await texts(2))[1]  # the valid message was handled: a stale run
            assert isinstance(reply, Kill) and reply.job_id == "a1b2c3d4"
            assert reply.reason == "stale"
            assert not any(m["type"] == "websocket.close" for m in sent)
            assert not channel.done()
            await inbox.put({"type": "websocket.disconnect", "code": 1000})
            await asyncio.wait_for(channel, timeout=10)

    with caplog.at_level("WARNING", logger="mgpu.master"):
        asyncio.run(main())
    logged = caplog.text
    assert "handling a heartbeat message from n1 failed" in logged
    assert "a bug in a handler" in logged
    assert "bad message from n1 skipped: message 1 (bogus)" in logged


# ---- what an agent reports is bounded -------------------------------------------------


def _started(**fields: Any) -> dict[str, Any]:
    base = {"type": "started", "job_id": "a1b2c3d4", "epoch": 1, "pid": 42}
    return {**base, "hostname": "gpu-01.lab", "ip": "10.0.0.1", "time": 1.0, **fields}


def _exited(**fields: Any) -> dict[str, Any]:
    base = {"type": "exited", "job_id": "a1b2c3d4", "epoch": 1, "exit_code": 0, "time": 2.0}
    return {**base, **fields}


def _refusal(message: dict[str, Any] | str) -> str:
    raw = message if isinstance(message, str) else json.dumps(message)
    errors: list[str] = []
    assert parse_agent_messages(f"[{raw}]", errors) == []
    (error,) = errors
    return error


@pytest.mark.parametrize("hostname", ["gpu-01.lab", "node_7", "h" * 253, "a", "GPU01.example.org"])
@pytest.mark.parametrize("ip", ["10.0.0.1", "::1", "fe80::1%eth0", "2001:db8::7"])
def test_real_host_names_and_addresses_are_taken(hostname: str, ip: str) -> None:
    (msg,) = parse_agent_messages(json.dumps(_started(hostname=hostname, ip=ip)))
    assert isinstance(msg, Started) and (msg.hostname, msg.ip) == (hostname, ip)
    hello = {"type": "hello", "node_id": "n1", "hostname": hostname, "ip": ip, "gpus": []}
    assert Hello.model_validate(hello).hostname == hostname


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"hostname": "h" * 254}, "hostname: Value error, is 254 characters long"),
        ({"hostname": ""}, "is 0 characters long"),
        ({"hostname": "h slots=999"}, "is not a host name"),  # an MPI hostfile line
        ({"hostname": "h\nother slots=8"}, "is not a host name"),
        ({"hostname": "\x1b]0;x\x07"}, "is not a host name"),
        ({"hostname": "-oProxyCommand=x"}, "is not a host name"),
        ({"hostname": "héllo"}, "is not a host name"),
        ({"ip": "example.org"}, "ip: Value error, 'example.org' is not an IP address"),
        ({"ip": "10.0.0.1\n"}, "is not an IP address"),
        ({"ip": "10.0.0.1 -x"}, "is not an IP address"),
        ({"ip": ""}, "is not an IP address"),
        ({"pid": 10**30}, "pid"),
        ({"pid": -1}, "pid"),
        ({"port": 70000}, "port"),
        ({"time": "NaN"}, "time"),
    ],
)
def test_a_started_with_a_bad_host_address_or_number_is_refused(
    fields: dict[str, Any], words: str
) -> None:
    message = json.dumps(_started(**fields)).replace('"NaN"', "NaN")
    assert words in _refusal(message)


def test_the_same_rules_hold_for_a_hello() -> None:
    base = {"type": "hello", "node_id": "n1", "hostname": "h", "ip": "10.0.0.1", "gpus": []}
    for fields in ({"hostname": "h slots=999"}, {"ip": "not-an-ip"}, {"hostname": "h" * 254}):
        with pytest.raises(ValidationError):
            Hello.model_validate({**base, **fields})


def test_error_texts_are_escaped_and_cut() -> None:
    hostile = "prolog said \x1b]0;owned\x07\r\n" + "\x1b[2J" * 2000
    (msg,) = parse_agent_messages(json.dumps(_exited(launch_error=hostile, epilog_error="ok")))
    assert isinstance(msg, Exited) and msg.launch_error is not None
    assert len(msg.launch_error) <= 1000 and msg.launch_error.isprintable()
    assert msg.launch_error.startswith("prolog said \\x1b]0;owned\\x07\\r\\n\\x1b[2J")
    assert msg.launch_error.endswith("...") and msg.epilog_error == "ok"
    plain = "cannot write the job script: No space left on device"
    (kept,) = parse_agent_messages(json.dumps(_exited(launch_error=plain)))
    assert isinstance(kept, Exited) and kept.launch_error == plain


@pytest.mark.parametrize(
    ("fields", "words"),
    [({"exit_code": 10**30}, "exit_code"), ({"time": "Infinity"}, "time")],
)
def test_an_exited_with_impossible_numbers_is_refused(fields: dict[str, Any], words: str) -> None:
    message = json.dumps(_exited(**fields)).replace('"Infinity"', "Infinity")
    assert words in _refusal(message)


def test_telemetry_is_bounded_and_not_a_number_is_no_measurement() -> None:
    gpu = {"index": 0, "utilization_pct": 50.0, "temperature_c": "NaN", "power_w": "Infinity"}
    raw = json.dumps({"type": "heartbeat", "telemetry": [gpu]})
    (beat,) = parse_agent_messages(raw.replace('"NaN"', "NaN").replace('"Infinity"', "Infinity"))
    assert isinstance(beat, Heartbeat)
    (tel,) = beat.telemetry
    assert (tel.utilization_pct, tel.temperature_c, tel.power_w) == (50.0, None, None)
    many = {"type": "heartbeat", "telemetry": [{"index": i} for i in range(65)]}
    assert "telemetry" in _refusal(many)
    pids = {"type": "heartbeat", "telemetry": [{"index": 0, "foreign_processes": [1] * 1025}]}
    assert "foreign_processes" in _refusal(pids)
    assert "index" in _refusal({"type": "heartbeat", "telemetry": [{"index": -1}]})


def test_a_hello_says_its_cpus_and_memory_and_an_older_one_need_not() -> None:
    base = {"type": "hello", "node_id": "n1", "hostname": "h", "ip": "10.0.0.1", "gpus": []}
    old = parse_hello(json.dumps(base))
    assert (old.cpus, old.mem_mb, old.protocol) == (None, None, PROTOCOL_VERSION)
    new = parse_hello(
        json.dumps(
            {
                **base,
                "cpus": [{"id": 0, "core": 0, "numa": 0}, {"id": 8, "core": 0}],
                "mem_mb": 16384,
                "gpus": [{"index": 0, "name": "A100", "memory_mb": 1, "numa_node": 1}],
            }
        )
    )
    assert [(c.id, c.core, c.numa) for c in new.cpus or ()] == [(0, 0, 0), (8, 0, None)]
    assert new.gpus[0].numa_node == 1 and new.mem_mb == 16384
    twice = {**base, "cpus": [{"id": 1, "core": 1}, {"id": 1, "core": 1}]}
    with pytest.raises(HelloError, match="cpus lists a CPU id twice"):
        parse_hello(json.dumps(twice))
