"""The one duration formatter, in each style mgpu's output uses."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mgpu.durations import format_duration

DAY = 86400

CASES = [
    # seconds, clock (squeue's elapsed), limit (Slurm's), short, exact
    (0, "0:00", "00:00:00", "0s", "0s"),
    (5.4, "0:05", "00:00:06", "5s", "5s"),
    (59.6, "0:59", "00:01:00", "1m", "1m 0s"),
    (600, "10:00", "00:10:00", "10m", "10m 0s"),
    (725, "12:05", "00:12:05", "12m", "12m 5s"),
    (3600, "1:00:00", "01:00:00", "1h", "1h 0m"),
    (4800, "1:20:00", "01:20:00", "1h 20m", "1h 20m"),
    (DAY, "1-00:00:00", "1-00:00:00", "1d", "1d 0h"),
    (2 * DAY + 7200 + 61, "2-02:01:01", "2-02:01:01", "2d 2h", "2d 2h"),
]


@pytest.mark.parametrize(("seconds", "clock", "limit", "short", "exact"), CASES)
def test_each_style(seconds: float, clock: str, limit: str, short: str, exact: str) -> None:
    assert format_duration(seconds, "clock") == clock
    assert format_duration(seconds, "limit") == limit
    assert format_duration(seconds, "short") == short
    assert format_duration(seconds) == short  # the default
    assert format_duration(seconds, "exact") == exact


def test_no_duration() -> None:
    assert [format_duration(None, s) for s in ("clock", "limit", "short", "exact")] == [
        "-",
        "UNLIMITED",
        "-",
        "-",
    ]
    assert format_duration(math.inf, "limit") == "UNLIMITED"
    assert format_duration(math.inf, "short") == "never"
    assert format_duration(math.inf, "clock") == "-"
    assert format_duration(math.nan, "exact") == "-"
    assert format_duration(-5, "clock") == "-"
    assert format_duration(-5, "short") == "0s"  # how far off a time already past is
    assert format_duration(-5, "exact") == "-5s"


@given(st.integers(min_value=0, max_value=400 * DAY))
def test_the_clock_styles_read_back_to_the_same_seconds(seconds: int) -> None:
    for style in ("clock", "limit"):
        text = format_duration(seconds, style)  # type: ignore[arg-type]
        days, _, clock = text.rpartition("-")
        fields = [int(f) for f in clock.split(":")]
        while len(fields) < 3:
            fields.insert(0, 0)
        h, m, s = fields
        assert int(days or 0) * DAY + h * 3600 + m * 60 + s == seconds
        assert m < 60 and s < 60 and (not days or h < 24)


@given(st.floats(min_value=0, max_value=400 * DAY))
def test_short_is_at_most_two_units_and_never_more_than_the_duration(seconds: float) -> None:
    text = format_duration(seconds, "short")
    units = {"d": DAY, "h": 3600, "m": 60, "s": 1}
    parts = text.split()
    assert 1 <= len(parts) <= 2
    shown = sum(int(p[:-1]) * units[p[-1]] for p in parts)
    assert shown <= round(seconds) and round(seconds) - shown < units[parts[0][-1]]
