"""What the store's two backends promise beyond the master's everyday calls: a versioned
schema migrated at open (an older SQLite state dir keeps every row), tokens and node
secrets behind the store, fencing of every PostgreSQL write by the lease's generation, a
PostgreSQL restart waited out, and `open_store`'s choice of backend."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from pathlib import Path

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from factories import master_job
from mgpu.master.security.auth import TokenStore
from mgpu.master.security.nodeauth import NodeSecrets
from mgpu.master.store import open_store
from mgpu.master.store.base import (
    SCHEMA_VERSION,
    KeyTaken,
    Store,
    StoreError,
    StoreUnavailable,
)
from mgpu.master.store.fence import LEASE_TABLE, Fenced
from mgpu.master.store.postgres import PostgresStore
from mgpu.master.store.sqlite import SYNCHRONOUS_ENV, SqliteStore
from mgpu.model import JobState
from mgpu.testing import wait_for
from mgpu.tokens import hash_secret
from pgserver import PgServer, free_port
from stores import OLD_SCHEMA, Backend, durable


def _ended(job_id: str, end: float = 10.0) -> object:
    return master_job(job_id, state=JobState.COMPLETED, submit_time=1.0, end_time=end)


# ---- the schema --------------------------------------------------------------------------


def test_a_state_dir_from_before_schema_versions_is_migrated_without_loss(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mgpu.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(OLD_SCHEMA)
    job = _ended("7")
    old.execute(
        "INSERT INTO jobs VALUES (?,?,?,?,?,?,?)",
        ("7", 1, "completed", "alice", 1.0, 10.0, json.dumps(job.to_record())),
    )
    old.execute("INSERT INTO meta VALUES ('last_job_id', '7')")
    old.execute(
        "INSERT INTO tokens VALUES ('t1', 'alice', 1, 'user', ?, 1.0, NULL)",
        (hash_secret("mgpu_secret"),),
    )
    old.execute("INSERT INTO node_secrets VALUES ('n1', 'abc', 2.0)")
    old.execute("INSERT INTO events(time, kind) VALUES (3.0, 'submit')")
    old.close()

    store = SqliteStore(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.get_job("7") == job
        assert store.new_job_id() == "8"
        (token,) = store.list_tokens()
        assert token["id"] == "t1" and token["owner"] is False and token["allow_root"] is False
        assert store.token_by_hash(hash_secret("mgpu_secret"), "user") is not None
        assert store.node_secret_hash("n1") == "abc"
        assert [e["kind"] for e in store.events()] == ["submit"]
    finally:
        store.close()
    again = SqliteStore(path)  # opened again: nothing to migrate, nothing lost
    try:
        assert again.schema_version() == SCHEMA_VERSION and again.get_job("7") == job
    finally:
        again.close()


def test_sqlite_commits_wait_for_the_disk_only_under_the_benchmarks_diagnostic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PRAGMA synchronous: 1 is NORMAL (a master's crash loses nothing), 2 is FULL.
    for value, expected in ((None, 1), ("FULL", 2), ("OFF", 1)):
        if value is None:
            monkeypatch.delenv(SYNCHRONOUS_ENV, raising=False)
        else:
            monkeypatch.setenv(SYNCHRONOUS_ENV, value)
        store = SqliteStore(tmp_path / f"{value}.db")
        try:
            assert store.db.execute("PRAGMA synchronous").fetchone() == (expected,)
        finally:
            store.close()


def test_a_database_of_a_newer_mgpu_is_refused(backend: Backend) -> None:
    store = backend.open()
    assert store.schema_version() == SCHEMA_VERSION
    backend.sql(store, "UPDATE schema_version SET version = 99")
    store.close()
    with pytest.raises((StoreError, RuntimeError), match="schema version 99, newer"):
        backend.open()


def test_masters_starting_together_migrate_one_at_a_time(pg_url: str) -> None:
    opened: list[PostgresStore] = []
    failed: list[BaseException] = []

    def start() -> None:
        try:
            opened.append(PostgresStore(pg_url))
        except BaseException as e:  # pragma: no cover - shown by the assert
            failed.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert failed == [] and len(opened) == 4
        assert {store.schema_version() for store in opened} == {SCHEMA_VERSION}
    finally:
        for store in opened:
            store.close()


# ---- tokens and node secrets behind the store -------------------------------------------


def test_tokens_are_kept_by_the_store(backend: Backend, tmp_path: Path) -> None:
    tokens = TokenStore(backend.open(), tmp_path, "f" * 16)
    tokens.bootstrap("alice")
    admin = (tmp_path / "admin-token").read_text().strip()
    join = (tmp_path / "join-token").read_text().strip()
    ident = tokens.user(admin)
    assert ident is not None and ident.owner and ident.admin and ident.allow_root
    assert tokens.join(join) and not tokens.join(admin) and tokens.user(join) is None
    token_id, bob = tokens.create("bob", admin=False)
    assert tokens.user(bob) == tokens.user(bob) and tokens.user(bob).user == "bob"  # type: ignore[union-attr]
    assert [(t["user"], t["kind"], t["owner"]) for t in tokens.list()] == [
        ("-", "join", False),
        ("alice", "user", True),
        ("bob", "user", False),
    ]
    assert tokens.guarded(ident.token_id) == "the owner's admin token"
    assert tokens.guarded(token_id) is None
    assert tokens.revoke(token_id) and not tokens.revoke(token_id)
    assert tokens.user(bob) is None
    # A restart: the same tokens from the store (the files are not written again).
    again = TokenStore(backend.open(), tmp_path, "f" * 16)
    again.bootstrap("alice")
    assert again.user(admin) == ident and len(again.list()) == 3


def test_node_secrets_are_kept_by_the_store(store: Store) -> None:
    secrets = NodeSecrets(store)
    first = secrets.verify("n1", None, connected=False)
    assert first.refusal is None and first.new_secret and secrets.known("n1")
    assert secrets.verify("n1", first.new_secret, connected=True).replaces_link
    assert secrets.verify("n1", "mgpunode_x", connected=False).bad_secret
    assert secrets.forget("n1") and not secrets.known("n1") and not secrets.forget("n1")


def test_a_submits_idempotency_key_is_stored_with_its_job(store: Store) -> None:
    """In the job's own transaction: a master that takes over knows what the key made."""
    job = master_job("101")
    store.save_jobs([job], events=[("submit", "alice", None, "101")], keys=[("k" * 32, "101")])
    template = master_job("102")
    store.save_array(template, [0, 1], None, ("submit", "alice", None, "102"), key="a" * 32)
    assert store.job_of_submit_key("k" * 32, "alice") == "101"
    assert store.job_of_submit_key("a" * 32, "alice") == "102"
    assert store.job_of_submit_key("k" * 32, "bob") is None  # a key is its user's
    assert store.job_of_submit_key("b" * 32, "alice") is None
    assert store.delete_submit_keys_before(0.0, 10) == 0  # both are newer
    assert store.delete_submit_keys_before(float("inf"), 1) == 1  # a slice at a time
    assert store.delete_submit_keys_before(float("inf"), 10) == 1
    assert store.job_of_submit_key("k" * 32, "alice") is None and store.get_job("101") is not None


def test_a_key_stored_already_fails_its_whole_transaction(store: Store) -> None:
    """A submit sent again is not looked up first (control/submitkeys.py): its key's row
    refuses it, KeyTaken, and nothing of its transaction is written."""
    store.save_jobs([master_job("101")], keys=[("k" * 32, "101")])
    with pytest.raises(KeyTaken):
        store.save_jobs(
            [master_job("102"), master_job("103")],
            events=[("submit", "alice", None, "102")],
            keys=[("n" * 32, "102"), ("k" * 32, "103")],
        )
    with pytest.raises(KeyTaken):
        store.save_array(master_job("104"), [0, 1], None, key="k" * 32)
    assert [store.get_job(i) for i in ("102", "103")] == [None, None]
    assert store.get_array("104") is None and store.job_of_submit_key("n" * 32, "alice") is None
    assert store.job_of_submit_key("k" * 32, "alice") == "101"


def test_a_task_number_past_any_integer_finds_the_highest_array(store: Store) -> None:
    """`mgpu show 9223372036854775808` (a number past SQLite's integers): an answer, not a
    500 (the API fuzz found it)."""
    assert store.array_below(2**63) is None
    store.save_array(master_job("100"), [0, 1], None)
    assert store.array_below(2**63) == store.array_below(2**70) == "100"


# ---- fencing (PostgreSQL) ---------------------------------------------------------------


def _lease(conn: psycopg.Connection[object], generation: int) -> None:
    conn.execute(
        f"INSERT INTO {LEASE_TABLE}(id, generation, holder, address, expires_at) "
        "VALUES (1, %s, 'other', NULL, now()) "
        "ON CONFLICT (id) DO UPDATE SET generation = excluded.generation",
        (generation,),
    )


def test_a_deposed_leader_writes_nothing(pg_url: str, tmp_path: Path) -> None:
    store = PostgresStore(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as other:
            _lease(other, 1)
            store.fence.generation = 1
            store.save_jobs([_ended("1")])  # its own generation: writes
            _lease(other, 2)  # another master took the lease
            writes = [
                lambda: store.save_jobs([_ended("2")], event=("submit", "a", None, "2")),
                lambda: store.record_event("x"),
                lambda: store.set_meta("k", "v"),
                lambda: store.save_node("n1", {}),
                lambda: TokenStore(store, tmp_path, "f").create("eve", admin=True),
                lambda: NodeSecrets(store).verify("n2", None, connected=False),
                # More rows than one query carries: the pipeline's check refuses it too.
                lambda: store.save_jobs([_ended(str(i)) for i in range(100, 200)]),  # type: ignore[misc]
            ]
            for write in writes:
                with pytest.raises(Fenced):
                    write()
            _lease(other, 1)  # even its own generation back: it stepped down for good
            with pytest.raises(Fenced):
                store.record_event("y")
            assert store.fence.lost
            rows = other.execute(
                "SELECT (SELECT COUNT(*) FROM jobs), (SELECT COUNT(*) FROM events), "
                "(SELECT COUNT(*) FROM meta WHERE key='k'), (SELECT COUNT(*) FROM nodes), "
                "(SELECT COUNT(*) FROM tokens), (SELECT COUNT(*) FROM node_secrets)"
            ).fetchone()
            assert rows == (1, 0, 0, 0, 0, 0)
    finally:
        store.close()


def test_a_leaders_failed_write_leaves_its_connection_usable(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        _lease(store.connection(), 1)
        store.fence.generation = 1
        with pytest.raises(psycopg.errors.NotNullViolation):  # an event without its kind
            store.save_jobs([_ended("1")], event=(None, "a", None, "1"))  # type: ignore[arg-type]
        assert store.connection().info.transaction_status == TransactionStatus.IDLE
        store.save_jobs([_ended("2")], event=("submit", "a", None, "2"))
        assert store.get_job("1") is None and store.get_job("2") is not None
        _lease(store.connection(), 2)
        with pytest.raises(Fenced):
            store.record_events([("x", None, None, None, None)])
        assert store.connection().info.transaction_status == TransactionStatus.IDLE
        assert store.get_job("2") is not None  # reads go on
    finally:
        store.close()


# ---- PostgreSQL going away ----------------------------------------------------------------


def test_a_restart_of_postgresql_is_waited_out(
    pg_url: str, postgres: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresStore(durable(pg_url), retry_for=60.0)
    try:
        store.save_jobs([_ended("1")])
        assert [j.id for j in store.read_finished(0.0)] == ["1"]  # its reader connection
        postgres.restart()
        store.save_jobs([_ended("2")])  # a new connection, the same store
        assert store.get_job("2") is not None and store.count_by_state() == {"completed": 2}
        assert {j.id for j in store.read_finished(0.0)} == {"1", "2"}  # a new reader too
        # Down while a write runs: it waits, and goes in once the server is back.
        caplog.set_level(logging.WARNING, logger="mgpu.master")
        postgres.kill()
        failed: list[BaseException] = []

        def write() -> None:
            try:
                store.save_jobs([_ended("3")], event=("submit", "alice", None, "3"))
            except BaseException as e:  # pragma: no cover - shown by the assert
                failed.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        wait_for(lambda: "is unreachable" in caplog.text, timeout=30, what="the retry")
        postgres.start()
        writer.join(timeout=60)
        assert not writer.is_alive() and failed == []
        assert store.get_job("3") is not None and store.new_job_id() == "4"
        assert "mgpu@127.0.0.1" in caplog.text
    finally:
        store.close()


def test_a_database_gone_for_too_long_is_one_clear_error(pg_url: str, postgres: PgServer) -> None:
    store = PostgresStore(durable(pg_url), retry_for=1.0)
    try:
        postgres.kill()
        try:
            with pytest.raises(StoreUnavailable, match="unreachable for 1 s"):
                store.record_event("x")
        finally:
            postgres.start()
        store.record_event("x")  # back: the store goes on
        assert [e["kind"] for e in store.events()] == ["x"]
    finally:
        store.close()


# ---- open_store -------------------------------------------------------------------------


def test_open_store_picks_the_backend(tmp_path: Path, pg_url: str) -> None:
    for database in (None, ""):
        store = open_store(database, tmp_path)
        assert isinstance(store, SqliteStore) and (tmp_path / "mgpu.db").exists()
        store.close()
    for url in (pg_url, pg_url.replace("postgresql://", "postgres://")):
        store = open_store(url, tmp_path)
        assert isinstance(store, PostgresStore)
        store.close()


def test_open_store_says_what_is_wrong_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is not a PostgreSQL address") as bad:
        open_store("mysql://root:hunter2@db/mgpu", tmp_path)
    assert "hunter2" not in str(bad.value)
    url = f"postgresql://mgpu:hunter2@127.0.0.1:{free_port()}/mgpu"
    with pytest.raises(StoreError, match="cannot reach the database") as gone:
        open_store(url, tmp_path)
    assert "hunter2" not in str(gone.value) and "\n" not in str(gone.value)


def test_the_cluster_config_names_the_database(tmp_path: Path) -> None:
    from mgpu.config import load_config

    path = tmp_path / "cluster.yaml"
    path.write_text("database: postgresql://mgpu@db.example:5432/mgpu\n")
    assert load_config(path).database == "postgresql://mgpu@db.example:5432/mgpu"
    assert load_config(None).database is None


def test_any_text_is_stored_as_given(store: Store) -> None:
    odd = 'it\'s 100%s \\ "quoted" ; DROP TABLE jobs; -- é 日本 \U0001f600 \x01'
    job = master_job("1", command=odd, submit_time=1.0, user="alice")
    job.env = {"X": odd}
    store.save_jobs([job], event=("submit", odd, odd, "1"), detail=odd, meta=("k", odd))
    store.save_jobs([master_job(str(i), command=odd, submit_time=1.0) for i in range(2, 40)])
    assert store.get_job("1") == job and store.get_meta("k") == odd
    assert store.get_jobs(["5"])["5"].command == odd
    (event,) = [e for e in store.events() if e["kind"] == "submit"]
    assert event["actor"] == odd and event["detail"] == odd
    assert store.count_by_state() == {"queued": 39}
