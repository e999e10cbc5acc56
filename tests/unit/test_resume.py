"""A followed job's output across a reopened stream (mgpu.client.resume): what a new leader
holds may be cut into other records than what the old one sent."""

from __future__ import annotations

from typing import Any

import pytest

from mgpu.client.resume import Resume, Rewind


def rec(text: str, at: int | None, stream: str = "o", node: str = "n1") -> dict[str, Any]:
    out: dict[str, Any] = {"s": stream, "d": text, "n": node}
    if at is not None:
        out["ep"], out["at"] = 1, at
    return out


def lines(first: int, last: int) -> str:
    return "".join(f"line-{i}\n" for i in range(first, last + 1))


def test_unbroken_records_pass_as_they_are() -> None:
    resume = Resume()
    assert [resume.take(rec("a\n", 2)), resume.take(rec("b\n", 4))] == ["a\n", "b\n"]
    assert resume.since() == 2


def test_records_the_old_leader_never_stored_come_back_once() -> None:
    """The e2e failover: line-1 was shown, the old leader died before storing it, the agent
    sent lines 1-28 again as one record; opened from record 1, the new leader's stream
    starts at line-29: a gap, so the stream is opened from its start and only lines 2-28
    of that record are shown."""
    resume = Resume()
    assert resume.take(rec("line-1\n", 7)) == "line-1\n"
    resume.reopen()
    assert resume.since() == 1
    with pytest.raises(Rewind):
        resume.take(rec("line-29\n", 223))
    assert resume.since() == 0
    assert resume.take(rec(lines(1, 28), 215)) == lines(2, 28)
    assert resume.take(rec("line-29\n", 223)) == "line-29\n"
    assert resume.since() == 2


def test_records_cut_finer_than_before_are_not_shown_twice() -> None:
    resume = Resume()
    assert resume.take(rec("abcdef", 6)) == "abcdef"
    resume.reopen()
    # The new leader holds "abc", "def" (2 records): opened from record 1, "def" comes first.
    assert resume.take(rec("def", 6)) is None
    assert resume.take(rec("gh", 8)) == "gh"


def test_each_stream_and_node_is_checked_apart() -> None:
    resume = Resume()
    assert resume.take(rec("out\n", 4)) == "out\n"
    assert resume.take(rec("err\n", 4, stream="e")) == "err\n"
    resume.reopen()
    assert resume.take(rec("more\n", 9)) == "more\n"  # the stdout stream goes on at 4
    assert resume.take(rec("err\n", 4, stream="e")) is None
    assert resume.take(rec("n2\n", 3, node="n2")) == "n2\n"  # a stream not seen before


def test_a_rewind_happens_once_per_reopening_and_skips_records_without_offsets() -> None:
    resume = Resume()
    assert resume.take(rec("marker", None)) == "marker"
    assert resume.take(rec("a\n", 2)) == "a\n"
    resume.reopen()
    with pytest.raises(Rewind):
        resume.take(rec("c\n", 6))  # "b\n" (2-4) missing
    assert resume.take(rec("marker", None)) is None  # shown before the rewind
    assert resume.take(rec("a\nb\n", 4)) == "b\n"
    assert resume.take(rec("c\n", 6)) == "c\n"
    resume.reopen()
    with pytest.raises(Rewind):  # a second failover's gap: rewound again, not lost
        resume.take(rec("z\n", 10))
    assert resume.since() == 0
    assert resume.take(rec("a\nb\nc\n", 6)) is None
    assert resume.take(rec("y\nz\n", 10)) == "y\nz\n"


def test_a_gap_after_the_rewind_itself_is_shown_not_rewound_for_ever() -> None:
    resume = Resume()
    assert resume.take(rec("a\n", 2)) == "a\n"
    resume.reopen()
    with pytest.raises(Rewind):
        resume.take(rec("c\n", 6))
    # From the start the store still lacks "b\n" (dropped at a cap): shown as it is.
    assert resume.take(rec("c\n", 6)) == "c\n"


def test_marks_reopen_where_the_records_are_stored_for_good() -> None:
    """A leader on PostgreSQL sent records 3-5 from its memory and died before storing
    them; the new leader holds the agent's copy of that output in one record (number 3):
    opened from the last mark (3), not from the 6 records received, nothing is skipped."""
    resume = Resume()
    resume.mark(0)
    for i in range(1, 4):
        assert resume.take(rec(f"line-{i}\n", 7 * i)) == f"line-{i}\n"
    resume.mark(3)
    for i in range(4, 7):
        assert resume.take(rec(f"line-{i}\n", 7 * i)) == f"line-{i}\n"
    assert resume.since() == 3  # records 3-5 were never said to be stored
    resume.reopen()
    assert resume.since() == 3
    resume.mark(3)
    assert resume.take(rec(lines(4, 8), 56)) == lines(7, 8)  # the agent's copy, and more
    assert resume.take(rec("line-9\n", 63)) == "line-9\n"
    assert resume.since() == 3
    resume.mark(5)
    assert resume.since() == 5


def test_without_marks_every_record_received_counts() -> None:
    """A master with its output in files: its records never change, so a reopening goes on
    from every record received (and a mark is never past what was received)."""
    resume = Resume()
    assert resume.take(rec("a\n", 2)) == "a\n"
    assert resume.take(rec("b\n", 4)) == "b\n"
    assert resume.since() == 2
    resume.reopen()
    resume.mark(7)
    assert resume.since() == 2
