"""docs/HA.md's recipe for PostgreSQL's own HA, as an unprivileged account: a primary, a
streaming-replication hot standby made with `pg_basebackup -R`, and a failover of the
database with `pg_ctl promote` (tests/pgserver.py does each step as the recipe says)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgserver
from hacluster import HaCluster
from helpers import wait_for
from pgserver import PgServer


@pytest.fixture
def primary() -> Iterator[PgServer]:
    # Synchronous replication, as docs/HA.md advises: a commit returns once the standby has
    # it, so a failover loses no transaction a master was told had committed.
    with pgserver.own_server() as server:
        yield server


def rows(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM t ORDER BY n").fetchall()]


def insert(url: str, *values: int) -> None:
    with psycopg.connect(url, connect_timeout=5) as conn:
        for v in values:
            conn.execute("INSERT INTO t VALUES (%s)", (v,))


def test_standby_follows_the_primary_and_takes_writes_once_promoted(primary: PgServer) -> None:
    url = primary.create_database("app")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
    insert(url, 1, 2)  # before the standby exists: in its base backup

    standby = primary.standby(synchronous=True)
    try:
        assert standby.in_recovery()
        insert(url, 3)  # after: streamed; committed once the standby has it
        sby_url = standby.url("app")
        wait_for(lambda: rows(sby_url) == [1, 2, 3], timeout=30, what="the standby's copy")

        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # a hot standby reads only
            insert(sby_url, 99)

        primary.kill()  # the primary's machine dies
        standby.promote()
        assert not standby.in_recovery()
        insert(sby_url, 4)
        assert rows(sby_url) == [1, 2, 3, 4]
    finally:
        standby.stop()


def test_a_multi_host_url_reaches_whichever_server_takes_writes(primary: PgServer) -> None:
    """What a master is given: both servers in one URL with `target_session_attrs=read-write`
    connects to the primary, and after the failover to the promoted standby."""
    primary.create_database("app")
    with psycopg.connect(primary.url("app"), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
    standby = primary.standby(synchronous=True)
    try:
        # the standby first in the list: libpq skips it while it is read-only
        url = PgServer.multi_host_url([standby, primary], "app")
        insert(url, 1)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.info.port == primary.port

        primary.kill()
        with pytest.raises(psycopg.OperationalError):  # no server takes writes now
            psycopg.connect(url, connect_timeout=5).close()
        standby.promote()
        insert(url, 2)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.info.port == standby.port
        assert rows(url) == [1, 2]
    finally:
        standby.stop()


def test_masters_on_a_multi_host_url_resume_on_the_promoted_standby(
    primary: PgServer, tmp_path: Path
) -> None:
    """The database fails over under two running masters: the primary dies, the standby is
    promoted (`pg_ctl promote`), and the masters, given both servers in one URL, go on
    there: every job submitted before and after runs, once."""
    primary.create_database("mgpu")
    standby = primary.standby(synchronous=True)
    cluster = HaCluster(tmp_path, PgServer.multi_host_url([primary, standby], "mgpu"))
    runs = tmp_path / "runs"
    try:
        cluster.supervise()  # a master that lost the lease while the database was away exits
        cluster.start_master(0)
        cluster.start_master(1)
        cluster.start_agent("node001", gpus=4)
        client = cluster.client()
        script = f"echo $MGPU_JOB_ID >> {runs}; sleep 0.5"
        ids = [client.submit(script, gpus=1).id for _ in range(16)]
        wait_for(lambda: runs.exists() and len(runs.read_text().split()) >= 4, timeout=60)

        primary.kill()
        standby.promote()
        ids += [client.submit(script, gpus=1).id for _ in range(8)]  # through the failover

        jobs = client.wait_all(ids, timeout=120)
        assert [j["state"] for j in jobs] == ["completed"] * len(ids), jobs
        ran = runs.read_text().split()
        assert sorted(ran) == sorted(ids), "a job lost or run twice"
        cluster.leader(timeout=30)
    finally:
        cluster.stop()
        standby.stop()
