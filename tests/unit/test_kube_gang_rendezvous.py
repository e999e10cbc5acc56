"""A gang's rank > 0 waits for its rank-0 Pod's address before its own Pod is made
(mgpu.master.kube.gang): a rank 0 that ended quickly still gives it, and a rank killed
while it waits (rank 0 failed: the master kills the rest) is told ended, never made; before,
it waited for ever and its job stayed running."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

from mgpu.kubesection import KubernetesSection
from mgpu.master.kube.gang import first_pod_ip
from mgpu.master.kube.pods import PodRuns
from mgpu.master.kube.runs import PodRun
from mgpu.model import JobState
from mgpu.protocol import Exited

BOUND = 10.0


def _rank0(ip: str = "", ended: bool = False) -> PodRun:
    run = PodRun("mgpu-lab-5-1-0", "5", 1, 0, "n1", 0.0)
    run.ip, run.ended = ip, ended
    return run


def test_a_rank0_that_ended_and_left_still_gives_its_address() -> None:
    run = _rank0()
    seen = iter([run, None])

    def rank0() -> PodRun | None:
        found = next(seen, None)
        if found is None:  # it ended and was deleted, its address seen meanwhile
            run.ip, run.ended = "10.0.0.7", True
        return found

    assert asyncio.run(asyncio.wait_for(first_pod_ip(rank0, lambda: True), BOUND)) == "10.0.0.7"


def test_a_rank0_that_ended_without_an_address_makes_none() -> None:
    run = _rank0()
    seen = iter([run])

    def rank0() -> PodRun | None:
        found = next(seen, None)
        run.ended = found is None
        return found

    assert asyncio.run(asyncio.wait_for(first_pod_ip(rank0, lambda: True), BOUND)) is None


def _runs(told: list[tuple[str, BaseModel]]) -> PodRuns:
    job = SimpleNamespace(id="5", epoch=1, state=JobState.RUNNING)
    cluster = SimpleNamespace(
        config=SimpleNamespace(cluster=SimpleNamespace(name="lab")),
        jobs={"5": job},
        store=SimpleNamespace(fence=SimpleNamespace(generation=None)),
        agent_message=lambda node, message: told.append((node, message)),
    )
    return PodRuns(cluster, "k8s", KubernetesSection(), None)  # type: ignore[arg-type]


def test_a_rank_killed_while_it_waits_is_told_ended_and_never_made() -> None:
    told: list[tuple[str, Any]] = []
    runs = _runs(told)
    job = runs.cl.jobs["5"]

    async def scenario() -> str | None:
        waiting = asyncio.create_task(runs._rank0_address(job, 1, "n2"))
        while not runs.awaiting:  # it waits: rank 0 has no Pod address (nor Pod) yet
            await asyncio.sleep(0.01)
        runs.kill("n2", "5", 1, grace=5.0)  # rank 0 failed: the master ends the rest
        return await asyncio.wait_for(waiting, BOUND)

    assert asyncio.run(scenario()) is None
    [(node, exited)] = told
    assert node == "n2" and isinstance(exited, Exited)
    assert (exited.job_id, exited.epoch, exited.exit_code) == ("5", 1, None)
    assert exited.launch_error is None  # killed: not a launch failure of its own
    assert runs.awaiting == {}


def test_a_rank_whose_rank0_ended_without_an_address_fails_to_launch() -> None:
    told: list[tuple[str, Any]] = []
    runs = _runs(told)
    runs.runs["mgpu-lab-5-1-0"] = _rank0(ended=True)
    address = asyncio.run(asyncio.wait_for(runs._rank0_address(runs.cl.jobs["5"], 1, "n2"), BOUND))
    assert address is None
    [(node, exited)] = told
    assert node == "n2" and "rank-0 pod ended before it had an address" in exited.launch_error
