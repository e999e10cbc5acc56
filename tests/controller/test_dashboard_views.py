"""The dashboard's compact views (mgpu.master.monitor.dashboard) over the real controller: the heat
map's letters and counts, details only where asked on a big cluster, the job list's
filters and pages, finished jobs from the store, and the ETag that spares a redraw."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness
from starlette.requests import Request

from factories import http_scope
from mgpu.master.monitor import dashboard
from mgpu.master.monitor.dashboard import BadFilter, etagged, job_page, overview
from mgpu.protocol import GpuTelemetry


def page(h: Harness, state: str = "active", user: str | None = None, q: str | None = None,
         offset: int = 0, limit: int = 50) -> dict[str, Any]:  # fmt: skip
    return asyncio.run(job_page(h.cl, state, user, q, offset, limit))


def ids(answer: dict[str, Any]) -> list[str]:
    return [j["id"] for j in answer["jobs"]]


def test_heat_map_letters_and_counts(h: Harness) -> None:
    h.agent("n1", gpus=4)
    h.agent("n2", gpus=2)
    h.agent("n3", gpus=2)
    running = h.start(gpus=2, nodelist=["n1"])
    h.submit(dependency=f"afterok:{running}", user="bob")  # waits, whatever is free
    h.cl.drain("n2", "maintenance")
    h.agents["n3"].disconnect()
    h.settle()
    ov = overview(h.cl, [])
    assert ov["heat"] == [
        ["n1", "online", "bbff"],
        ["n2", "drained", "nn"],
        ["n3", "reconnecting", "dd"],  # its agent's link dropped: not lost yet
    ]
    assert ov["gpus"] == {
        "total": 8,
        "busy": 2,
        "shared": 0,
        "free": 2,
        "foreign": 0,
        "held": 2,
        "down": 2,
    }
    assert ov["nodes"] == {"total": 3, "online": 1}
    assert ov["jobs"] == {"running": 1, "queued": 1, "idle": 0}
    assert ov["users"] == ["alice", "bob"]
    # A small cluster: every node detailed, with the jobs that hold a slot there.
    n1 = next(d for d in ov["details"] if d["node_id"] == "n1")
    assert [d["node_id"] for d in ov["details"]] == ["n1", "n2", "n3"]
    assert n1["job_rows"] == [
        {"id": running, "name": None, "user": "alice", "state": "running", "gpus": 2}
    ]
    assert {g["busy_user"] for g in n1["gpus"] if g["busy_job"]} == {"alice"}


def test_a_big_cluster_details_only_the_nodes_asked_for(h: Harness) -> None:
    for i in range(dashboard.SMALL_CLUSTER + 1):
        h.agent(f"n{i:02d}", gpus=1)
    ov = overview(h.cl, [])
    assert len(ov["heat"]) == dashboard.SMALL_CLUSTER + 1 and ov["details"] == []
    ov = overview(h.cl, ["n03", "nope"])
    assert [d["node_id"] for d in ov["details"]] == ["n03"]


def test_job_list_filters_pages_and_finished_jobs(h: Harness) -> None:
    agent = h.agent("n1", gpus=2)
    done = h.start(name="warmup")
    agent.exited(done, 0)
    h.settle()
    run = h.start(name="train-big", user="bob")
    waiting = [h.submit(name=f"sweep-{i}", dependency=f"afterok:{run}") for i in range(7)]
    assert page(h)["total"] == 8 and ids(page(h))[0] == run  # submit order
    assert ids(page(h, "running")) == [run]
    assert ids(page(h, "queued", limit=3)) == waiting[:3]
    second = page(h, "queued", offset=3, limit=3)
    assert ids(second) == waiting[3:6] and second["total"] == 7
    assert ids(page(h, "queued", offset=6, limit=3)) == waiting[6:]
    assert ids(page(h, user="bob")) == [run]
    assert ids(page(h, q="SWEEP-3")) == [waiting[3]]  # name, any case
    assert ids(page(h, q=waiting[5][-4:])) == [waiting[5]]  # or id
    # Finished jobs come from the store, newest first; `all` is active then finished.
    assert ids(page(h, "completed")) == [done]
    finished = page(h, "finished")
    assert ids(finished) == [done] and finished["finished_window"] == dashboard.FINISHED_WINDOW
    assert ids(page(h, "all"))[-1] == done and page(h, "all")["total"] == 9
    assert page(h, "failed")["total"] == 0
    # A row is the job's JSON less what the list does not show.
    row = page(h, "running")["jobs"][0]
    assert row["allocation"][0]["gpu_ids"] == [0] and row["user"] == "bob" and not row["idle"]
    assert "attempts" not in row and "command" in row


def test_a_bad_state_is_one_sentence(h: Harness) -> None:
    with pytest.raises(BadFilter, match="state 'runing' is not one of"):
        page(h, "runing")


def _request(tag: str | None) -> Request:
    return Request(http_scope("/", headers={} if tag is None else {"if-none-match": tag}))


def test_the_etag_spares_an_unchanged_answer() -> None:
    first = etagged(_request(None), {"a": 1})
    tag = first.headers["etag"]
    assert first.status_code == 200 and json.loads(bytes(first.body)) == {"a": 1}
    assert etagged(_request(tag), {"a": 1}).status_code == 304
    changed = etagged(_request(tag), {"a": 2})
    assert changed.status_code == 200 and changed.headers["etag"] != tag


def test_a_shared_gpu_has_its_letter_and_its_occupants(h: Harness) -> None:
    h.agent("n1", gpus=2)
    shares = [h.start(gpu_share=0.5, user=u) for u in ("alice", "bob")]
    ov = overview(h.cl, [])
    assert ov["heat"] == [["n1", "online", "sf"]]
    assert ov["gpus"]["shared"] == 1 and ov["gpus"]["free"] == 1
    (gpu0, _) = ov["details"][0]["gpus"]
    occupants = {(o["job_id"], o["user"]) for o in gpu0["shared_jobs"]}
    assert occupants == set(zip(shares, ("alice", "bob"), strict=True))


def test_an_idle_job_is_counted(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"scheduling": {"idle_after_minutes": 1}})
    busy, quiet = h.agent("n1", gpus=1), h.agent("n2", gpus=1)
    h.start(nodelist=["n1"])
    h.start(nodelist=["n2"])
    for dt in (0, 61):
        h.advance(dt)
        busy.heartbeat([GpuTelemetry(index=0, utilization_pct=90.0)])
        quiet.heartbeat([GpuTelemetry(index=0, utilization_pct=0.0)])
    assert overview(h.cl, [])["jobs"] == {"running": 2, "queued": 0, "idle": 1}
