"""Every module of `src/mgpu` stays at or under MAX_LINES lines: one that grows past it has
become more than one job, and is split before it grows further.

`OVER` lists the modules still over the line, each with the most lines it may have: it
only shrinks.  A listed module may not grow past its ceiling, and one brought under the
line must leave the list (so the list cannot keep a ceiling nobody needs any more).
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

MAX_LINES = 700

OVER: dict[str, int] = {
    # A module past the line is split, not listed here (empty since round 4).
}


def _sizes() -> dict[str, int]:
    return {
        path.relative_to(SRC).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted((SRC / "mgpu").rglob("*.py"))
    }


def test_every_module_is_at_most_700_lines() -> None:
    sizes = _sizes()
    too_long = [
        f"{name}: {lines} lines (at most {OVER.get(name, MAX_LINES)})"
        for name, lines in sizes.items()
        if lines > OVER.get(name, MAX_LINES)
    ]
    assert not too_long, "split these modules: " + "; ".join(too_long)


def test_the_allow_list_only_names_modules_still_over_the_line() -> None:
    sizes = _sizes()
    stale = [
        f"{name} ({'gone' if name not in sizes else f'{sizes[name]} lines'})"
        for name in OVER
        if sizes.get(name, 0) <= MAX_LINES
    ]
    assert not stale, "remove from OVER (at or under the line now): " + ", ".join(stale)
