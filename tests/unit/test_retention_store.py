"""What retention needs of the stores: deletes in slices (master/store/sqlstore.py) and the
per-user count of stored output (master/store/outputs.py)."""

from __future__ import annotations

from pathlib import Path

from factories import master_job
from mgpu.master.store.base import Store
from mgpu.master.store.outputs import MARKER, FileOutputStore
from mgpu.model import JobState
from stores import Backend


def _ended(job_id: str, end: float, user: str = "alice") -> object:
    return master_job(job_id, user=user, state=JobState.COMPLETED, submit_time=0.0, end_time=end)


def test_ended_jobs_are_deleted_oldest_first_in_slices_and_active_ones_never(
    store: Store,
) -> None:
    store.save_jobs(
        [
            _ended("1", 10.0),
            _ended("2", 20.0, user="bob"),
            _ended("3", 30.0),
            _ended("4", 500.0),
            master_job("5", state=JobState.QUEUED, submit_time=0.0),
        ]
    )
    assert store.get_job("1") is not None  # from the recently-ended cache
    assert store.delete_ended_jobs(100.0, 2) == [("1", "alice"), ("2", "bob")]
    assert store.get_job("1") is None  # the cache forgets it too
    assert store.delete_ended_jobs(100.0, 2) == [("3", "alice")]
    assert store.delete_ended_jobs(1000.0, 10) == [("4", "alice")]
    assert store.get_job("5") is not None
    assert store.users_of(["5", "1", "nope"]) == {"5": "alice"}


def test_ended_between_walks_from_a_cursor_including_ties(store: Store) -> None:
    store.save_jobs([_ended(i, 10.0) for i in ("1", "2", "3")] + [_ended("4", 50.0)])
    first = store.ended_between((0.0, ""), 100.0, 2)
    assert [row[0] for row in first] == ["1", "2"]
    assert [row[0] for row in store.ended_between((10.0, "2"), 100.0, 2)] == ["3", "4"]
    assert store.ended_between((50.0, "4"), 100.0, 2) == []
    assert [row[0] for row in store.ended_between((0.0, ""), 20.0, 9)] == ["1", "2", "3"]


def test_old_audit_events_are_deleted_in_slices(backend: Backend) -> None:
    store = backend.open()
    store.record_events([("kind", None, None, None, None)] * 3)
    backend.sql(store, "UPDATE events SET time = 5.0")
    store.record_event("recent")
    assert store.delete_events_before(100.0, 2) == 2
    assert store.delete_events_before(100.0, 2) == 1
    assert store.delete_events_before(100.0, 2) == 0
    assert [e["kind"] for e in store.events()] == ["recent"]


def test_a_users_bytes_are_counted_capped_and_given_back(tmp_path: Path) -> None:
    outputs = FileOutputStore(tmp_path)
    owners = {"a1": "alice", "a2": "alice", "b1": "bob"}
    outputs.owner = owners.get
    outputs.user_cap = 200
    try:
        outputs.append("a1", "o", "x" * 100, "n1")
        used = outputs.user_bytes["alice"]
        outputs.append("a2", "o", "y" * 100, "n1")  # would pass 200: the marker instead
        outputs.append("a2", "o", "z", "n1")  # and nothing more of that job
        outputs.append("b1", "o", "bob", "n1")
        (marker,) = outputs.read("a2")
        assert marker["s"] == "e" and MARKER in marker["d"]
        assert "200 bytes (limits.max_output_per_user)" in marker["d"]
        files = outputs.file_sizes()
        assert outputs.user_bytes == {
            "alice": files["a1"] + files["a2"],
            "bob": files["b1"],
        }
        outputs.close("a1")
        assert outputs.delete("b1", "bob") == 0  # still open: the job is not over
        assert outputs.delete("a1", "alice") == files["a1"]
        assert not (tmp_path / "a1.jsonl").exists()
        assert outputs.user_bytes["alice"] == files["a2"] and files["a1"] == used
        outputs.add_usage({"carol": 7})
        assert outputs.user_bytes["carol"] == 7
    finally:
        outputs.close_all()
