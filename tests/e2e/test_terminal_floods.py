"""A terminal's client cannot stall the master or fill its memory (issue 25, items 1, 2).

A real master and agent, real WebSocket clients (`mgpu.client.websocket`, what `srun --pty`
speaks): typed input sent as fast as loopback allows is held to a window per terminal
(the master reads no more from that client until its agent acknowledges), so the master's
memory stays flat and `/healthz` fast while 128 MiB go through, and every byte reaches the
program; a message over 64 KiB closes only its connection, at its header; WebSockets past
the caps per job, user and address are refused with one sentence while others still
attach; and idle attachments cost the master (almost) no CPU.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from helpers import LocalCluster, local_cluster, wait_for
from mgpu.client.api import Client, RequestError

PER_ADDRESS = 12
PER_USER = 8
PER_JOB = 4
CONFIG = f"""
cluster:
  master:
    websockets_per_address: {PER_ADDRESS}
    websockets_per_user: {PER_USER}
    websockets_per_job: {PER_JOB}
"""
FLOOD = 128 << 20
"""Bytes typed in the flood: unbounded, the master would hold most of them (and more)."""
FRAME = 64 * 1024
RSS_GROWTH = 50 << 20
HEALTHZ_WITHIN = 1.0
"""Seconds: the slowest /healthz allowed during a flood, on a loaded 2-CPU machine."""

READER = """
import os, sys, tty
tty.setraw(0)
want, n = int(sys.argv[1]), 0
print("ready", flush=True)
while n < want:
    n += len(os.read(0, 1 << 16))
print("got", n, flush=True)
print("key", os.read(0, 1), flush=True)
"""


@pytest.fixture(scope="module")
def floods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("floods"), agents=1, gpus=2, config=CONFIG) as c:
        yield c


class Watch:
    """The master's RSS and /healthz latency, sampled in a thread until stopped."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.master is not None
        self.proc = psutil.Process(cluster.master.pid)
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self.slowest = 0.0
        self.http = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=30)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            t0 = time.monotonic()
            self.http.request("GET", "/healthz")
            assert self.http.getresponse().read()
            self.slowest = max(self.slowest, time.monotonic() - t0)
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _records(ws: Any, timeout: float) -> list[dict[str, Any]]:
    """The records that come within `timeout` seconds (at least one, unless it closes)."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not out and time.monotonic() < deadline and not ws.closed:
        if ws.buffered() or select.select([ws], [], [], 0.1)[0]:
            for _, payload in ws.feed():
                out += [json.loads(x) for x in payload.split(b"\n") if x.strip()]
    return out


def _expect(ws: Any, text: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Read records until the run's output shows `text`; the records read."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += _records(ws, deadline - time.monotonic())
        if text in "".join(str(r.get("d", "")) for r in seen):
            return seen
        assert not ws.closed, f"closed before {text!r}: {seen}"
    raise AssertionError(f"{text!r} never came: {seen}")


def _closed_within(ws: Any, seconds: float) -> bool:
    """Whether the master closes the connection within `seconds` (what it sends is read)."""
    deadline = time.monotonic() + seconds
    while not ws.closed and time.monotonic() < deadline:
        _records(ws, 0.2)
    return bool(ws.closed)


def _terminal_job(cluster: LocalCluster, argv: list[str]) -> str:
    client = cluster.client()
    job_id = client.submit(argv, pty=True, pty_size=[24, 80], gpus=1).id
    wait_for(lambda: client.show(job_id)["state"] == "running", what="the terminal job")
    return job_id


def test_a_flood_of_typed_input_is_held_to_a_window(floods: LocalCluster) -> None:
    job_id = _terminal_job(floods, ["python3", "-c", READER, str(FLOOD)])
    ws = floods.client().attach(job_id)
    try:
        _expect(ws, "ready")
        watch = Watch(floods)
        frame = b"k" * FRAME
        t0 = time.monotonic()
        try:
            for _ in range(FLOOD // FRAME):  # blocks whenever the master stops reading
                ws.send_binary(frame)
            seen = _expect(ws, f"got {FLOOD}", timeout=120)
        finally:
            watch.stop()
        took = time.monotonic() - t0
        ws.send_binary(b"!")  # the terminal still works
        seen += _expect(ws, "key b'!'")
        # Until the end record: a batch of records may hold only the key line's rest.
        ended = [r for r in seen if r.get("end")]
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline and not ws.closed:
            ended = [r for r in _records(ws, deadline - time.monotonic()) if r.get("end")]
    finally:
        ws.close()
    grown = watch.peak - watch.base
    slowest = watch.slowest
    print(f"{FLOOD >> 20} MiB in {took:.1f} s; RSS +{grown >> 20} MiB; /healthz {slowest:.3f} s")
    assert grown < RSS_GROWTH, f"the master grew by {grown >> 20} MiB"
    assert watch.slowest < HEALTHZ_WITHIN, f"/healthz took {watch.slowest:.2f} s"
    assert ended and ended[0]["exit_code"] == 0


def test_a_message_over_64_kib_closes_its_connection_only(floods: LocalCluster) -> None:
    job_id = _terminal_job(floods, ["python3", "-c", READER, "0"])
    ws = floods.client().attach(job_id)
    try:
        _expect(ws, "ready")
        ws.send_binary(b"x" * (FRAME + 1))
        assert _closed_within(ws, 10), "a 64 KiB + 1 message was taken"
    finally:
        ws.close()
    ws = floods.client().attach(job_id)  # the run goes on: attach again and type
    try:
        ws.send_binary(b"z")
        _expect(ws, "key b'z'")
    finally:
        ws.close()


def test_a_message_announced_over_64_kib_is_refused_at_its_header(floods: LocalCluster) -> None:
    client = floods.client()
    job_id = client.submit("true", hold=True).id
    ws = client.attach(job_id, output=False)
    try:
        n = 1 << 30  # a 1 GiB binary frame's header, and 100 bytes of it
        head = bytes([0x82, 0x80 | 127]) + n.to_bytes(8, "big") + os.urandom(4)
        ws.sock.sendall(head + bytes(100))
        assert _closed_within(ws, 5), "the master waits for the rest of a message it cannot take"
    finally:
        ws.close()
        client.cancel(job_id)


@contextlib.contextmanager
def _attached(client: Client, job_id: str, n: int) -> Iterator[list[Any]]:
    held: list[Any] = []
    try:
        for _ in range(n):
            held.append(client.attach(job_id, output=False))
        yield held
    finally:
        for ws in held:
            ws.close()


def _refusal(client: Client, job_id: str) -> RequestError:
    with pytest.raises(RequestError) as refused:
        client.attach(job_id, output=False).close()
    return refused.value


def test_websockets_are_capped_per_job_user_and_address(floods: LocalCluster) -> None:
    admin = floods.client()
    alice = Client(floods.address, token=admin.create_token("alice")["token"])
    bob = Client(floods.address, token=admin.create_token("bob")["token"])
    a1, a2 = (alice.submit("sleep 1000", hold=True).id for _ in range(2))
    b1, b2 = (bob.submit("sleep 1000", hold=True).id for _ in range(2))
    watch = Watch(floods)
    try:
        with _attached(alice, a1, PER_JOB):
            e = _refusal(alice, a1)
            assert (e.status, str(e)) == (
                429,
                f"too many open attachments to job {a1} (at most {PER_JOB}); close some first",
            )
            with _attached(alice, a2, PER_USER - PER_JOB):
                assert "of user alice" in str(_refusal(alice, a2))
                with _attached(bob, b1, PER_JOB):  # 12 from 127.0.0.1 now
                    assert "from 127.0.0.1" in str(_refusal(bob, b2))
                    assert alice.queue()  # the master answers
        with _attached(bob, b2, PER_JOB):  # all given back
            pass
    finally:
        watch.stop()
        for job_id in (a1, a2, b1, b2):
            admin.cancel(job_id)
    assert watch.slowest < HEALTHZ_WITHIN


def test_idle_attachments_cost_the_master_no_cpu(tmp_path: Any) -> None:
    many = 400
    config = f"cluster:\n  master:\n    websockets_per_address: {many}\n"
    config += f"    websockets_per_user: {many}\n    websockets_per_job: {many}\n"
    with local_cluster(tmp_path, agents=1, gpus=1, config=config) as c:
        client = c.client()
        job_id = client.submit("sleep 1000", hold=True).id
        assert c.master is not None
        master = psutil.Process(c.master.pid)

        def cpu_over(seconds: float) -> float:
            t0 = master.cpu_times()
            time.sleep(seconds)  # a measurement window, not a wait for anything
            t1 = master.cpu_times()
            return (t1.user + t1.system) - (t0.user + t0.system)

        quiet = cpu_over(5)
        with _attached(client, job_id, many):
            time.sleep(1)  # let the attaches' first answers go out before measuring
            busy = cpu_over(5)
        print(f"master CPU over 5 s: {quiet:.3f} s alone, {busy:.3f} s with {many} attaches")
        assert busy < quiet + 0.25, f"{many} idle attachments cost {busy - quiet:.2f} s of CPU"
