"""Every connection a master opens to PostgreSQL (store/pglink.py) carries the server-side
keepalives, so that PostgreSQL ends a cut-off master's session (and frees the locks it
held) within seconds, and its holder's tag, by which a standby finds an expired leader's
sessions; a leader's also end once idle in a transaction for the lease's TTL."""

from __future__ import annotations

from typing import Any

import pytest

from mgpu.master.ha.leadership import Leadership, LeaseTiming
from mgpu.master.store.fence import Fence
from mgpu.master.store.pglink import Link, backend_tag, params

psycopg = pytest.importorskip("psycopg")

SETTINGS = (
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
    "idle_in_transaction_session_timeout",
    "application_name",
)


def shown(conn: Any) -> dict[str, str]:
    return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in SETTINGS}


def test_the_tag_is_whole_whatever_the_holder_s_length() -> None:
    long = "h" * 200 + ":1234:abcd"
    link = Link.of_holder(long)
    assert link.application_name.startswith(backend_tag(long))
    assert len(link.application_name.encode()) <= 63
    assert backend_tag(long) != backend_tag(long.replace("abcd", "abce"))
    assert link.named("output").application_name == link.application_name  # no room: kept


def test_the_url_s_options_are_kept_after_ours() -> None:
    found = params("postgresql://u@h/db?options=-c%20statement_timeout%3D5", Link())
    assert found["options"].endswith("-c statement_timeout=5")
    assert "-c tcp_keepalives_idle=5" in found["options"]
    assert found["keepalives"] == 1 and found["application_name"] == "mgpu-master"


def test_a_leader_s_connections_carry_keepalives_its_tag_and_the_idle_timeout(
    pg_url: str, tmp_path: Any
) -> None:
    from mgpu.master.store import open_store
    from mgpu.master.store.pgoutputs import PgOutputStore

    leadership = Leadership(pg_url, "a:1", Fence(), LeaseTiming(ttl=3.0))
    store: Any = open_store(pg_url, tmp_path, link=leadership.link)
    outputs = PgOutputStore(pg_url, store.fence, store.link)
    lease_conn = leadership._connect()
    try:
        tag = backend_tag(leadership.holder)
        for conn in (store.connection(), outputs._conn("write"), lease_conn):
            got = shown(conn)
            assert got["application_name"].startswith(tag), got
            assert (
                got["tcp_keepalives_idle"],
                got["tcp_keepalives_interval"],
                got["tcp_keepalives_count"],
                got["tcp_user_timeout"],
            ) == ("5", "2", "3", "10000"), got
            assert got["idle_in_transaction_session_timeout"] == "3s", got
    finally:
        lease_conn.close()
        outputs.close_all()
        store.close()


def test_a_single_master_s_connections_carry_the_keepalives_too(pg_url: str, tmp_path: Any) -> None:
    from mgpu.master.store import open_store
    from mgpu.master.store.pgoutputs import PgOutputStore

    store: Any = open_store(pg_url, tmp_path)
    outputs = PgOutputStore(pg_url, store.fence)
    try:
        for conn in (store.connection(), outputs._conn("read")):
            got = shown(conn)
            assert got["tcp_keepalives_idle"] == "5" and got["tcp_user_timeout"] == "10000"
            assert got["application_name"].startswith("mgpu-master")
            assert got["idle_in_transaction_session_timeout"] == "0"  # no lease: none
    finally:
        outputs.close_all()
        store.close()
