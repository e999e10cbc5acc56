"""Fixtures of the unit tests: the store on each of its backends (tests/stores.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu.master.store.base import Store
from stores import Backend, PostgresBackend, SqliteBackend


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Where a store lives: a SQLite file, or a new PostgreSQL database (`pg_url`)."""
    if request.param == "sqlite":
        found: Backend = SqliteBackend(tmp_path / "mgpu.db")
    else:
        found = PostgresBackend(request.getfixturevalue("pg_url"))
    try:
        yield found
    finally:
        found.close_all()


@pytest.fixture
def store(backend: Backend) -> Store:
    """A store, open, on each backend."""
    return backend.open()
