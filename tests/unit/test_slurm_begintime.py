"""Slurm's time forms for `--begin` (src/common/parse_time.c), one row per form: each
read against a fixed "now" (Sunday 2026-12-06 10:30:00 local time)."""

from __future__ import annotations

from datetime import datetime

import pytest

from mgpu.slurm.begintime import parse_begin

NOW = datetime(2026, 12, 6, 10, 30, 0).timestamp()


def _at(*when: int) -> float:
    return datetime(*when).timestamp()  # type: ignore[arg-type]


FORMS = [
    ("now", NOW),
    ("now+60", NOW + 60),  # no unit: seconds
    ("now+90seconds", NOW + 90),
    ("now+5minutes", NOW + 300),
    ("now+1hour", NOW + 3600),
    ("now+24hours", NOW + 86400),
    ("now+2days", NOW + 2 * 86400),
    ("now+1week", NOW + 604800),
    ("NOW+3Hours", NOW + 3 * 3600),
    ("16:00", _at(2026, 12, 6, 16, 0)),  # later today
    ("09:15:30", _at(2026, 12, 7, 9, 15, 30)),  # passed today: tomorrow
    ("4:00 PM", _at(2026, 12, 6, 16, 0)),
    ("4:00pm", _at(2026, 12, 6, 16, 0)),
    ("12:00 AM", _at(2026, 12, 7, 0, 0)),
    ("12:30 PM", _at(2026, 12, 6, 12, 30)),
    ("midnight", _at(2026, 12, 7, 0, 0)),
    ("noon", _at(2026, 12, 6, 12, 0)),
    ("elevenses", _at(2026, 12, 6, 11, 0)),
    ("fika", _at(2026, 12, 6, 15, 0)),
    ("teatime", _at(2026, 12, 6, 16, 0)),
    ("today", _at(2026, 12, 6)),
    ("tomorrow", _at(2026, 12, 7)),
    ("1225", _at(2026, 12, 25)),  # MMDD
    ("122527", _at(2027, 12, 25)),  # MMDDYY
    ("12/25", _at(2026, 12, 25)),
    ("12/25/27", _at(2027, 12, 25)),
    ("12.25", _at(2026, 12, 25)),
    ("12.25.27", _at(2027, 12, 25)),
    ("01/01", _at(2027, 1, 1)),  # passed this year: next year's
    ("12/06", _at(2026, 12, 6)),  # today's date: today
    ("2027-01-02", _at(2027, 1, 2)),
    ("2027-01-02T03:04", _at(2027, 1, 2, 3, 4)),
    ("2027-01-02T03:04:05", _at(2027, 1, 2, 3, 4, 5)),
    ("teatime tomorrow", _at(2026, 12, 7, 16, 0)),
    ("16:00 12/25", _at(2026, 12, 25, 16, 0)),
]


@pytest.mark.parametrize(("text", "expected"), FORMS)
def test_each_form(text: str, expected: float) -> None:
    assert parse_begin(text, NOW) == expected


BAD = [
    "",
    "later",
    "now+",
    "now+1fortnight",
    "now-1hour",
    "25:00",
    "13:00 PM",
    "10:61",
    "13/01",
    "02/30",
    "2027-13-01",
    "2027-01-02T25:00",
    "16:00 17:00",
    "today tomorrow",
    "16:00 12/25 2027",
]


@pytest.mark.parametrize("text", BAD)
def test_what_slurm_would_not_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        parse_begin(text, NOW)
