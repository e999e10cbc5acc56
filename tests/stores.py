"""The store's two backends for the tests that run on both (tests/unit/conftest.py's
`backend` and `store` fixtures): a place to open a store at, open it again (a restarted
master), and reach its tables with plain SQL (`?` placeholders on both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mgpu.master.store.base import Store
from mgpu.master.store.postgres import PostgresStore
from mgpu.master.store.sqlite import SqliteStore

OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    user TEXT NOT NULL,
    submit_time REAL NOT NULL,
    end_time REAL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time);
CREATE TABLE IF NOT EXISTS arrays (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    active INTEGER NOT NULL,
    indices TEXT NOT NULL,
    max_running INTEGER,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reservations (
    name TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT,
    address TEXT,
    target TEXT,
    detail TEXT
);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    admin INTEGER NOT NULL,
    kind TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS node_secrets (
    node_id TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    created REAL NOT NULL
);
"""
"""The store's and the tokens' and node secrets' SCHEMA strings as mgpu wrote them before
the schema had a version (the tokens' first release: no grant columns)."""


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
