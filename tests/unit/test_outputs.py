"""The master's output store (master/outputs.py): appends, as a reader and a restart see them."""

from __future__ import annotations

import json
from pathlib import Path

from mgpu.master.outputs import OutputStore


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_an_append_is_in_the_file_when_it_returns(tmp_path: Path) -> None:
    """No buffer in the master: what was appended is there for a reader (and for a master
    killed right after), each record a whole line, in the order appended."""
    store = OutputStore(tmp_path)
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
    store = OutputStore(tmp_path)
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
    store = OutputStore(tmp_path)
    try:
        store.append("j", "o", "resent\n", "n1", epoch=1, end=12)
        assert [r["d"] for r in store.read("j")] == ["kept\n", "resent\n"]
        assert store.resume_point("j", 1, "n1") == (12, 0)
    finally:
        store.close_all()
