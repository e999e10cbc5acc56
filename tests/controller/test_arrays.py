"""Arrays kept compactly (master/store/arrays.py): one stored row for the array, a task row once
the task changes; a restart rebuilds the rest in their place in the queue."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import Harness

from mgpu.master.store import arrays
from mgpu.model import JobState


def _task_rows(h: Harness, array_id: str) -> list[str]:
    return [r[0] for r in h.store.job_rows_with_prefix(array_id + "_", limit=-1)]


def _queue(h: Harness) -> list[str]:
    return [j.id for j in h.cl.jobs.values()]


@pytest.mark.parametrize(
    "indices",
    [[0], [0, 1, 2], list(range(100_000)), [1, 3, 5, 6, 7, 10], [0, 2, 4, 6], [7, 8, 20]],
)
def test_indices_round_trip(indices: list[int]) -> None:
    assert arrays.decode_indices(arrays.encode_indices(indices)) == indices


def test_encoded_ranges_are_short() -> None:
    assert arrays.encode_indices(list(range(100_000))) == "0-99999"
    assert arrays.encode_indices([1, 3, 5, 6, 7, 10]) == "1,3,5-7,10"


def test_a_submitted_array_is_one_row_and_its_tasks_are_in_memory_in_order(h: Harness) -> None:
    before = h.submit()
    array_id = h.submit(array="0-4%2")
    after = h.submit()
    assert _task_rows(h, array_id) == []  # nothing per task until a task changes
    assert h.store.get_array(array_id) is not None
    assert _queue(h) == [before, *(f"{array_id}_{i}" for i in range(5)), after]
    assert h.store.has_job(array_id)  # the id is taken: no job is given it again
    task = h.job(f"{array_id}_3")
    assert (task.array_job_id, task.array_task_id, task.array_max_running) == (array_id, 3, 2)


def test_a_restart_rebuilds_the_tasks_without_rows_in_their_place(h: Harness) -> None:
    before = h.submit()
    array_id = h.submit(array="0-4")
    after = h.submit()
    h.agent("n1", gpus=1)
    h.cl.cancel(h.job(before))
    h.tick()  # task 0 starts: it gets its row, in the array's place
    h.settle()
    assert h.job(f"{array_id}_0").state == JobState.RUNNING
    h.cl.cancel(h.job(f"{array_id}_2"))
    assert _task_rows(h, array_id) == [f"{array_id}_0", f"{array_id}_2"]
    h.crash()
    ids = [f"{array_id}_{i}" for i in (0, 1, 3, 4)]
    assert _queue(h) == [*ids, after]
    assert h.job(ids[0]).state == JobState.RUNNING
    assert [h.job(i).state for i in ids[1:]] == [JobState.QUEUED] * 3
    assert h.job(f"{array_id}_2").state == JobState.CANCELLED
    assert [t.id for t in h.cl.array_tasks(array_id)] == [f"{array_id}_{i}" for i in range(5)]


def test_cancelled_arrays_leave_history_rows_and_a_quiet_array_row(h: Harness) -> None:
    array_id = h.submit(array="0-2")
    pages = list(h.cl.array_pages(array_id, 2))
    assert [[r[0] for r in page] for page in pages] == [
        [f"{array_id}_0", f"{array_id}_1"],
        [f"{array_id}_2"],
    ]
    done, gone = h.cl.cancel_tasks([r[:2] for page in pages for r in page], "alice")
    assert len(done) == 3 and gone == []
    h.cl.commit(("cancel", "alice", None, array_id), "every task of the array")
    assert [h.stored(t).state for t in done] == [JobState.CANCELLED] * 3
    assert [e["target"] for e in h.events("cancel")] == [array_id]
    h.crash()
    assert _queue(h) == []
    # Every task has its row now: the array row is not read again at the next start.
    assert h.sql("SELECT active FROM arrays") == [(0,)]
    again = h.cl.cancel_tasks([r[:2] for page in h.cl.array_pages(array_id, 10) for r in page], "a")
    assert again == ([], [f"{array_id}_{i}" for i in range(3)])


def test_a_site_default_reaches_every_task(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"site": {"admission": {"max_time_per_job": "1:00:00"}}})
    array_id = h.submit(array="0-2")
    assert {h.job(f"{array_id}_{i}").time_limit for i in range(3)} == {3600.0}
    h.crash()
    assert {h.job(f"{array_id}_{i}").time_limit for i in range(3)} == {3600.0}


def test_a_refused_array_stores_nothing(h: Harness) -> None:
    h.agent("n1", gpus=2)
    with pytest.raises(Exception, match="GPU"):
        h.submit(array="0-9", gpus=3)
    assert h.sql("SELECT COUNT(*) FROM arrays") == [(0,)]
    assert _queue(h) == []
