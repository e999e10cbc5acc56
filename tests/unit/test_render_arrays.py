"""How `mgpu queue` and `mgpu show ARRAY_ID` print arrays (client/render.py)."""

from __future__ import annotations

from typing import Any

from mgpu.client.render import render_array, render_jobs


def _task(index: int, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"a1b2c3d4_{index}",
        "name": None,
        "user": "alice",
        "state": state,
        "gpus": 1,
        "reason": "waiting for 1 GPU" if state == "queued" else None,
        "allocation": [],
        "array_job_id": "a1b2c3d4",
        "array_task_id": index,
        **extra,
    }


def test_a_queue_folded_by_the_master_prints_one_line_per_array() -> None:
    jobs = [_task(0, "running"), _task(2, "queued", array_tasks="2-99999", array_count=99998)]
    lines = render_jobs(jobs).splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("a1b2c3d4_[2-99999] ")


def test_an_unfolded_queue_is_folded_here() -> None:
    jobs = [_task(0, "running"), *(_task(i, "queued") for i in (1, 2, 3, 7))]
    assert "a1b2c3d4_[1-3,7] " in render_jobs(jobs)


def test_show_of_a_big_array_gives_counts_and_says_how_many_are_not_listed() -> None:
    array = {
        "array_job_id": "a1b2c3d4",
        "counts": {"queued": 99998, "running": 2},
        "tasks": [_task(0, "running"), _task(1, "running"), _task(2, "queued")],
        "more": 99997,
    }
    text = render_array(array)
    assert text.splitlines()[0] == "Array a1b2c3d4: 100000 tasks (99998 queued, 2 running)"
    assert text.splitlines()[-1] == "... and 99997 more tasks (mgpu show a1b2c3d4 --all)"


def test_show_of_an_array_from_an_older_master_counts_its_tasks() -> None:
    array = {"array_job_id": "a1b2c3d4", "tasks": [_task(0, "completed"), _task(1, "failed")]}
    text = render_array(array)
    assert text.splitlines()[0] == "Array a1b2c3d4: 2 tasks (1 completed, 1 failed)"
    assert "more tasks" not in text
