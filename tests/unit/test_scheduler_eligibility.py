"""`eligibility()`: retry backoff, dependencies and array caps, before `schedule()`."""

from __future__ import annotations

import re

from factories import job
from mgpu.model import WaitCode
from mgpu.scheduler import Dependency, DependencyTarget, eligibility
from mgpu.scheduler.eligibility import backoff_reason, begin_reason

NOW = 1_000_000.0


def ended(job_id: str, state: str) -> DependencyTarget:
    return DependencyTarget(job_id, state)


def live(job_id: str) -> DependencyTarget:
    return DependencyTarget(job_id)


def test_jobs_that_wait_for_nothing_pass_in_order() -> None:
    queued = [job("a"), job("b"), job("c", eligible_time=NOW)]
    result = eligibility(queued, NOW)
    assert result.eligible == queued
    assert (result.waiting, result.cancel, result.satisfied) == ({}, {}, set())


def test_retry_backoff() -> None:
    result = eligibility([job("a", eligible_time=NOW + 30)], NOW)
    assert result.eligible == []
    assert result.waiting == {"a": backoff_reason(NOW + 30)}
    assert re.fullmatch(r"retry backoff until \d\d:\d\d:\d\d", result.waiting["a"])


def test_begin_time_waits_until_the_clock_passes_it() -> None:
    queued = [job("a", begin_time=NOW + 3600), job("b", begin_time=NOW)]
    result = eligibility(queued, NOW)
    assert [j.job_id for j in result.eligible] == ["b"]  # a begin reached: eligible
    assert result.waiting == {"a": begin_reason(NOW + 3600)}
    assert result.waiting["a"].code is WaitCode.BEGIN_TIME
    assert re.fullmatch(r"begin time \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", result.waiting["a"])
    assert [j.job_id for j in eligibility(queued, NOW + 3600).eligible] == ["a", "b"]


def test_backoff_is_checked_before_dependencies() -> None:
    # Not cancelled while it backs off: the verdict on its dependency comes later.
    queued = [job("a", after="afterok:x", eligible_time=NOW + 30)]
    result = eligibility(queued, NOW, {"x": [ended("x", "failed")]})
    assert list(result.waiting) == ["a"] and result.cancel == {}


def test_each_dependency_kind() -> None:
    targets = {
        "ok": [ended("ok", "completed")],
        "bad": [ended("bad", "failed")],
        "run": [live("run")],
    }
    queued = [
        job("ok-ok", after="afterok:ok"),
        job("ok-bad", after="afterok:bad"),
        job("ok-run", after="afterok:run"),
        job("not-ok", after="afternotok:ok"),
        job("not-bad", after="afternotok:bad"),
        job("any-bad", after="afterany:bad"),
        job("any-run", after="afterany:run"),
    ]
    result = eligibility(queued, NOW, targets)
    assert [j.job_id for j in result.eligible] == ["ok-ok", "not-bad", "any-bad"]
    assert result.waiting == {
        "ok-run": "waiting for dependency run",
        "any-run": "waiting for dependency run",
    }
    assert result.cancel == {
        "ok-bad": "dependency afterok:bad can never be satisfied (bad ended failed)",
        "not-ok": "dependency afternotok:ok can never be satisfied (ok ended completed)",
    }
    assert result.satisfied == {
        Dependency("afterok", "ok"),
        Dependency("afternotok", "bad"),
        Dependency("afterany", "bad"),
    }


def test_a_dependency_on_an_array_needs_every_task() -> None:
    tasks = [ended("arr_0", "completed"), live("arr_1"), ended("arr_2", "timeout")]
    result = eligibility([job("a", after="afterok:arr")], NOW, {"arr": tasks})
    assert result.waiting == {"a": "waiting for dependency arr"}  # arr_1 still runs
    tasks[1] = ended("arr_1", "completed")
    result = eligibility([job("a", after="afterok:arr")], NOW, {"arr": tasks})
    assert result.cancel == {
        "a": "dependency afterok:arr can never be satisfied (arr_2 ended timeout)"
    }


def test_a_dependency_without_targets_counts_as_met() -> None:
    result = eligibility([job("a", after="afterok:gone,afterany:x")], NOW, {"x": []})
    assert [j.job_id for j in result.eligible] == ["a"]
    assert result.satisfied == {Dependency("afterok", "gone"), Dependency("afterany", "x")}


def test_only_the_dependencies_before_the_first_unmet_one_are_satisfied() -> None:
    targets = {"x": [ended("x", "completed")], "y": [live("y")], "z": [ended("z", "completed")]}
    result = eligibility([job("a", after="afterok:x,afterok:y,afterok:z")], NOW, targets)
    assert result.waiting == {"a": "waiting for dependency y"}
    assert result.satisfied == {Dependency("afterok", "x")}


def test_a_job_cancelled_here_has_ended_for_the_jobs_after_it() -> None:
    targets = {"x": [ended("x", "failed")], "a": [live("a")]}
    before = job("before", after="afterok:a")
    a = job("a", after="afterok:x")
    after, handler = job("after", after="afterok:a"), job("handler", after="afternotok:a")
    result = eligibility([before, a, after, handler], NOW, targets)
    assert result.waiting == {"before": "waiting for dependency a"}  # judged before a was
    assert result.cancel == {
        "a": "dependency afterok:x can never be satisfied (x ended failed)",
        "after": "dependency afterok:a can never be satisfied (a ended cancelled)",
    }
    assert result.eligible == [handler]


def test_array_cap_counts_running_tasks_and_those_let_through() -> None:
    tasks = [job(f"arr_{i}", array_id="arr", array_max_running=2) for i in range(4)]
    other = job("other_0", array_id="other", array_max_running=1)
    result = eligibility([*tasks, other], NOW, array_running={"arr": 1})
    assert [j.job_id for j in result.eligible] == ["arr_0", "other_0"]
    assert result.waiting == {f"arr_{i}": "array limit of 2 running tasks" for i in (1, 2, 3)}
    # A task that waits for something else does not take a place under the cap.
    tasks[0] = job("arr_0", array_id="arr", array_max_running=2, eligible_time=NOW + 5)
    result = eligibility(tasks, NOW, array_running={"arr": 1})
    assert [j.job_id for j in result.eligible] == ["arr_1"]
