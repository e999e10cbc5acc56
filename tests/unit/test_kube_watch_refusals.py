"""The driver's watches meet a refusal (403: RBAC narrowed under it) and a 410 Gone (its
resourceVersion compacted away): one sentence in the log and the watch tried again, or a
fresh list; either way what changed meanwhile (a Pod of a running job deleted) reaches the
job's run, so no job waits for an event it missed (issue 33, item 5).  The API client's
Protocol (mgpu.kube.api) is faked: these are its error paths."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from mgpu.config import Partition
from mgpu.kube import Watch
from mgpu.kube.errors import from_status
from mgpu.kubesection import KubernetesSection
from mgpu.master.kube import driver
from mgpu.master.kube.driver import KubePartition
from mgpu.master.kube.pods import PodRuns
from mgpu.master.kube.runs import PodRun

FORBIDDEN = {
    "kind": "Status", "reason": "Forbidden", "code": 403,
    "message": 'pods is forbidden: User "mgpu" cannot watch resource "pods" at the cluster scope',
}  # fmt: skip


def _pod(name: str, uid: str, ours: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if ours:
        meta["labels"] = {"mgpu.io/cluster": "lab", "mgpu.io/epoch": "1", "mgpu.io/rank": "0"}
        meta["annotations"] = {"mgpu.io/job-id": "5", "mgpu.io/node": "n1"}
    return {"metadata": meta, "spec": {}, "status": {"phase": "Running"}}


class _Server:
    """Answers each list with the next of `lists`, each watch with the next of `watches`
    (events to send, then an error to raise; the last one never ends)."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[Any]) -> None:
        self.lists, self.watches = lists, watches
        self.listed = 0
        self.idle = asyncio.Event()

    async def request(self, method: str, path: str, doing: str, **kw: Any) -> Any:
        items = self.lists.pop(0)
        self.listed += 1
        return {"metadata": {"resourceVersion": str(self.listed * 10)}, "items": items}

    async def stream_lines(
        self, path: str, doing: str, params: Mapping[str, str | int], timeout: float | None
    ) -> AsyncIterator[bytes]:
        events, error = self.watches.pop(0)
        for event in events:
            yield __import__("json").dumps(event).encode()
        if error is not None:
            raise error
        self.idle.set()
        await asyncio.Event().wait()

    async def get_pod(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise AssertionError("not asked")


class _Runs:
    """The driver's runs, recording what it tells them."""

    def __init__(self) -> None:
        self.runs = {"mgpu-lab-5-1-0": PodRun("mgpu-lab-5-1-0", "5", 1, 0, "n1", 0.0)}
        self.seen: list[tuple[str, bool]] = []

    def observe(self, run: PodRun, pod: dict[str, Any], deleted: bool) -> None:
        self.seen.append((run.name, deleted))


def _partition() -> KubePartition:
    cluster = SimpleNamespace(config=SimpleNamespace(cluster=SimpleNamespace(name="lab")))
    part = Partition(name="k8s", kubernetes=KubernetesSection(namespace="default"))
    kp = KubePartition(cluster, part)  # type: ignore[arg-type]
    kp.started = True  # the first lists were made: changes go to the runs
    kp.runs = _Runs()  # type: ignore[assignment]
    return kp


def test_a_410_and_a_403_end_in_a_fresh_list_that_the_runs_see(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(driver, "WATCH_RETRY", 0.01)
    job_pod, other = _pod("mgpu-lab-5-1-0", "u-job", ours=True), _pod("train", "u-other")
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    server = _Server(
        lists=[[job_pod, other], [job_pod], []],
        watches=[
            ([{"type": "MODIFIED", "object": other}, gone], None),  # 410: list again
            ([], from_status(403, FORBIDDEN, "watch pods")),  # RBAC narrowed: refused
            ([], None),  # allowed again: the third list, then a quiet watch
        ],
    )
    kp = _partition()
    kp.client = server  # type: ignore[assignment]

    async def scenario() -> None:
        make = lambda client: Watch(client, "/api/v1/pods", "watch pods", {}, retry_delay=0)  # noqa: E731
        task = asyncio.create_task(kp._watching(make, "pods", kp._pod_event))
        try:
            await asyncio.wait_for(server.idle.wait(), 30)
        finally:
            task.cancel()

    with caplog.at_level(logging.INFO, logger="mgpu.master.kube"):
        asyncio.run(scenario())
    assert server.listed == 3
    assert kp.pods == {}  # the last list's: both Pods went while the watch was refused
    assert kp.mine == {}
    # The job's Pod, deleted while the watch was refused, is its run's end (not a wait for ever).
    assert kp.runs.seen == [("mgpu-lab-5-1-0", False), ("mgpu-lab-5-1-0", False),  # type: ignore[union-attr]
                            ("mgpu-lab-5-1-0", True)]  # fmt: skip
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # the 410 is silent
    line = errors[0].getMessage()
    assert line == (
        'Kubernetes partition k8s: Kubernetes refused to watch pods: pods is forbidden: User "mgpu"'
        ' cannot watch resource "pods" at the cluster scope. (again in 0 s)'
    ), line
    assert errors[0].exc_info is None and "\n" not in line  # a sentence, no traceback


class _RefusingClient:
    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []

    async def delete_pod(self, name: str, namespace: str, **kw: Any) -> None:
        self.asked.append((name, bool(kw.get("force"))))
        raise from_status(403, {**FORBIDDEN, "message": "pods is forbidden"}, "delete pod")


def test_a_kill_whose_pod_deletion_is_refused_ends_the_run() -> None:
    """Without the `delete` verb the Pod is never deleted: the run ends at once (its job is
    not left `cancelling` for ever), the Pod left to count as another workload's."""
    told: list[tuple[str, Any]] = []
    cluster = SimpleNamespace(agent_message=lambda node, message: told.append((node, message)))
    client = _RefusingClient()
    runs = PodRuns(cluster, "k8s", KubernetesSection(), client)  # type: ignore[arg-type]
    run = runs.runs["mgpu-lab-5-1-0"] = PodRun("mgpu-lab-5-1-0", "5", 1, 0, "n1", 0.0)

    async def scenario() -> None:
        runs.kill("n1", "5", 1, grace=2.0)
        while runs._tasks:
            await asyncio.gather(*runs._tasks)

    asyncio.run(scenario())
    assert client.asked == [("mgpu-lab-5-1-0", False)]
    assert run.ended and run.force_at is None  # no forced delete tried for ever
    assert [(node, type(m).__name__, m.job_id, m.epoch) for node, m in told] == [
        ("n1", "Exited", "5", 1)
    ]
