"""Shared test factories: the scheduler's values (`node`, `job`, `running`), the master's
job record (`master_job`) and ASGI scopes (`http_scope`, `websocket_scope`) with defaults,
so that a test names only what it is about (after Nomad's `nomad/mock/`).

tests/ is on `sys.path` for every test module (tests/conftest.py); a bench script puts it
there itself (`sys.path.insert(0, ".../tests")`) before `from factories import ...`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mgpu.model import Job
from mgpu.scheduler import (
    Decisions,
    Dependency,
    JobRequest,
    NodeView,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from mgpu.scheduler.types import QueuePolicy

__all__ = [
    "HOUR",
    "MIB_PER_GIB",
    "PASS_NOW",
    "asgi_call",
    "cpu_node",
    "http_scope",
    "job",
    "master_job",
    "node",
    "running",
    "schedule_pass",
    "started",
    "websocket_scope",
]

HOUR = 3600.0


def node(
    node_id: str = "n1",
    free: Iterable[int] | None = None,
    *,
    gpus: int = 4,
    up: bool = True,
    features: Iterable[str] = (),
    shared: Mapping[int, int] | None = None,
    **kw: Any,
) -> NodeView:
    """A node of `gpus` GPUs numbered from 0, those in `free` free (None: every one);
    `shared`: GPU → share units held; `kw`: the view's other fields (rack, gpu_type)."""
    indices = tuple(range(gpus))
    return NodeView(
        node_id=node_id,
        gpu_indices=indices,
        free_gpus=frozenset(indices if free is None else free),
        schedulable=up,
        features=frozenset(features),
        shared=dict(shared or {}),
        **kw,
    )


def job(
    job_id: str = "j1",
    *,
    user: str = "alice",
    submit: float = 0.0,
    after: str = "",
    **kw: Any,
) -> JobRequest:
    """A queued job's request (one GPU unless `kw` says otherwise); `after`: its
    dependencies, as `--dependency` writes them ("afterok:A,afterany:B")."""
    deps = tuple(Dependency(*d.split(":", 1)) for d in after.split(",") if d)
    return JobRequest(job_id=job_id, user=user, submit_time=submit, dependencies=deps, **kw)


def running(
    job_id: str,
    node_id: str,
    gpus: Iterable[int],
    *,
    now: float,
    started: float = HOUR,
    ends_in: float | None = None,
    time_limit: float | None = None,
    share: int = 0,
    user: str = "bob",
    cpus: int = 0,
    mem_mb: int = 0,
    **kw: Any,
) -> RunningJob:
    """A job running on `gpus` of `node_id` since `started` seconds before `now`, with
    `time_limit`, or one that ends it `ends_in` seconds after `now` (neither: no limit of
    its own); `share`: the share units it holds of each (0: whole GPUs); `cpus`, `mem_mb`:
    what it holds of the node besides; `kw`: priority, preemptible, ..."""
    if ends_in is not None:
        time_limit = started + ends_in
    placement = Placement(node_id, tuple(gpus), share, cpus, mem_mb)
    return RunningJob(job_id, user, (placement,), now - started, time_limit, **kw)


def master_job(
    job_id: str = "a1b2c3d4", *, user: str = "alice", command: str = "true", **kw: Any
) -> Job:
    """The master's record of a job (queued unless `kw` says otherwise); its argv is
    `command` split on spaces."""
    return Job(id=job_id, user=user, argv=command.split(), command=command, **kw)


def http_scope(
    path: str,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    client: tuple[str, int] = ("127.0.0.1", 50000),
) -> dict[str, Any]:
    """An HTTP request's ASGI scope, as the server hands it to the app (`path` may carry a
    query string)."""
    path, _, query = path.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "scheme": "http",
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in (headers or {}).items()],
        "client": client,
        "server": ("127.0.0.1", 8080),
    }


def websocket_scope(
    path: str = "/api/agent", client: tuple[str, int] = ("127.0.0.1", 50000)
) -> dict[str, Any]:
    """A WebSocket connection's ASGI scope (an agent's, by default)."""
    scope = http_scope(path, client=client)
    del scope["method"]
    scope.update(type="websocket", scheme="ws", subprotocols=[])
    return scope


async def asgi_call(app: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, Any]:
    """(status, JSON body) of one HTTP request `app` answers in process."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(data)


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A stand-in HTTP server on loopback, in a thread: its `host:port` while open."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# --------------------------------------------------------------------------- CPUs, memory

MIB_PER_GIB = 1024
PASS_NOW = 1000.0
"""The `now` of the scheduler passes `schedule_pass` runs."""


def cpu_node(
    nid: str = "n1", *, gpus: int = 4, cpus: int = 8, free_cpus: int | None = None, **kw: Any
) -> NodeView:
    """A node offering `cpus` CPUs (all free unless `free_cpus`) and 64G of memory (all
    free unless `free_mem_mb`)."""
    kw.setdefault("mem_mb", 64 * MIB_PER_GIB)
    kw.setdefault("free_mem_mb", kw["mem_mb"])
    return node(nid, gpus=gpus, cpus=cpus, free_cpus=cpus if free_cpus is None else free_cpus, **kw)


def schedule_pass(
    nodes: list[NodeView],
    pending: list[JobRequest],
    running_jobs: list[RunningJob] | None = None,
    policy: QueuePolicy = "backfill",
    **config: Any,
) -> Decisions:
    """One pass of the core at `PASS_NOW` (no preemption unless `config` says so)."""
    config.setdefault("preemption", False)
    return schedule(
        Snapshot(
            now=PASS_NOW,
            nodes=nodes,
            pending=pending,
            running=running_jobs or [],
            config=SchedulerConfig(queue_policy=policy, **config),
        )
    )


def started(d: Decisions) -> dict[str, tuple[Placement, ...]]:
    """The pass's starts: job id -> its placements."""
    return {s.job_id: s.placements for s in d.starts}
