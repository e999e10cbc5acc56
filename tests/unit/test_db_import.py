"""`mgpu db import` (master/store/dbimport.py): a SQLite store copied into an empty
PostgreSQL database reads back the same through the PostgreSQL store, in one transaction
with the hooks that copy the rest."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from factories import master_job
from mgpu.master.store.base import LAST_JOB_ID, StoreError
from mgpu.master.store.dbimport import import_state
from mgpu.master.store.postgres import PostgresStore
from mgpu.master.store.sqlite import SqliteStore
from mgpu.model import JobState
from stores import OLD_SCHEMA


def _sqlite_state(state_dir: Path) -> dict[str, Any]:
    store = SqliteStore(state_dir / "mgpu.db")
    done = master_job(store.new_job_id(), state=JobState.COMPLETED, submit_time=1.0, end_time=5.0)
    queued = master_job(store.new_job_id(), submit_time=2.0)
    store.save_jobs([done, queued], event=("submit", "alice", "127.0.0.1", done.id), detail="d")
    array = master_job(store.new_job_id(block=3), submit_time=3.0)
    array.script = "#!/bin/sh\necho $MGPU_ARRAY_TASK_ID\n"
    store.save_array(array, [0, 1, 2], 2, event=("submit", "alice", None, array.id))
    store.save_node("node001", {"hostname": "h", "gpus": []})
    store.save_reservation("maint", {"name": "maint", "start": 1.0}, ("reserve", "root", None))
    store.insert_token("t1", "alice", True, "user", "hash1", 1.0, owner=True, allow_root=True)
    store.insert_token("t2", "-", False, "join", "hash2", 2.0)
    store.revoke_token("t2", 3.0)
    store.set_node_secret("node001", "nodehash", 4.0)
    store.save_steps([(done.id, {"number": n, "name": "srun", "exit_code": n}) for n in (0, 1)])
    seen = {
        "active": [j.id for j in store.load_active_jobs()],
        "job": store.get_job(done.id),
        "array": store.get_array(array.id),
        "nodes": store.load_nodes(),
        "reservations": store.load_reservations(),
        "events": store.events(),
        "tokens": store.list_tokens(),
        "counter": store.get_meta(LAST_JOB_ID),
        "next": store.new_job_id(),
        "steps": store.steps_of([done.id]),
    }
    store.close()
    return seen


def test_a_sqlite_state_reads_back_the_same_from_postgresql(tmp_path: Path, pg_url: str) -> None:
    seen = _sqlite_state(tmp_path)

    def outputs(state_dir: Path, conn: psycopg.Connection[Any]) -> dict[str, int]:
        assert state_dir == tmp_path
        conn.execute("INSERT INTO meta(key, value) VALUES ('hooked', 'yes')")
        return {"outputs": 7}

    counts = import_state(tmp_path, pg_url, hooks=[outputs])
    assert counts == {
        "jobs": 2,
        "arrays": 1,
        "nodes": 1,
        "meta": 1,
        "reservations": 1,
        "events": 3,
        "tokens": 2,
        "node_secrets": 1,
        "job_steps": 2,
        "outputs": 7,
    }
    store = PostgresStore(pg_url)
    try:
        assert [j.id for j in store.load_active_jobs()] == seen["active"]
        assert store.get_job(seen["job"].id) == seen["job"]
        assert store.get_array(seen["array"][0].id) == seen["array"]
        assert store.load_nodes() == seen["nodes"]
        assert store.load_reservations() == seen["reservations"]
        assert store.events() == seen["events"]
        assert store.list_tokens() == seen["tokens"]
        assert store.token_by_hash("hash1", "user") == ("t1", "alice", 1, "hash1", 1, 1)
        assert store.node_secret_hash("node001") == "nodehash"
        assert store.get_meta(LAST_JOB_ID) == seen["counter"] and store.get_meta("hooked")
        assert store.new_job_id() == seen["next"]
        assert store.steps_of([seen["job"].id]) == seen["steps"] != {}
        store.record_event("after")  # the events' own ids go on past the imported ones
        assert store.events(limit=1)[0]["kind"] == "after"
    finally:
        store.close()
    with pytest.raises(StoreError, match="already holds a cluster's state"):
        import_state(tmp_path, pg_url, hooks=[])


def test_an_import_is_all_or_nothing(tmp_path: Path, pg_url: str) -> None:
    _sqlite_state(tmp_path)

    def broken(state_dir: Path, conn: psycopg.Connection[Any]) -> dict[str, int]:
        raise RuntimeError("the output copy failed")

    with pytest.raises(RuntimeError, match="output copy failed"):
        import_state(tmp_path, pg_url, hooks=[broken])
    store = PostgresStore(pg_url)
    try:
        assert store.is_empty()
    finally:
        store.close()
    assert import_state(tmp_path, pg_url, hooks=[])["jobs"] == 2  # and then it goes in


def test_a_state_dir_of_an_older_mgpu_imports(tmp_path: Path, pg_url: str) -> None:
    old = sqlite3.connect(tmp_path / "mgpu.db", isolation_level=None)
    old.executescript(OLD_SCHEMA)  # no schema version, tokens without their grant columns
    old.execute("INSERT INTO tokens VALUES ('t1', 'alice', 1, 'user', 'h1', 1.0, NULL)")
    old.execute("INSERT INTO meta VALUES ('last_job_id', '41')")
    old.close()
    counts = import_state(tmp_path, pg_url, hooks=[])
    assert counts["tokens"] == 1 and counts["meta"] == 1 and counts["jobs"] == 0
    store = PostgresStore(pg_url)
    try:
        assert store.token_by_hash("h1", "user") == ("t1", "alice", 1, "h1", 0, 0)
        assert store.new_job_id() == "42"
    finally:
        store.close()
    check = sqlite3.connect(tmp_path / "mgpu.db")
    try:  # still without a version: the import migrated a copy
        names = {r[0] for r in check.execute("SELECT name FROM sqlite_master")}
        assert "schema_version" not in names
    finally:
        check.close()


def test_a_state_dir_without_a_store_is_one_sentence(tmp_path: Path, pg_url: str) -> None:
    with pytest.raises(StoreError, match="does not exist: give the state dir"):
        import_state(tmp_path / "nowhere", pg_url)
