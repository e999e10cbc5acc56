"""Slurm's time forms (`sbatch --begin`, `scontrol update StartTime=`), as Slurm's
src/common/parse_time.c reads them, to an epoch time in the client's local zone.

    now[+COUNT[seconds|minutes|hours|days|weeks]]   (COUNT alone: seconds)
    HH:MM[:SS] [AM|PM]          today, or tomorrow if that time has passed
    midnight noon elevenses fika teatime            (00:00 11:00 12:00 15:00 16:00) likewise
    today tomorrow              that day's 00:00
    MMDD[YY]  MM/DD[/YY]  MM.DD[.YY]                that day; without a year, the next one
    YYYY-MM-DD[THH:MM[:SS]]
    a time of day and a date together: "16:00 12/25", "teatime tomorrow"

One function, `parse_begin`; anything else is a ValueError saying what was given.
"""

from __future__ import annotations

import re
import time
from datetime import date, datetime, timedelta

__all__ = ["parse_begin"]

_UNITS = {
    "": 1,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "hour": 3600,
    "hours": 3600,
    "day": 86400,
    "days": 86400,
    "week": 604800,
    "weeks": 604800,
}
_NAMED_TIMES = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}
_NOW = re.compile(r"now(?:\+(\d+)([a-z]*))?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?(am|pm)?")
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?")
_DATE = re.compile(r"(\d{2})([/.]?)(\d{2})(?:\2(\d{2}))?")


def parse_begin(text: str, now: float) -> float:
    """The epoch time `text` names, `now` being the current epoch time (a ValueError for
    anything Slurm would not read)."""
    words = text.strip().lower().split()
    if len(words) == 2 and words[1] in ("am", "pm"):
        words = [words[0] + words[1]]
    if not words or len(words) > 2:
        raise ValueError(f"invalid time specification {text!r}")
    base = datetime.fromtimestamp(now)
    if len(words) == 1:
        match = _NOW.fullmatch(words[0])
        if match:
            count, unit = match[1], match[2] or ""
            if unit not in _UNITS:
                raise ValueError(f"invalid time unit {unit!r} in {text!r}")
            return now + int(count or 0) * _UNITS[unit]
        match = _ISO.fullmatch(words[0])
        if match:
            return _iso(match, text)
    clock, day = None, None
    for word in words:
        if clock is None and (found := _time_of_day(word)) is not None:
            clock = found
        elif day is None and (when := _day(word, base.date())) is not None:
            day = when
        else:
            raise ValueError(f"invalid time specification {text!r}")
    hms = clock or (0, 0, 0)
    if day is None:  # a time of day alone: its next coming
        moment = datetime.combine(base.date(), datetime.min.time()).replace(
            hour=hms[0], minute=hms[1], second=hms[2]
        )
        if moment <= base:
            moment += timedelta(days=1)
        return moment.timestamp()
    return datetime(day.year, day.month, day.day, *hms).timestamp()


def _time_of_day(word: str) -> tuple[int, int, int] | None:
    if word in _NAMED_TIMES:
        return _NAMED_TIMES[word], 0, 0
    match = _CLOCK.fullmatch(word)
    if match is None:
        return None
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    if match[4]:
        if not 1 <= hour <= 12:
            raise ValueError(f"invalid hour {hour} with {match[4].upper()} in {word!r}")
        hour = hour % 12 + (12 if match[4] == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"invalid time of day {word!r}")
    return hour, minute, second


def _day(word: str, today: date) -> date | None:
    if word == "today":
        return today
    if word == "tomorrow":
        return today + timedelta(days=1)
    match = _DATE.fullmatch(word)
    if match is None:
        return None
    month, mday = int(match[1]), int(match[3])
    try:
        if match[4] is not None:
            return date(2000 + int(match[4]), month, mday)
        day = date(today.year, month, mday)
        # A date without a year is its next coming (today included).
        return day if day >= today else date(today.year + 1, month, mday)
    except ValueError:
        raise ValueError(f"invalid date {word!r}") from None


def _iso(match: re.Match[str], text: str) -> float:
    year, month, mday = int(match[1]), int(match[2]), int(match[3])
    hour, minute, second = int(match[4] or 0), int(match[5] or 0), int(match[6] or 0)
    try:
        return datetime(year, month, mday, hour, minute, second).timestamp()
    except ValueError:
        raise ValueError(f"invalid date or time {text!r}") from None


def now() -> float:
    """The current epoch time (what `parse_begin` is given outside tests)."""
    return time.time()
