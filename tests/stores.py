"""The store's two backends for the tests that run on both (tests/unit/conftest.py's
`backend` and `store` fixtures): a place to open a store at, open it again (a restarted
master), and reach its tables with plain SQL (`?` placeholders on both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mgpu.master.store.base import Store
from mgpu.master.store.postgres import PostgresStore
from mgpu.master.store.sqlite import SqliteStore


def durable(url: str) -> str:
    """The test server commits asynchronously (tests/pgserver.py, for speed), so a crash of
    it loses the last commits; this database's sessions commit durably, as by default."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    return url


class Backend:
    name = ""

    def __init__(self) -> None:
        self.opened: list[Store] = []

    def open(self) -> Store:
        """A store at this backend's place (the same data each time)."""
        store = self._open()
        self.opened.append(store)
        return store

    def _open(self) -> Store:
        raise NotImplementedError

    def sql(self, store: Store, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement outside the store's methods (committed); its rows."""
        raise NotImplementedError

    def crash(self, store: Store) -> None:
        """Drop the store's connection without closing anything cleanly (a kill -9)."""
        raise NotImplementedError

    def close_all(self) -> None:
        for store in self.opened:
            try:
                store.close()
            except Exception:
                pass


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def _open(self) -> Store:
        return SqliteStore(self.path)

    def sql(self, store: Store, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        assert isinstance(store, SqliteStore)
        return store.db.execute(query, params).fetchall()

    def crash(self, store: Store) -> None:
        assert isinstance(store, SqliteStore)
        store.db.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def _open(self) -> Store:
        return PostgresStore(self.url, retry_for=5.0)

    def sql(self, store: Store, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        assert isinstance(store, PostgresStore)
        cur = store.connection().execute(query.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []

    def crash(self, store: Store) -> None:
        assert isinstance(store, PostgresStore)
        store.connection().close()
