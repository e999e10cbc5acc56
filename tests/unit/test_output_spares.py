"""The file output store's spare files (master/store/spares.py): a job's new file is a
spare made ahead by a thread, linked under its name, and is the same file it would have
created; an existing file is never replaced; without hard links files are created."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu.master.store.outputs import FileOutputStore
from mgpu.master.store.spares import Spares


@pytest.fixture
def umask077() -> Iterator[None]:
    old = os.umask(0o077)  # the master's (server.py)
    try:
        yield
    finally:
        os.umask(old)


def _spare_inodes(spares: Spares, want: int) -> dict[int, str]:
    """Inode → name of the spares ready, once at least `want` are (bounded wait)."""
    deadline = time.monotonic() + 30
    while len(spares._free) < want:
        assert time.monotonic() < deadline, "no spares were made"
        time.sleep(0.01)
    return {os.stat(os.path.join(spares.dir, n)).st_ino: n for n in list(spares._free)}


def test_a_new_jobs_file_is_a_spare_made_ahead(tmp_path: Path, umask077: None) -> None:
    store = FileOutputStore(tmp_path)
    try:
        store.append("1", "o", "first\n", "n1")  # none ready yet: created; the thread starts
        assert os.stat(tmp_path / "1.jsonl").st_nlink == 1
        ready = _spare_inodes(store._spares, store._spares.keep)
        store.append("2", "o", "second\n", "n1")
        st = os.stat(tmp_path / "2.jsonl")
        assert st.st_ino in ready  # the spare itself, now under the job's name only
        assert st.st_nlink == 1
        assert not os.path.exists(os.path.join(store._spares.dir, ready[st.st_ino]))
        assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(os.stat(tmp_path / "1.jsonl").st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        store.close("2")
        assert [r["d"] for r in store.read("2")] == ["second\n"]
        assert set(store.file_sizes()) == {"1", "2"}  # the spares are not jobs' files
    finally:
        store.close_all()


def test_an_earlier_runs_file_is_appended_to_not_replaced(tmp_path: Path) -> None:
    first = FileOutputStore(tmp_path)
    first.append("7", "o", "run one\n", "n1")
    first.close_all()
    again = FileOutputStore(tmp_path)  # a restarted master, with spares left ready
    try:
        again.append("0", "o", "warm\n", "n1")
        _spare_inodes(again._spares, 1)
        again.append("7", "o", "run two\n", "n1")
        again.close("7")
        assert [r["d"] for r in again.read("7")] == ["run one\n", "run two\n"]
    finally:
        again.close_all()


def test_spares_a_stopped_master_made_are_used_by_the_next(tmp_path: Path) -> None:
    first = FileOutputStore(tmp_path)
    first.append("1", "o", "x\n", "n1")
    left = _spare_inodes(first._spares, first._spares.keep)
    first.close_all()  # the thread is joined: nothing more is made
    assert not [t for t in threading.enumerate() if t.name == "mgpu-spares"]
    again = FileOutputStore(tmp_path)
    try:
        again.append("2", "o", "y\n", "n1")  # at once: no thread needed for the first
        assert os.stat(tmp_path / "2.jsonl").st_ino in left
    finally:
        again.close_all()


def test_without_hard_links_each_file_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    store = FileOutputStore(tmp_path)
    try:
        store.append("1", "o", "a\n", "n1")
        _spare_inodes(store._spares, 1)
        monkeypatch.setattr(os, "link", no_links)
        for job in ("2", "3"):
            store.append(job, "o", f"{job}\n", "n1")
            store.close(job)
            assert [r["d"] for r in store.read(job)] == [f"{job}\n"]
        assert not store._spares._usable
    finally:
        store.close_all()


def test_a_name_taken_meanwhile_keeps_its_file_and_the_spare(tmp_path: Path) -> None:
    spares = Spares(tmp_path)
    try:
        assert not spares.link(str(tmp_path / "a"))  # none ready: the thread starts
        _spare_inodes(spares, spares.keep)  # all made: the thread has stopped
        (tmp_path / "b").write_text("mine\n")
        ready = len(spares._free)
        assert not spares.link(str(tmp_path / "b"))
        assert (tmp_path / "b").read_text() == "mine\n"
        assert len(spares._free) == ready  # put back for the next file
        assert spares.link(str(tmp_path / "c"))
        assert (tmp_path / "c").read_bytes() == b""
    finally:
        spares.close()
