"""The README's tables of intended and known differences and intended.py, the list the
tier reads, name the same differences (needs no Slurm)."""

from __future__ import annotations

import re
from pathlib import Path

from intended import INTENDED, KNOWN

README = Path(__file__).resolve().parents[2] / "README.md"


def _table(header: str) -> list[str]:
    text = README.read_text()
    if f"| {header} |" not in text:
        return []  # none (the README says so in words)
    start = text.index(f"| {header} |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        m = re.match(r"\| `([\w-]+)` \|", line)
        assert m, f"a row of the README's {header!r} table names no difference: {line}"
        rows.append(m.group(1))
    return rows


def test_the_readme_names_every_difference_the_tier_accepts() -> None:
    assert _table("intended difference") == [e.name for e in INTENDED]
    assert _table("known difference (open)") == [e.name for e in KNOWN]
