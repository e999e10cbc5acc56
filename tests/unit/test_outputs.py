"""The master's output store (master/store/outputs.py): appends, as a reader and a restart
see them."""

from __future__ import annotations

import json
from pathlib import Path

from mgpu.master.store.outputs import ALL_SENT, FileOutputStore


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_an_append_is_in_the_file_when_it_returns(tmp_path: Path) -> None:
    """No buffer in the master: what was appended is there for a reader (and for a master
    killed right after), each record a whole line, in the order appended."""
    store = FileOutputStore(tmp_path)
    try:
        store.append("j1", "o", "one\n", "n1", epoch=1, end=4)
        assert _lines(tmp_path / "j1.jsonl") == [
            {"s": "o", "d": "one\n", "n": "n1", "ep": 1, "at": 4}
        ]
        store.append("j1", "e", "h\u00e9 \ud800\n", "n1", epoch=1, end=7)  # a lone surrogate too
        store.append("j2", "o", "other job\n", "n2")
        assert [r["d"] for r in store.read("j1")] == ["one\n", "h\u00e9 \ud800\n"]
        assert (tmp_path / "j1.jsonl").read_bytes().isascii()
        assert store.read("j2") == [{"s": "o", "d": "other job\n", "n": "n2"}]
    finally:
        store.close_all()


def test_a_file_reopened_after_its_close_keeps_what_it_had(tmp_path: Path) -> None:
    """A requeued job's next run (or a late notice) appends after the earlier records."""
    store = FileOutputStore(tmp_path)
    try:
        store.append("j", "o", "first run\n", "n1", epoch=1, end=10)
        store.close("j")
        store.append("j", "o", "second run\n", "n2", epoch=2, end=11)
        assert [r["d"] for r in store.read("j")] == ["first run\n", "second run\n"]
    finally:
        store.close_all()


def test_the_first_append_after_a_crash_drops_a_cut_last_line(tmp_path: Path) -> None:
    """A master killed in the middle of a write left half a line: the next master's first
    append (with no read of the file before it) starts on a line of its own."""
    whole = b'{"s":"o","d":"kept\\n","n":"n1","ep":1,"at":5}\n'
    (tmp_path / "j.jsonl").write_bytes(whole + b'{"s":"o","d":"cut sh')
    store = FileOutputStore(tmp_path)
    try:
        store.append("j", "o", "resent\n", "n1", epoch=1, end=12)
        assert [r["d"] for r in store.read("j")] == ["kept\n", "resent\n"]
        assert store.resume_point("j", 1, "n1") == (12, 0)
    finally:
        store.close_all()


def test_a_job_past_its_cap_stores_a_marker_and_drops_the_rest(tmp_path: Path) -> None:
    """The record that crosses the cap is cut to end within it, one marker follows on
    stderr, and nothing more is stored for the job: notes, later runs, resends."""
    store = FileOutputStore(tmp_path)
    store.cap = 1024
    path = tmp_path / "j.jsonl"
    try:
        store.append("j", "o", "x" * 500 + "\n", "n1", epoch=1, end=501)
        store.append("j", "o", "y" * 5000, "n1", epoch=1, end=5501)
        size = path.stat().st_size
        store.append("j", "e", "more\n", "n1", epoch=1, end=5)
        store.append("j", "e", "a master's note\n", "n1")
        store.close("j")
        store.append("j", "o", "second run\n", "n2", epoch=2, end=11)  # a requeued run
        assert path.stat().st_size == size
        records = store.read("j")
        assert [r["d"][:1] for r in records] == ["x", "y", "\n"]
        cut = path.read_bytes().splitlines()[1]
        assert 1024 - 12 < len(b"\n".join(path.read_bytes().splitlines()[:2])) + 1 <= 1024
        assert cut.endswith(b'"ep":1,"at":5501}')  # where the run stands: a resume skips it
        assert records[2] == {
            "s": "e",
            "d": "\nmgpu: output truncated at 1 KiB (limits.max_output_per_job)\n",
            "n": "n1",
        }
    finally:
        store.close_all()


def test_a_cut_never_splits_an_escape(tmp_path: Path) -> None:
    """Text whose characters take up to 12 bytes each in the file is cut between them."""
    store = FileOutputStore(tmp_path)
    store.cap = 300
    try:
        text = '\U0001f600\u00e9"\x01' * 100
        store.append("j", "o", text, "n1", epoch=1, end=1000)
        records = store.read("j")  # each line parses: no escape was cut
        assert records[0]["d"] and text.startswith(records[0]["d"])
        assert records[1]["d"].startswith("\nmgpu: output truncated at 300 bytes")
        first = (tmp_path / "j.jsonl").read_bytes().splitlines()[0]
        assert 300 - 12 < len(first) + 1 <= 300
    finally:
        store.close_all()


def test_a_record_that_does_not_fit_at_all_leaves_only_the_marker(tmp_path: Path) -> None:
    store = FileOutputStore(tmp_path)
    store.cap = 60
    try:
        store.append("j", "o", "ab\n", "n1", epoch=1, end=3)  # 44 bytes: 16 left
        store.append("j", "o", "cd\n", "n1", epoch=1, end=6)
        assert [r["d"][:5] for r in store.read("j")] == ["ab\n", "\nmgpu"]
    finally:
        store.close_all()


def test_a_restarted_master_counts_the_file_it_finds(tmp_path: Path) -> None:
    """The count is the file's size, read at the first append after a restart: a full
    file stays full (no second marker), a file below the cap fills up to it."""
    first = FileOutputStore(tmp_path)
    first.cap = 1024
    first.append("full", "o", "z" * 2000, "n1", epoch=1, end=2000)
    first.append("half", "o", "h" * 500, "n1", epoch=1, end=500)
    first.close_all()
    full = (tmp_path / "full.jsonl").read_bytes()

    second = FileOutputStore(tmp_path)
    second.cap = 1024
    try:
        # Nothing more is wanted of a full file's run: the agent is told it has it all.
        assert second.resume_point("full", 1, "n1") == (ALL_SENT, ALL_SENT)
        assert second.resume_point("half", 1, "n1") == (500, 0)
        second.append("full", "o", "after the restart", "n1", epoch=1, end=2017)
        assert (tmp_path / "full.jsonl").read_bytes() == full
        second.append("half", "o", "h" * 1000, "n1", epoch=1, end=1500)
        assert [r["d"][:5] for r in second.read("half")] == ["h" * 5, "h" * 5, "\nmgpu"]
        assert (tmp_path / "half.jsonl").stat().st_size <= 1024 + 100
    finally:
        second.close_all()


def test_a_lowered_cap_marks_a_file_already_past_it_once(tmp_path: Path) -> None:
    first = FileOutputStore(tmp_path)
    first.append("j", "o", "w" * 3000, "n1", epoch=1, end=3000)  # no cap
    first.close_all()

    second = FileOutputStore(tmp_path)
    second.cap = 1024
    try:
        second.append("j", "o", "more", "n1", epoch=1, end=3004)
        second.close("j")
        second.append("j", "o", "and more", "n1", epoch=1, end=3012)
        assert [r["d"][:5] for r in second.read("j")] == ["w" * 5, "\nmgpu"]
    finally:
        second.close_all()
