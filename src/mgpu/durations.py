"""Durations as mgpu shows them: one formatter, in the few styles its output uses.

Standard library only and cheap to import: `mgpu queue` shows durations and must start
fast (tests/unit/test_cli_startup.py).  The dashboard has its own, in JavaScript.
"""

from __future__ import annotations

import math

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    Style = Literal["clock", "limit", "short", "exact"]

__all__ = ["format_duration", "hms"]

MINUTE, HOUR, DAY = 60, 3600, 86400

_PAIRS = ((DAY, HOUR, "d", "h"), (HOUR, MINUTE, "h", "m"), (MINUTE, 1, "m", "s"))
"""A unit and the next smaller one, largest first."""


def format_duration(seconds: float | None, style: Style = "short") -> str:
    """`seconds` as text, in one of these styles:

    - `clock`: elapsed time as squeue shows it: `5:07`, `1:05:07`, `2-01:05:07` (whole
      seconds, cut down); `-` for None, a negative time or no number.
    - `limit`: a time limit as Slurm shows it: `01:05:07`, `2-01:05:07` (rounded up);
      `UNLIMITED` for None or infinity.
    - `short`: how long, roughly: `45s`, `20m`, `1h 20m`, `2d 3h`: at most two units,
      seconds only under a minute, a zero second unit left out; `never` for infinity.
    - `exact`: two units always (to compare figures): `42s`, `12m 5s`, `3h 0m`, `2d 4h`.

    `short` and `exact` give `-` for None or NaN.
    """
    if style == "clock":
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            return "-"
        return hms(int(seconds), pad_hours=False)
    if style == "limit":
        if seconds is None or math.isinf(seconds):
            return "UNLIMITED"
        return hms(max(0, math.ceil(seconds)), pad_hours=True)
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "never"
    exact = style == "exact"
    s = round(seconds) if exact else max(0, round(seconds))
    for big, small, big_name, small_name in _PAIRS:
        if s >= big:
            first, rest = divmod(s, big)
            second = rest // small
            if not exact and (small == 1 or second == 0):
                return f"{first}{big_name}"
            return f"{first}{big_name} {second}{small_name}"
    return f"{s}s"


def hms(total: int, pad_hours: bool) -> str:
    """`D-HH:MM:SS`, `HH:MM:SS` (`pad_hours`) or `H:MM:SS`, `M:SS` of whole seconds."""
    days, rest = divmod(total, DAY)
    hours, rest = divmod(rest, HOUR)
    minutes, secs = divmod(rest, MINUTE)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if pad_hours:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"
