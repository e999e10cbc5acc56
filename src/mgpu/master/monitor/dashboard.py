"""The web dashboard's own views: what the page needs, compact at any cluster size (the
routes are the edge's: master/http/dashboard.py).

- GET /api/dashboard/overview: counts, the users with work, and the heat map (one row per
  node: id, state and a letter per GPU); the full details of the nodes named in `open`, and
  of every node when the cluster is small (at most SMALL_CLUSTER nodes).
- GET /api/dashboard/jobs: one page of jobs, filtered by state, user and a search text
  (job id or name), with the number that match.

Both answer with an ETag (a hash of the body) and `304 Not Modified` when the page sends
it back unchanged, so a page polling a quiet cluster fetches and redraws nothing.  A scan
of the active jobs (100k queued) yields the loop every SCAN_SLICE jobs.

The node details (`node_details`) are one dict per node: a new section (shared GPUs'
occupants, estimated starts) is a new key here and a new renderer in app.js's
NODE_SECTIONS.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from fastapi import Request, Response

from mgpu.master.monitor.kubeholders import gpu_holders
from mgpu.master.monitor.observe import Observed
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job, JobState, NodeState

SMALL_CLUSTER = 16
"""Up to this many nodes the overview details every node (the page shows them all)."""
MAX_OPEN = 32
"""Nodes whose details one overview may carry on request."""
PAGE_MAX = 500
FINISHED_WINDOW = 1000
"""Finished jobs the list reaches back to (the newest), as `mgpu queue --all` does."""
SCAN_SLICE = 20000

ACTIVE = {JobState.QUEUED.value, JobState.RUNNING.value}
FINISHED = {s.value for s in JobState if s.terminal}
STATE_FILTERS = {"active", "all", "finished", *ACTIVE, *FINISHED}

# One letter per GPU in the heat map.
BUSY, SHARED, FREE, FOREIGN, HELD, DOWN = "b", "s", "f", "x", "n", "d"
"""busy with an mgpu job; shared by fractional jobs; free; used outside mgpu (not offered);
free but not offered (the node drains or is drained); down (the node is offline or not
connected)."""
ROW_LEFT_OUT = (
    "attempts",
    "priority_factors",
    "priority_value",
    "gpu_util_mean",
    "gpu_memory_peak_mb",
)
"""Fields of a job's JSON the list does not show: heavy, or changing at every pass or
heartbeat (a page of jobs that did not change keeps its ETag)."""


class Dashboarded(Observed, Protocol):
    """What the dashboard reads of the controller: the observed state and a job's JSON."""

    def public_job(self, job: Job) -> dict[str, Any]: ...


_STATE, _USER = operator.attrgetter("state"), operator.attrgetter("user")


class BadFilter(ValueError):
    """A filter the page (or a user's URL) got wrong; the message is one sentence."""


def gpu_letters(node: NodeRecord) -> str:
    """The node's GPUs as heat-map letters, in index order."""
    if not node.connected or node.state == NodeState.OFFLINE:
        return DOWN * len(node.gpus)
    offered = node.state == NodeState.ONLINE
    out = []
    for g in node.gpus:
        if g.index in node.busy:
            out.append(BUSY)
        elif g.index in node.shares:
            out.append(SHARED)
        elif g.index in node.foreign_blocked:
            out.append(FOREIGN)
        else:
            out.append(FREE if offered else HELD)
    return "".join(out)


RECONNECTING = "reconnecting"
"""What the page shows for a node that is up but whose agent is not connected: it lost its
link, or a new leader has not heard from it yet.  Offline once silent for its timeout."""


def node_state(node: NodeRecord) -> str:
    """The state the page shows: the node's, or `reconnecting` while its agent is not
    connected (not offline until it has been silent for its timeout)."""
    if node.connected or node.state == NodeState.OFFLINE:
        return node.state.value
    return RECONNECTING


def node_details(node: NodeRecord, jobs: Mapping[str, Job]) -> dict[str, Any]:
    """One node in full (as GET /api/nodes has it) and the active jobs that hold a slot on it."""
    here = [jobs[j] for j in sorted(node.jobs) if j in jobs]
    out = node.to_public({j.id: j.user for j in here})
    out["job_rows"] = [
        {"id": j.id, "name": j.name, "user": j.user, "state": j.state.value, "gpus": j.gpus}
        for j in here
    ]
    if node.partition is not None:  # a Kubernetes Node: who holds its GPUs, Pod by Pod
        out["gpu_holders"] = gpu_holders(node, jobs)
    return out


def job_counts(cl: Observed) -> tuple[dict[str, int], list[str]]:
    """Running, queued and idle jobs, and the users with active work.  The active jobs
    (100k queued) are walked by C code only (map, Counter, set); running jobs, the only
    ones that can be idle, are found from the nodes they hold slots on."""
    active = cl.jobs.values()
    states = Counter(map(_STATE, active))
    users = set(map(_USER, active))
    running = {j for n in cl.nodes.values() for j in n.jobs}
    idle = sum(
        1
        for job_id in running
        if (job := cl.jobs.get(job_id)) is not None
        and job.state is JobState.RUNNING
        and cl.gpuwatch.job_fields(job)["idle"]
    )
    counts = {"running": states[JobState.RUNNING], "queued": states[JobState.QUEUED], "idle": idle}
    return counts, sorted(users)


def overview(cl: Observed, open_ids: Iterable[str]) -> dict[str, Any]:
    nodes = [cl.nodes[k] for k in sorted(cl.nodes)]
    heat = [[n.node_id, node_state(n), gpu_letters(n)] for n in nodes]
    letters = Counter("".join(row[2] for row in heat))
    jobs, users = job_counts(cl)
    wanted = set(open_ids)
    shown = nodes if len(nodes) <= SMALL_CLUSTER else [n for n in nodes if n.node_id in wanted]
    return {
        "nodes": {
            "total": len(nodes),
            "online": sum(1 for row in heat if row[1] == NodeState.ONLINE.value),
        },
        "gpus": {
            "total": sum(letters.values()),
            "busy": letters[BUSY],
            "shared": letters[SHARED],
            "free": letters[FREE],
            "foreign": letters[FOREIGN],
            "held": letters[HELD],
            "down": letters[DOWN],
        },
        "jobs": jobs,
        "users": users,
        "heat": heat,
        "details": [node_details(n, cl.jobs) for n in shown],
    }


def job_row(cl: Dashboarded, job: Job) -> dict[str, Any]:
    """A row of the job list: the job's JSON (GET /api/jobs/ID) less ROW_LEFT_OUT."""
    row = cl.public_job(job)
    for key in ROW_LEFT_OUT:
        row.pop(key, None)
    return row


def matcher(state: str, user: str | None, text: str | None) -> Callable[[Job], bool]:
    """The filter as one predicate (the state is checked by the caller's choice of source
    where it can be: active jobs in memory, finished ones in the store)."""
    if state not in STATE_FILTERS:
        choices = ", ".join(sorted(STATE_FILTERS))
        raise BadFilter(f"state {state!r} is not one of {choices}")
    wanted = {
        "active": ACTIVE,
        "all": ACTIVE | FINISHED,
        "finished": FINISHED,
    }.get(state, {state})
    needle = (text or "").strip().lower()

    def match(job: Job) -> bool:
        if job.state.value not in wanted or (user and job.user != user):
            return False
        return not needle or needle in job.id.lower() or needle in (job.name or "").lower()

    return match


async def scan(
    jobs: Iterable[Job], match: Callable[[Job], bool], offset: int, limit: int
) -> tuple[int, list[Job]]:
    """How many of `jobs` match, and the matches from `offset` on (at most `limit`); the
    loop is yielded every SCAN_SLICE jobs."""
    total, page = 0, []
    for chunk in _slices(list(jobs), SCAN_SLICE):
        for job in chunk:
            if match(job):
                if offset <= total < offset + limit:
                    page.append(job)
                total += 1
        await asyncio.sleep(0)
    return total, page


def _slices(items: list[Job], size: int) -> Iterator[list[Job]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def job_page(
    cl: Dashboarded, state: str, user: str | None, text: str | None, offset: int, limit: int
) -> dict[str, Any]:
    match = matcher(state, user, text)
    sources: list[Job] = []
    if state in ("active", "all") or state in ACTIVE:
        sources += cl.jobs.values()
    finished = state in ("finished", "all") or state in FINISHED
    if finished:
        states = FINISHED if state in ("finished", "all") else {state}
        # Newest first, read through the store's own connection in a thread.
        done = await asyncio.to_thread(cl.finished_since, 0.0, user, states, FINISHED_WINDOW)
        sources += [j for j in done if j.id not in cl.jobs]
    if state == "active" and not user and not (text or "").strip():
        # Every active job, in submit order: no scan (the usual view of a long queue).
        total, page = len(sources), sources[offset : offset + limit]
    else:
        total, page = await scan(sources, match, offset, limit)
    return {
        "total": total,
        "offset": offset,
        "limit": limit,
        "finished_window": FINISHED_WINDOW if finished else None,
        "jobs": [job_row(cl, j) for j in page],
    }


def etagged(request: Request, body: dict[str, Any]) -> Response:
    """`body` as JSON with its hash as the ETag; 304 if the page already has this one."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    tag = '"' + hashlib.blake2b(raw, digest_size=12).hexdigest() + '"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == tag:
        return Response(status_code=304, headers=headers)
    return Response(raw, media_type="application/json", headers=headers)
