"""Retention: old output files, job rows and audit events go, recent ones stay; the
per-user output cap drops a user's further output with one marker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from harness import FakeAgent, Harness

from mgpu.master.control import retention
from mgpu.master.store.outputs import MARKER

DAY = 86400.0


def finished(h: Harness, a: FakeAgent, text: str) -> str:
    """A job that wrote `text` and ended."""
    job_id = h.start()
    a.output(job_id, text)
    a.exited(job_id, 0)
    h.settle()
    return job_id


def test_old_rows_and_files_go_and_recent_ones_stay(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"retention": {"output_days": 30, "jobs_days": 180, "audit_days": 365}})
    a = h.agent("n1")
    old = finished(h, a, "old output\n")
    h.advance(100 * DAY)
    a.heartbeat()
    recent = finished(h, a, "recent output\n")
    h.store.save_steps([(old, {"number": 0}), (recent, {"number": 0})])  # srun steps they ran
    h.sql("UPDATE events SET time = ?", (h.clock.time() - 400 * DAY,))
    h.store.record_event("recent_event")
    assert h.outputs.path(old).exists() and h.outputs.path(recent).exists()
    while h.cl.retention.prune_slice(h.clock.time()):
        pass
    assert not h.outputs.path(old).exists()  # 100 days > 30: its file is gone...
    assert h.store.get_job(old) is not None  # ...its row is not (180 days)
    assert h.outputs.path(recent).exists()
    assert [e["kind"] for e in h.store.events()] == ["recent_event"]
    h.advance(100 * DAY)
    while h.cl.retention.prune_slice(h.clock.time()):
        pass
    assert h.store.get_job(old) is None and h.store.get_job(recent) is not None
    assert list(h.store.steps_of([old, recent])) == [recent]  # its steps went with its row
    assert not h.outputs.path(recent).exists()


def test_retention_null_keeps(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"retention": {"output_days": None, "jobs_days": None, "audit_days": None}})
    a = h.agent("n1")
    job_id = finished(h, a, "kept\n")
    h.advance(1000 * DAY)
    assert h.cl.retention.prune_slice(h.clock.time()) is False
    assert h.outputs.path(job_id).exists() and h.store.get_job(job_id) is not None


def test_a_users_output_is_capped_over_all_their_jobs(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness({"limits": {"max_output_per_user": 300}})
    a = h.agent("n1")
    first, second = h.start(), h.start()
    other = h.start(user="bob")
    a.output(first, "x" * 150 + "\n")
    a.output(second, "y" * 150 + "\n")  # past alice's 300 bytes: dropped, one marker
    a.output(second, "more\n")
    a.output(other, "bob's\n")
    h.settle()
    texts = [r["d"] for r in h.outputs.read(second)]
    assert len(texts) == 1 and texts[0].startswith("\n" + MARKER)
    assert "limits.max_output_per_user" in texts[0]
    assert [r["d"] for r in h.outputs.read(other)] == ["bob's\n"]


def test_a_restart_counts_the_files_on_disk_again(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"limits": {"max_output_per_user": 10_000}})
    a = h.agent("n1")
    finished(h, a, "z" * 500 + "\n")
    used = h.outputs.user_bytes["alice"]
    h.cl.flush_all()
    h.crash()
    h.outputs.user_bytes.clear()
    asyncio.run(h.cl.retention.count_usage())
    assert h.outputs.user_bytes == {"alice": used}


def test_output_pruning_walks_ties_and_slices_and_resumes_after_a_restart(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More ended jobs than a slice, all with one end time: each file goes once, and the
    cursor is kept in the store, so a restarted master does not walk them again."""
    a = h.agent("n1", gpus=1)
    ids = []
    for _ in range(5):
        ids.append(finished(h, a, "out\n"))
    h.sql("UPDATE jobs SET end_time = ?", (h.clock.time(),))
    h.advance(100 * DAY)  # past the default 90 days of output
    a.heartbeat()
    monkeypatch.setattr(retention, "SLICE", 2)
    rounds = 1
    while h.cl.retention.prune_slice(h.clock.time()):
        rounds += 1
    assert rounds == 3
    assert not any(h.outputs.path(j).exists() for j in ids)
    h.cl.flush_all()
    h.crash()
    assert h.cl.retention._outputs_after[1] == max(ids, key=lambda j: (len(j), j))
    assert h.store.ended_between(h.cl.retention._outputs_after, h.clock.time(), 10) == []
