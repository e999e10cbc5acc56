from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Harnesses with a given cluster config (closed at the end of the test)."""
    made: list[Harness] = []

    def make(config: dict[str, Any] | None = None) -> Harness:
        made.append(Harness(tmp_path / f"h{len(made)}", config))
        return made[-1]

    yield make
    for harness in made:
        harness.close()


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    """The controller in-process: in-memory store, fake clock, fake agents (none yet)."""
    return make_harness()
