"""Users' commands while the database is paused, with two masters (issue 32's chaos bench:
submits failed while PostgreSQL was paused or cut).  The leader answers what needs the
database with a quick 503 and `Retry-After` (item 4); the client asks again, within its
failover wait, what does no harm asked twice: a submit from the CLI and from the Python
Client made during the pause each make one job, after it, and report no error.

A PostgreSQL server of its own (pausing the session's would stall every other test's
database); pgserver's `paused()` continues it whatever happens."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgserver
from hacluster import HaCluster, Timed, leader_standby_and_agents
from pgserver import PgServer

PAUSE_S = 8.0
"""Long enough for a submit to be refused during it (the leader waits 2 s at most)."""


@pytest.fixture
def server() -> Iterator[PgServer]:
    with pgserver.own_server() as server:
        yield server


@pytest.fixture
def ha(tmp_path: Path, server: PgServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[HaCluster]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with leader_standby_and_agents(tmp_path, server.create_database("mgpu")) as cluster:
        cluster.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
        yield cluster


def test_submits_during_a_database_pause_wait_and_make_one_job_each(
    ha: HaCluster, server: PgServer, tmp_path: Path
) -> None:
    client = ha.client()
    assert client.queue() is not None  # the leader known, a connection in the pool
    with server.paused():
        time.sleep(1.0)  # the pause has begun for the leader too (not a sync: a margin)
        by_client = Timed(lambda: client.submit("echo made-by-client", gpus=0, cwd=str(tmp_path)))
        by_cli = Timed(lambda: ha.cli("submit", "--gpus", "0", "echo made-by-cli", timeout=120))
        time.sleep(PAUSE_S)  # the database stays paused this long, whatever the clients do
    for work in (by_client, by_cli):
        work.join(timeout=120)
        assert not work.is_alive()
    assert by_client.error is None, by_client.error
    cli: subprocess.CompletedProcess[str] = by_cli.result
    assert cli.returncode == 0, cli.stderr
    assert by_client.took < 30 and by_cli.took < 30  # within the failover wait
    made = [by_client.result.id, cli.stdout.split()[-1]]
    ended = ha.client().wait_all(made, timeout=120)
    assert [j["state"] for j in ended] == ["completed", "completed"]
    with psycopg.connect(server.url("mgpu")) as db:
        for text in ("made-by-client", "made-by-cli"):
            (count,) = db.execute(
                "SELECT count(*) FROM jobs WHERE record LIKE %s", (f'%"command":"echo {text}"%',)
            ).fetchone()
            assert count == 1, f"{count} jobs for {text}"
