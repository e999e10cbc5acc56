"""One request never stalls the master (issue 11, item 8).

End to end, with a real master: each of the worst requests answers (or is refused)
while a `/healthz` poller in another process sees no gap over GAP seconds, and the
master's resident memory does not grow by more than GROWTH.  These are correctness
bounds; the figures are bench/abuse.py's.  Then unit tests of the pieces: the
chunked output reader, the front door (auth before the body, body limits) and the
counting of refused logins.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from factories import http_scope
from helpers import BIN, LocalCluster, wait_for
from mgpu.client.api import RequestError
from mgpu.master.http.guard import BODY_LIMIT, SUBMIT_BODY_LIMIT, FailedLogins, Guard
from mgpu.master.security.auth import BadTokenThrottle, Identity
from mgpu.master.store.outputs import CHUNK, FileOutputReader, FileOutputStore, OutputReader
from mgpu.testing import LoopProbe

GAP = 1.0
"""Seconds the master may take to answer /healthz while the requests run."""
GROWTH = 100 << 20
"""Bytes the master's RSS may grow by while they run."""
OUTPUT = 50_000_000


class Stalls:
    def __init__(self, cluster: LocalCluster, probe: LoopProbe) -> None:
        self.cluster = cluster
        self.probe = probe

    def check(self, started: float) -> None:
        """No gap over GAP, no growth over GROWTH since `started` (probe.settle() time)."""
        now = time.monotonic()
        # The probe asks one at a time: once a sample sent after now is in, the one in
        # flight now (however long it hangs) is in too.
        wait_for(lambda: any(s > now for s, _, _ in self.probe.samples()), what="a sample")
        gaps, rss = self.probe.window(started, now)
        before = [r for s, d, r in self.probe.samples() if s + d <= started][-1:]
        assert gaps, "the poller took no sample"
        assert max(gaps) < GAP, f"the master stalled {max(gaps):.2f} s"
        if before and rss:
            growth = max(rss) - before[0]
            assert growth < GROWTH, f"the master grew by {growth >> 20} MB"

    def start(self) -> float:
        self.probe.settle(quiet=0.3, slow=0.2)
        return time.monotonic()


@pytest.fixture(scope="module")
def stalls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stalls]:
    root = tmp_path_factory.mktemp("stalls")
    cluster = LocalCluster(root)
    probe = None
    try:
        cluster.start_master()
        cluster.start_agent("node001", gpus=4)
        assert cluster.master is not None
        probe = LoopProbe(cluster.address, cluster.master.pid, root / "probe.txt")
        yield Stalls(cluster, probe)
    finally:
        if probe is not None:
            probe.stop()
        cluster.stop()


def _post(address: str, path: str, body: bytes, token: str | None) -> tuple[int, Any]:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _send_big(address: str, token: str | None, size: int, chunked: bool) -> tuple[str, int]:
    """POST `size` bytes to /api/jobs; (what came back, bytes sent before the master
    stopped listening)."""
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest("POST", "/api/jobs")
    if token:
        conn.putheader("Authorization", f"Bearer {token}")
    if chunked:
        conn.putheader("Transfer-Encoding", "chunked")
    else:
        conn.putheader("Content-Length", str(size))
    conn.endheaders()
    block = b"a" * (1 << 20)
    sent = 0
    try:
        while sent < size:
            conn.send(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            sent += len(block)
        if chunked:
            conn.send(b"0\r\n\r\n")
    except OSError:
        pass  # the master closed the connection: it did not want the rest
    try:
        resp = conn.getresponse()
        return f"{resp.status} {json.loads(resp.read())['detail']}", sent
    finally:
        conn.close()


# ---- end to end --------------------------------------------------------------


def test_wait_with_too_many_ids_is_refused_at_once(stalls: Stalls) -> None:
    c = stalls.cluster
    t0 = stalls.start()
    ids = [f"{i:08x}" for i in range(100_000)]
    status, body = _post(c.address, "/api/wait", json.dumps({"ids": ids}).encode(), c.admin_token)
    assert status == 413
    assert body["detail"] == "request body too large: POST /api/wait takes at most 256 KiB"
    status, body = _post(
        c.address, "/api/wait", json.dumps({"ids": ids[:1001]}).encode(), c.admin_token
    )
    assert status == 422
    assert body["detail"] == (
        "at most 1000 job ids per wait (1001 given): wait for them in several requests"
    )
    stalls.check(t0)


def test_cancel_of_a_big_array_and_waiting_for_all_its_tasks(stalls: Stalls) -> None:
    """20,000 tasks (the slices are the same for 100,000; bench/abuse.py runs those):
    one request cancels them all, one audit event says so; the client's wait_all for
    all of them is split into requests the master takes."""
    c = stalls.cluster
    client = c.client()
    req = {"command": "sleep 600", "gpus": 1, "array": "0-19999%2", "env": {}}
    array = client._request("POST", "/api/jobs", req, timeout=300)
    ids = array["task_ids"]
    wait_for(lambda: len(client.show(ids[0]).get("allocation") or []) == 1, what="a task runs")
    t0 = stalls.start()
    out = client.cancel(array["job_id"])
    assert out["cancelled"] == ids and out["already_ended"] == []
    stalls.check(t0)
    events = [e for e in client.audit() if e["kind"] == "cancel" and e["time"] >= time.time() - 300]
    assert [e["target"] for e in events] == [array["job_id"]]
    wait_for(lambda: not client.queue()["jobs"], timeout=60, what="the running tasks ended")
    t0 = stalls.start()
    jobs = c.client().wait_all(ids, timeout=120)
    assert [j["id"] for j in jobs] == ids
    assert {j["state"] for j in jobs} == {"cancelled"}
    stalls.check(t0)
    again = client.cancel(array["job_id"])
    assert again["cancelled"] == [] and again["already_ended"] == ids


def test_logs_of_a_50_mb_job_three_at_once(stalls: Stalls) -> None:
    c = stalls.cluster
    client = c.client()
    line = "0123456789" * 7 + "abcdefghi"  # 80 bytes with its newline
    job = client.submit(f"yes {line} | head -c {OUTPUT}", gpus=0, env={})
    assert client.wait(job.id, timeout=120)["state"] == "completed"
    t0 = stalls.start()
    procs = [
        subprocess.Popen(
            [str(BIN / "mgpu"), "logs", job.id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=c.env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert len(out) == OUTPUT
        assert out[:80] == (line + "\n").encode() and out.count(b"\n") == OUTPUT // 80
    stalls.check(t0)


def test_big_bodies_are_refused_before_they_are_read(stalls: Stalls) -> None:
    c = stalls.cluster
    t0 = stalls.start()
    answer, sent = _send_big(c.address, None, 100 << 20, chunked=False)
    assert answer.startswith("401 not authorised: no token given")
    assert sent < 100 << 20  # cut off, not read to the end
    answer, sent = _send_big(c.address, c.admin_token, 100 << 20, chunked=False)
    assert answer == "413 request body too large: POST /api/jobs takes at most 4 MiB"
    assert sent < 100 << 20
    answer, sent = _send_big(c.address, c.admin_token, 100 << 20, chunked=True)
    assert answer == "413 request body too large: POST /api/jobs takes at most 4 MiB"
    assert sent < 100 << 20
    stalls.check(t0)
    # A body a little over the limit from the client: it reads the master's sentence.
    with pytest.raises(RequestError) as refused:
        c.client().submit("true", env={"BIG": "x" * (5 << 20)})
    assert refused.value.status == 413
    assert str(refused.value) == "request body too large: POST /api/jobs takes at most 4 MiB"
    assert c.client().queue(all=True)["jobs"] is not None  # still answering


def test_a_flood_of_bad_tokens_is_counted_not_written_row_by_row(stalls: Stalls) -> None:
    c = stalls.cluster
    flood = 200

    async def one(i: int) -> int:
        host, port = c.address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"GET /api/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Authorization: Bearer mgpu_guess{i}\r\n\r\n".encode()
        )
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        writer.close()
        return status

    async def all_of_them() -> list[int]:
        return list(await asyncio.gather(*(one(i) for i in range(flood))))

    c.client().audit()  # writes what earlier tests' refusals left counted
    start = time.time()
    t0 = stalls.start()
    assert asyncio.run(all_of_them()) == [401] * flood
    stalls.check(t0)
    rows = [e for e in c.client().audit(since=start) if e["kind"] == "auth_failed"]
    assert len(rows) == 1, rows
    assert rows[0]["address"] == "127.0.0.1"
    assert rows[0]["detail"] == f"{flood} refused requests: unknown or revoked token"


# ---- the output reader -------------------------------------------------------


def _records(n: int, size: int = 10) -> list[bytes]:
    return [
        json.dumps({"s": "o", "d": f"{i:0{size}d}", "n": "n1"}, separators=(",", ":")).encode()
        + b"\n"
        for i in range(n)
    ]


def _read_all(reader: OutputReader, limit: int = CHUNK) -> list[bytes]:
    out = b""
    while (chunk := reader.step(limit)) is not None:
        assert chunk == b"" or chunk.endswith(b"\n")  # whole records only
        out += chunk
    reader.close()
    return out.splitlines(keepends=True)


def test_the_reader_skips_records_across_chunks_and_keeps_long_lines_whole(
    tmp_path: Path,
) -> None:
    recs = _records(1000) + _records(1, size=3 * CHUNK) + _records(5)
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(recs))
    assert _read_all(FileOutputReader(path)) == recs
    for since in (0, 1, 17, 999, 1000, 1001, 1006, 2000):
        assert _read_all(FileOutputReader(path, since), limit=100) == recs[since:]


def test_a_one_off_read_stops_where_the_file_ended_when_it_began(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(_records(3)))
    reader = FileOutputReader(path, stop_at_current_end=True)
    with open(path, "ab") as f:
        f.write(b"".join(_records(2)))
    assert len(_read_all(reader)) == 3
    assert FileOutputReader(tmp_path / "missing.jsonl").step() is None


def test_a_follower_reads_what_is_appended_after_it_began(tmp_path: Path) -> None:
    async def main() -> None:
        store = FileOutputStore(tmp_path)
        store.append("j", "o", "one\n", "n1")
        wake = store.subscribe("j")
        reader = store.reader("j", 0)
        assert [json.loads(x)["d"] async for x in reader.chunks()] == ["one\n"]
        wake.clear()
        store.append("j", "e", "two\n", "n1")
        assert wake.is_set()
        assert [json.loads(x)["d"] async for x in reader.chunks()] == ["two\n"]
        reader.close()
        store.unsubscribe("j", wake)
        store.close_all()

    asyncio.run(main())


def test_a_line_cut_by_a_crash_is_dropped_and_resume_points_come_from_the_tail(
    tmp_path: Path,
) -> None:
    lines = [
        {"s": "o", "d": "old", "n": "n1", "ep": 1, "at": 999},
        {"s": "o", "d": "a" * CHUNK, "n": "n1", "ep": 2, "at": CHUNK},
        {"s": "e", "d": 'x","n":"n9","ep":2,"at":5}', "n": "n1", "ep": 2, "at": 40},
        {"s": "o", "d": "note", "n": "n2"},  # a step's output: no run offsets
        {"s": "o", "d": "b", "n": "n2", "ep": 2, "at": 7},
    ]
    body = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in lines)
    (tmp_path / "j.jsonl").write_bytes(body + b'{"s":"o","d":"cut sho')
    store = FileOutputStore(tmp_path)
    assert store.resume_point("j", 2, "n1") == (CHUNK, 40)
    assert store.resume_point("j", 2, "n2") == (7, 0)
    assert (tmp_path / "j.jsonl").read_bytes() == body
    store.append("j", "o", "next", "n1")
    assert [r["d"] for r in store.read("j", 4)] == ["b", "next"]
    store.close_all()


# ---- the front door ----------------------------------------------------------


def _http(path: str, headers: dict[str, str], method: str = "POST") -> dict[str, Any]:
    return http_scope(path, method, headers, client=("10.0.0.9", 4000))


def _call(guard: Guard, scope: dict[str, Any], body: list[bytes]) -> tuple[int, str, int]:
    """(status, detail, body chunks the app was given) for one request through `guard`."""
    sent: list[dict[str, Any]] = []
    chunks = list(body)
    given = 0

    async def receive() -> dict[str, Any]:
        nonlocal given
        given += 1
        piece = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": piece, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(raw)["detail"] if raw else "", given


def _guard(identities: dict[str, Identity], rows: list[Any]) -> Guard:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        from fastapi import HTTPException

        try:  # read the whole body, as FastAPI would
            while (await receive()).get("more_body"):
                pass
        except HTTPException as e:
            detail = json.dumps({"detail": e.detail}).encode()
            await send({"type": "http.response.start", "status": e.status_code, "headers": []})
            await send({"type": "http.response.body", "body": detail})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"detail": ""}'})

    return Guard(
        app,
        identify=lambda token: identities.get(token or ""),
        throttle=BadTokenThrottle(free=10**6),
        failures=FailedLogins(rows.extend),
    )


def test_the_guard_refuses_before_reading_a_body() -> None:
    ok = Identity(user="alice", admin=False, token_id="t1")
    rows: list[Any] = []
    guard = _guard({"good": ok}, rows)
    big = {"Content-Length": str(100 << 20)}
    # No valid token: refused without a single read of the body.
    assert _call(guard, _http("/api/jobs", big), [b"x"]) == (
        401,
        "not authorised: no token given (set $MGPU_TOKEN or ~/.config/mgpu/token)",
        0,
    )
    bad = {**big, "Authorization": "Bearer nope"}
    assert _call(guard, _http("/api/jobs", bad), [b"x"])[::2] == (401, 0)
    # A valid token, a declared size over the limit: 413 at once, nothing read.
    good = {**big, "Authorization": "Bearer good"}
    assert _call(guard, _http("/api/jobs", good), [b"x"]) == (
        413,
        "request body too large: POST /api/jobs takes at most 4 MiB",
        0,
    )
    # A chunked body: cut as soon as what came passes the limit.
    chunked = {"Authorization": "Bearer good", "Transfer-Encoding": "chunked"}
    pieces = [b"x" * (64 << 10)] * 100
    status, detail, given = _call(guard, _http("/api/wait", chunked), pieces)
    assert (status, detail) == (413, "request body too large: POST /api/wait takes at most 256 KiB")
    assert given == BODY_LIMIT // (64 << 10) + 1
    # Within the limits: through, the identity handed on.
    assert _call(guard, _http("/api/jobs", chunked), [b"x" * (SUBMIT_BODY_LIMIT - 1)])[0] == 200
    assert _call(guard, _http("/healthz", {}, "GET"), [])[0] == 200
    assert rows == []  # counted, not written yet


def test_refused_logins_are_counted_per_address_and_written_together() -> None:
    rows: list[Any] = []
    failures = FailedLogins(rows.extend, max_addresses=3)
    for _ in range(500):
        failures.failed("10.0.0.1", "/api/jobs", "unknown or revoked token")
    failures.failed("10.0.0.1", "/api/queue", "no token given")
    failures.failed("10.0.0.2", "/api/jobs", "no token given")
    assert rows == []
    failures.flush()
    assert rows == [
        (
            "auth_failed",
            None,
            "10.0.0.1",
            "/api/queue",
            "501 refused requests: unknown or revoked token, no token given",
        ),
        ("auth_failed", None, "10.0.0.2", "/api/jobs", "1 refused request: no token given"),
    ]
    failures.flush()
    assert len(rows) == 2  # nothing new, nothing written
    for i in range(4):  # more addresses than it keeps: the counts so far are written
        failures.failed(f"10.0.1.{i}", "/", "no token given")
    assert len(rows) == 5
