"""The event loop's longest stall while the worst requests run (issue 11, item 8).

A master and one agent with 4 fake GPUs on loopback.  A separate thread asks
`/healthz` every ~10 ms over a kept-alive connection: its latency is how long the
master's event loop could not answer.  Another samples the master's resident
memory.  Each request below runs alone, then three at once; for each the table
gives healthz p50 / max while it ran and the master's peak RSS.

Set-up (not measured): a job that writes 50 MB of output.  Terminal rows: 200 MiB typed
into one `srun --pty` program as fast as loopback allows (held to a window per terminal:
the master's RSS must stay flat); 1,000 attach WebSockets opened at once by one user to
100 held jobs (the caps per user and job refuse most).  Notification rows: 300
held jobs with a webhook to a receiver that answers, cancelled one by one; then 2,100
jobs that notify a receiver that accepts and never reads (both on 127.0.0.1), all ended
at once by cancelling the job they depend on.  Then 100,000-task arrays
(`sleep` tasks capped at 4 running, the rest queued) are submitted, listed, shown and
cancelled.  The `idle` row is the baseline with 100,000 tasks queued: what the
scheduling pass alone costs (`last_pass_ms`: the master's last pass, from /metrics);
every row that runs while they are queued shares it; beside it, FOLLOWERS real
`mgpu logs -f` clients of a job queued behind them (started before the row).  Slow
garbage collections the master logged are listed too.

Two figures per row tell queueing from a stall: `/healthz` latency (what a client waits,
queueing behind other requests included) and the master's own loop monitor
(master/runtime/looplag.py): `loop_hold_max_ms`, the longest time one turn of its event loop
held it (from the holds of 100 ms or more it logs, else the histogram bucket of the
longest: "<= 50" means it stayed under 50 ms), and how many holds of 100 ms or more there
were.

Each row also gives the master's RSS just before it and once it is over (`rss_before_mb`,
`rss_after_mb`: the probe's reading before the row began and after the loop settled again).

`python bench/abuse.py [GROUP ...]` runs only the named groups of rows (all by default):
logs, bodies, floods, notify, typed, attach, array, followers (followers of a job queued
behind the array: the array is submitted and cancelled around it).  A full run writes
bench/results/abuse.json, a partial one bench/results/abuse-GROUP-....json.  Prints the
table; the machine's load average at the start and the end is recorded (the bench shares
its CPUs with whatever else runs).  Not a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.client
import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu import Client
from mgpu.errors import MgpuError
from mgpu.testing import BIN, LocalCluster, LoopProbe, wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "abuse.json"
TASKS = int(os.environ.get("BENCH_ABUSE_TASKS", 100_000))
OUTPUT_BYTES = int(os.environ.get("BENCH_ABUSE_OUTPUT", 50_000_000))
BODY_BYTES = 100_000_000
FLOOD = 300
"""Requests with bad tokens sent at once, per flood."""
NOTIFY_FLOOD = 2100
"""Job ends at once, each notifying a receiver that never answers (issue 25 item 5)."""
NOTIFY_ENDS = 300
"""Jobs with a webhook cancelled one by one (issue 25 item 6)."""
FOLLOWERS = 100
"""`mgpu logs -f` clients of one job queued behind the array (issue 25 item 7)."""
CONFIG = "notify:\n  allowed_hosts: [127.0.0.1]\n"
"""Notifications may go to loopback: the bench's receivers are there, and nothing else is."""


GROUPS = ("logs", "bodies", "floods", "notify", "typed", "attach", "array", "followers")


def summary(probe: LoopProbe, t0: float, t1: float) -> dict[str, float]:
    lat, rss = probe.window(t0, t1)
    lat = lat or [0.0]
    return {
        "healthz_p50_ms": round(statistics.median(lat) * 1000, 1),
        "healthz_max_ms": round(max(lat) * 1000, 1),
        "samples": len(lat),
        "rss_peak_mb": round(max(rss or [0]) / 2**20),
    }


def rss_at(probe: LoopProbe, before: float | None = None) -> int | None:
    """The master's RSS in MB: the last reading sent before `before` (None: the latest)."""
    readings = [r for s, _, r in probe.samples() if before is None or s < before]
    return round(readings[-1] / 2**20) if readings else None


def _raw(address: str, method: str, path: str, body: bytes, token: str | None) -> int:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _big_body(address: str, token: str | None, chunked: bool) -> str:
    """Send BODY_BYTES (or until the master stops listening); the status it answered."""
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.putrequest("POST", "/api/jobs")
    conn.putheader("Content-Type", "application/json")
    if token:
        conn.putheader("Authorization", f"Bearer {token}")
    if chunked:
        conn.putheader("Transfer-Encoding", "chunked")
    else:
        conn.putheader("Content-Length", str(BODY_BYTES))
    conn.endheaders()
    block = b'{"x":"' + b"a" * (1 << 20)
    sent = 0
    try:
        while sent < BODY_BYTES:
            piece = block[: BODY_BYTES - sent]
            conn.send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
        if chunked:
            conn.send(b"0\r\n\r\n")
    except OSError:
        pass  # the master closed the connection: it did not want the rest
    try:
        resp = conn.getresponse()
        resp.read()
        return f"{resp.status} after {sent >> 20} MiB sent"
    except OSError as e:
        return f"connection closed after {sent >> 20} MiB sent ({type(e).__name__})"
    finally:
        conn.close()


async def _flood_async(address: str, n: int, path: str) -> list[int]:
    host, port = address.split(":")

    async def one(i: int) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        auth = f"Authorization: Bearer mgpu_guess{i:08d}\r\n" if path != "/healthz" else ""
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{auth}\r\n".encode()
        )
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        writer.close()
        return status

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def _flood(address: str, path: str = "/api/jobs") -> str:
    codes = asyncio.run(_flood_async(address, FLOOD, path))
    return f"{FLOOD} × {sorted(set(codes))}"


def _logs(cluster: LocalCluster, job_id: str) -> str:
    res = subprocess.run(
        [str(BIN / "mgpu"), "logs", job_id],
        capture_output=True,
        env=cluster.env,
        timeout=600,
        check=True,
    )
    return f"{len(res.stdout) >> 20} MiB"


class _Receivers:
    """Two webhook receivers on 127.0.0.1: one that accepts connections and never reads
    (`silent`), one that answers 200 to every POST and counts them (`answering`)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.answering = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.silent_sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.silent = f"http://127.0.0.1:{self.silent_sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.silent_sock.accept()[0])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.silent_sock.close()
        for conn in self.held:
            conn.close()


def _notify_flood(client: Client, receivers: _Receivers) -> Callable[[], str]:
    """Set-up (not measured): NOTIFY_FLOOD jobs that notify the silent receiver, waiting on
    a held one; the row cancels that one, so all of them end at once, and waits 5 s more
    while their deliveries are tried."""
    parent = client.submit("true", hold=True, env={}).id
    after = {"dependency": f"afterok:{parent}", "notify": receivers.silent, "env": {}}
    last = [client.submit("true", **after).id for _ in range(NOTIFY_FLOOD)][-1]

    def row() -> str:
        client.cancel(parent)
        wait_for(lambda: client.show(last)["state"] == "cancelled", timeout=600)
        time.sleep(5)
        return f"{NOTIFY_FLOOD} ended, {len(receivers.held)} connections to the silent receiver"

    return row


def _notify_ends(client: Client, receivers: _Receivers) -> Callable[[], str]:
    """Set-up (not measured): NOTIFY_ENDS held jobs that notify the answering receiver;
    the row cancels them one by one and waits for every notification."""
    ids = [
        client.submit("true", hold=True, notify=receivers.answering, env={}).id
        for _ in range(NOTIFY_ENDS)
    ]

    def row() -> str:
        before = receivers.posts
        t0 = time.monotonic()
        for job_id in ids:
            client.cancel(job_id)
        cancelled = time.monotonic() - t0
        wait_for(lambda: receivers.posts - before >= NOTIFY_ENDS, timeout=600)
        return f"cancelled in {cancelled:.1f} s, {receivers.posts - before} delivered"

    return row


TYPED = 200 << 20
"""Bytes typed into one terminal as fast as loopback allows (issue 25 item 1)."""
ATTACH_TRIES = 1000
"""Attach WebSockets one user tries to hold open at once (issue 25 item 2)."""
READER = (
    "import os, sys, tty\ntty.setraw(0)\nwant, n = int(sys.argv[1]), 0\n"
    "print('ready', flush=True)\nwhile n < want:\n    n += len(os.read(0, 1 << 16))\n"
    "print('got', n, flush=True)\n"
)


def _typed_flood(client: Client) -> Callable[[], str]:
    """Set-up (not measured): a terminal job whose program reads TYPED bytes; the row
    types them in 64 KiB messages and waits until the program has read them all."""
    job_id = client.submit(["python3", "-c", READER, str(TYPED)], pty=True, gpus=1, env={}).id
    wait_for(lambda: client.show(job_id)["state"] == "running", timeout=60)

    def row() -> str:
        ws = client.attach(job_id)
        t0 = time.monotonic()
        try:
            frame = b"k" * (64 * 1024)
            for _ in range(TYPED // len(frame)):  # blocks while the master reads no more
                ws.send_binary(frame)
            client.wait(job_id, timeout=600)
        finally:
            ws.close()
        state = client.show(job_id)["state"]
        return f"{TYPED >> 20} MiB typed in {time.monotonic() - t0:.1f} s, the job {state}"

    return row


def _attach_flood(client: Client) -> Callable[[], str]:
    """Set-up (not measured): 100 held jobs; the row opens ATTACH_TRIES attach WebSockets
    to them at once (the caps refuse most), holds them 2 s, then closes them."""
    held = [client.submit("true", hold=True, env={}).id for _ in range(100)]

    def row() -> str:
        opened, refused = [], 0
        for i in range(ATTACH_TRIES):
            try:
                opened.append(client.attach(held[i % len(held)], output=False))
            except MgpuError:
                refused += 1
        time.sleep(2)  # held open: idle attachments must cost nothing
        for ws in opened:
            ws.close()
        for job_id in held:
            client.cancel(job_id)
        return f"{len(opened)} open, {refused} refused"

    return row


def _cli(cluster: LocalCluster, *args: str) -> str:
    res = subprocess.run(
        [str(BIN / "mgpu"), *args], capture_output=True, env=cluster.env, timeout=600, check=True
    )
    return f"{len(res.stdout.splitlines())} lines"


def _metrics(address: str) -> str:
    """The master's /metrics page."""
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _last_pass_ms(address: str) -> float | None:
    """The master's last scheduling pass (from /metrics), in ms."""
    for line in _metrics(address).splitlines():
        if line.startswith("mgpu_scheduler_pass_seconds "):
            return round(float(line.split()[1]) * 1000, 1)
    return None


HOLD_BUCKET = re.compile(r'^mgpu_event_loop_hold_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)$', re.M)


def _hold_buckets(address: str) -> dict[float, float]:
    """The master's loop-hold histogram (cumulative counts by upper bound, seconds)."""
    return {float(le): float(n) for le, n in HOLD_BUCKET.findall(_metrics(address))}


def _hold_summary(before: dict[float, float], after: dict[float, float]) -> tuple[str, int]:
    """The bucket of the longest hold between two readings ("<= 50" ms, or "> 2500"), and
    how many holds of 100 ms or more there were."""
    bounds = sorted(after)
    new = {b: after[b] - before.get(b, 0.0) for b in bounds}
    over = int(new[math.inf] - new.get(0.1, 0.0)) if math.inf in new else 0
    longest = "<= 1"
    previous = 0.0
    for b in bounds:
        if new[b] > previous:  # a hold landed in this bucket
            longest = f"<= {b * 1000:g}" if b != math.inf else f"> {bounds[-2] * 1000:g}"
        previous = new[b]
    return longest, over


@contextlib.contextmanager
def _followers(cluster: LocalCluster, job_id: str, n: int) -> Any:
    """`n` real `mgpu logs -f JOB` clients, started (and connected) before the row and
    killed after it (SIGKILL: a follower cancels its job on SIGTERM)."""
    procs = [
        subprocess.Popen(
            [str(BIN / "mgpu"), "logs", "-f", job_id],
            env=cluster.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    try:
        time.sleep(10)  # set-up, not measured: n Python clients start on a small machine
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()


def patient(cluster: LocalCluster) -> Client:
    """A client that waits as long as a 100,000-task request takes on a busy machine."""
    return Client(cluster.address, timeout=600, token=cluster.admin_token)


def _submit_array(client: Client) -> tuple[str, list[str]]:
    req = {"command": "sleep 600", "gpus": 1, "array": f"0-{TASKS - 1}%4", "env": {}}
    out = client._request("POST", "/api/jobs", req, timeout=900)
    return out["job_id"], out["task_ids"]


class Bench:
    def __init__(self, cluster: LocalCluster, probe: LoopProbe) -> None:
        self.cluster = cluster
        self.probe = probe
        self.rows: list[dict[str, Any]] = []
        self.walls: list[tuple[float, float]] = []
        """Each row's start and end (wall clock: the master's log has no other)."""

    def add_collections(self, log: str) -> list[float]:
        """Slow garbage collections the master logged: each row gets those that ended while
        it ran (`slow_gc_ms`); all of them are returned."""
        found = []
        pattern = r"^(\S+ \S+) WARNING mgpu.master: garbage collection of generation \d "
        pattern += r"took (\d+) ms"
        for stamp, ms in re.findall(pattern, log, flags=re.M):
            when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append(float(ms))
            for row, (w0, w1) in zip(self.rows, self.walls, strict=True):
                if w0 <= when <= w1 + 0.2:
                    row.setdefault("slow_gc_ms", []).append(float(ms))
        return found

    def add_holds(self, log: str) -> list[float]:
        """Loop holds of 100 ms or more the master logged: each row's longest replaces its
        bucket (`loop_hold_max_ms`); all of them are returned."""
        found = []
        pattern = r"^(\S+ \S+) WARNING mgpu.master: event loop held for (\d+) ms(.*)$"
        for stamp, ms, ran in re.findall(pattern, log, flags=re.M):
            when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append(float(ms))
            for row, (w0, w1) in zip(self.rows, self.walls, strict=True):
                if w0 <= when <= w1 + 0.2:
                    held = row.setdefault("loop_holds_ms", [])
                    held.append(float(ms))
                    row["loop_hold_max_ms"] = max(held)
                    running = re.search(r"\((\d+) ms of it running\)", ran)
                    if running:  # the rest: waiting for a CPU (or the GIL)
                        row.setdefault("loop_holds_running_ms", []).append(float(running[1]))
        return found

    def measure(self, name: str, fn: Callable[[], Any], times: int = 1) -> None:
        results: list[Any] = [None] * times

        def run(i: int) -> None:
            try:
                results[i] = fn()
            except Exception as e:  # reported in the table, not hidden
                results[i] = f"error: {e}"

        threads = [threading.Thread(target=run, args=(i,)) for i in range(times)]
        self.probe.settle()
        holds = _hold_buckets(self.cluster.address)
        t0 = time.monotonic()
        wall0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t1 = time.monotonic()
        time.sleep(0.1)  # the sample in flight at the end lands
        self.walls.append((wall0, time.time()))
        row: dict[str, Any] = {"request": name, "concurrent": times, "seconds": round(t1 - t0, 2)}
        row.update(summary(self.probe, t0, t1))
        row["rss_before_mb"] = rss_at(self.probe, t0)
        self.probe.settle()  # what the row left running (deliveries, closes) is over
        row["rss_after_mb"] = rss_at(self.probe)
        bucket, over = _hold_summary(holds, _hold_buckets(self.cluster.address))
        row["loop_hold_max_ms"] = bucket
        row["loop_holds_over_100ms"] = over
        row["result"] = str(results[0])
        self.rows.append(row)
        print(
            f"{name:<48} ×{times}  healthz p50 {row['healthz_p50_ms']:>7} ms  "
            f"max {row['healthz_max_ms']:>8} ms  loop hold {bucket:>7} ms ({over} over 100)  "
            f"RSS {row['rss_before_mb']}/{row['rss_peak_mb']}/{row['rss_after_mb']} MB  "
            f"{row['seconds']:>6} s  {row['result']}",
            flush=True,
        )

    def both(self, name: str, fn: Callable[[], Any]) -> None:
        self.measure(name, fn, 1)
        self.measure(name, fn, 3)


def chosen(argv: list[str]) -> set[str]:
    """The groups of rows to run: those named (all when none is)."""
    unknown = [name for name in argv if name not in GROUPS]
    if unknown:
        raise SystemExit(f"unknown group(s) {', '.join(unknown)}: choose from {', '.join(GROUPS)}")
    return set(argv or GROUPS)


def main(argv: list[str]) -> None:
    groups = chosen(argv)
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mgpu-abuse-") as tmp:
        cluster = LocalCluster(Path(tmp), CONFIG)
        receivers = _Receivers()
        try:
            cluster.start_master()
            cluster.start_agent("node001", gpus=4)
            assert cluster.master is not None
            probe = LoopProbe(cluster.address, cluster.master.pid, Path(tmp) / "probe.txt")
            client = cluster.client()
            token = cluster.admin_token
            address = cluster.address
            bench = Bench(cluster, probe)

            if "logs" in groups:
                # Set-up: a job with 50 MB of output.
                line = "x" * 79
                big = client.submit(f"yes {line} | head -c {OUTPUT_BYTES}", gpus=0, env={})
                client.wait(big.id, timeout=600)
                bench.both("logs of a 50 MB job (mgpu logs)", lambda: _logs(cluster, big.id))
            if "bodies" in groups:
                bench.both(
                    "100 MB body without a token", lambda: _big_body(address, None, chunked=False)
                )
                bench.measure(
                    "100 MB body, valid token (Content-Length)",
                    lambda: _big_body(address, token, chunked=False),
                )
                bench.measure(
                    "100 MB body, valid token (chunked)",
                    lambda: _big_body(address, token, chunked=True),
                )
            if "floods" in groups:
                bench.both(
                    f"flood: {FLOOD} requests with bad tokens at once", lambda: _flood(address)
                )
                bench.both(
                    f"for scale: {FLOOD} /healthz requests at once",
                    lambda: _flood(address, "/healthz"),
                )
            if "notify" in groups:
                bench.measure(
                    f"{NOTIFY_ENDS} job ends with a webhook (cancelled one by one)",
                    _notify_ends(client, receivers),
                )
                bench.measure(
                    f"{NOTIFY_FLOOD} job ends at once notifying a receiver that never answers",
                    _notify_flood(client, receivers),
                )
            if "typed" in groups:
                bench.measure(
                    f"typed input: {TYPED >> 20} MiB into a terminal", _typed_flood(client)
                )
            if "attach" in groups:
                bench.measure(
                    f"{ATTACH_TRIES} attach WebSockets at once (one user)", _attach_flood(client)
                )
            if groups & {"array", "followers"}:
                _array_rows(bench, cluster, client, groups)
            probe.stop()
        finally:
            cluster.stop()
            receivers.close()
            slow_gc = bench.add_collections(cluster.log("master"))
            holds = bench.add_holds(cluster.log("master"))
            errors = [x for x in cluster.log("master").splitlines() if "Error" in x]
            if errors:
                print("the master logged errors:", *errors[-20:], sep="\n  ")

    measured = [r for r in bench.rows if not r["request"].startswith("idle")]
    worst = max((r["healthz_max_ms"] for r in measured), default=None)
    out = {
        "groups": sorted(groups),
        "worst_loop_hold_ms": max(holds, default="< 100"),
        "loop_holds_over_100ms_ms": holds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "target_max_stall_ms": 100,
        "worst_stall_ms": worst,
        "slow_gc_collections_ms": slow_gc,
        "rows": bench.rows,
    }
    results = RESULTS
    if groups != set(GROUPS):
        results = RESULTS.with_name(f"abuse-{'-'.join(sorted(groups))}.json")
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps(out, indent=2) + "\n")
    print(f"worst /healthz latency over the requests: {worst} ms")
    print(f"loop holds of 100 ms or more (the master's monitor): {holds or 'none'}")
    print(f"load average at start {load_at_start}, at end {out['load_average_at_end']}")
    print(f"written to {results}")


def _array_rows(bench: Bench, cluster: LocalCluster, client: Client, groups: set[str]) -> None:
    """TASKS array tasks, 4 running, the rest queued: what requests about them cost
    ("array"), and followers of a job queued behind them ("followers")."""
    address, token = cluster.address, cluster.admin_token
    submitted: list[tuple[str, list[str]]] = []

    def submit() -> str:
        submitted.append(_submit_array(client))
        return f"{TASKS:,} task ids"

    bench.measure(f"submit a {TASKS:,}-task array", submit)
    array_id, ids = submitted[0]
    # Two re-planning intervals: at least one full scheduling pass over the queue.
    bench.measure(f"idle, {TASKS:,} tasks queued (12 s)", lambda: time.sleep(12))
    bench.rows[-1]["last_pass_ms"] = _last_pass_ms(address)
    if "followers" in groups:
        waiting = client.submit("true", gpus=1, env={}).id
        with _followers(cluster, waiting, FOLLOWERS):
            bench.measure(
                f"{FOLLOWERS} logs -f of a job queued behind {TASKS:,} tasks (12 s)",
                lambda: time.sleep(12),
            )
        client.cancel(waiting)
    if "array" not in groups:
        patient(cluster).cancel(array_id)
        return
    bench.both(
        f"queue --json, all {TASKS:,} tasks (GET /api/jobs)",
        lambda: f"{len(patient(cluster).queue()['jobs']):,} jobs",
    )
    bench.both(
        "a page of 100 queued jobs (GET /api/jobs?limit=100&state=queued)",
        lambda: len(client._request("GET", "/api/jobs?limit=100&state=queued")["jobs"]),
    )
    bench.both("mgpu queue (arrays folded by the master)", lambda: _cli(cluster, "queue"))
    bench.both(
        f"mgpu show ARRAY_ID ({TASKS:,} tasks: counts, first 1,000)",
        lambda: _cli(cluster, "show", array_id),
    )
    body = json.dumps({"ids": ids, "timeout": 0}).encode()
    bench.both(
        f"wait, {TASKS:,} ids in one request",
        lambda: _raw(address, "POST", "/api/wait", body, token),
    )
    bench.measure(
        f"cancel a {TASKS:,}-task array",
        lambda: len(patient(cluster).cancel(array_id)["cancelled"]),
    )
    wait_for(lambda: not client.queue()["jobs"], timeout=120, what="an empty queue")
    bench.measure(
        f"wait_all, {TASKS:,} ended ids (client)",
        lambda: len(patient(cluster).wait_all(ids, timeout=600)),
    )
    some = json.dumps({"ids": ids[:1000], "timeout": 0}).encode()
    bench.both(
        "wait, 1,000 ended ids (the most one request takes)",
        lambda: _raw(address, "POST", "/api/wait", some, token),
    )
    array_id, ids = _submit_array(client)
    bench.measure(
        f"cancel a {TASKS:,}-task array, 3 requests at once",
        lambda: len(patient(cluster).cancel(array_id)["cancelled"]),
        times=3,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
