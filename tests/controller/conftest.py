from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness


@pytest.fixture
def make_harness(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Harness]]:
    """Harnesses with a given cluster config (closed at the end of the test).
    MGPU_TEST_STORE=postgres: each on a PostgreSQL database of its own (tests/pgserver.py),
    to run the controller's tests on the other store."""
    made: list[Harness] = []

    def make(config: dict[str, Any] | None = None) -> Harness:
        store = None
        if os.environ.get("MGPU_TEST_STORE") == "postgres":
            from mgpu.master.store.postgres import PostgresStore

            store = PostgresStore(request.getfixturevalue("postgres").create_database())
        made.append(Harness(tmp_path / f"h{len(made)}", config, store=store))
        return made[-1]

    yield make
    for harness in made:
        harness.close()


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    """The controller in-process: in-memory store, fake clock, fake agents (none yet)."""
    return make_harness()
