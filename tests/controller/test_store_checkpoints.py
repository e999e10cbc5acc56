"""The store's WAL is checkpointed by a thread of its own, never inside a commit made on
the event loop (master/store/walcheckpoint.py)."""

from __future__ import annotations

from pathlib import Path

from mgpu.master.store.sqlite import SqliteStore
from mgpu.testing import wait_for

ROWS = 3000
DETAIL = "x" * 2000  # 3,000 rows: some 6 MB, past SQLite's automatic 1,000 pages (4 MB)


def test_commits_never_checkpoint_and_the_thread_does(tmp_path: Path) -> None:
    path = tmp_path / "mgpu.db"
    store = SqliteStore(path)
    try:
        assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        checkpointer = store._checkpointer
        assert checkpointer is not None
        checkpointer.stop()
        before = path.stat().st_size
        for i in range(ROWS):
            store.record_event("test", target=f"{i:08d}", detail=DETAIL)
        # Only a checkpoint copies pages into the database file: no commit made one.
        assert path.stat().st_size == before
    finally:
        store.close()
    store = SqliteStore(path)  # its thread running
    try:
        grown = path.stat().st_size
        for i in range(ROWS):
            store.record_event("test", target=f"{i:08d}", detail=DETAIL)
        wait_for(lambda: path.stat().st_size > grown, timeout=30, what="a checkpoint")
    finally:
        store.close()
