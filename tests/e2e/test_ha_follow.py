"""`mgpu logs -f` through failovers that lose output the follower had already printed
(issue 32's chaos bench: ticks missed across a leader's stop, a cut, both masters killed).

A leader on PostgreSQL serves its followers records from its memory before they are
stored (store/pgoutputs.py); when it dies with such records, the agent sends that output
again to the next leader, which cuts it into other records: a follower's count of records
no longer says where it stands there.  Here the leader's output writes are held back (a
lock on the output table taken by the test) while the follower prints what the leader
holds, then the leader is killed, twice in a row, with one `logs -f` following throughout:
every tick is printed once, none lost, none twice, and the store has them all.
(tests/hacluster.py starts the processes; every one is stopped by process group.)"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from hacluster import HaCluster, follow_logs, leader_standby_and_agents
from helpers import kill_group, wait_for

HELD_TICKS = 30
"""Ticks the follower prints from the leader's memory (its writes held) before the kill."""


@pytest.fixture
def ha(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[HaCluster]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with leader_standby_and_agents(tmp_path, pg_url, nodes=("node001",)) as cluster:
        cluster.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
        yield cluster


def _ticks(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.startswith("tick-")]


def _kill_leader_holding_printed_output(
    ha: HaCluster, pg_url: str, leader: int, got: list[str]
) -> None:
    """Hold the leader's output writes (SHARE lock on job_output: its flush waits) until the
    follower printed HELD_TICKS more ticks, which only the leader's memory holds; kill it
    (its memory is lost), let the writes go, start it again as the standby."""
    with psycopg.connect(pg_url) as db, db.transaction():
        db.execute("LOCK TABLE job_output IN SHARE MODE")
        printed = len(_ticks(got))
        wait_for(
            lambda: len(_ticks(got)) >= printed + HELD_TICKS,
            timeout=60,
            what="ticks printed from the leader's memory",
        )
        ha.kill_master(leader, signal.SIGKILL)
    other = 1 - leader
    assert ha.leader(timeout=60, other_than=leader) == other
    ha.start_master(leader)


def test_logs_follow_loses_and_repeats_no_line_through_two_failovers(
    ha: HaCluster, tmp_path: Path, pg_url: str
) -> None:
    stop = tmp_path / "stop-ticking"
    script = f"i=0; while [ ! -e {stop} ]; do i=$((i+1)); echo tick-$i; sleep 0.05; done"
    job = ha.client().submit(script, gpus=1, cwd=str(tmp_path))
    err = tmp_path / "follow.err"
    follow, got, reader_thread = follow_logs(ha, job.id, err)
    try:
        wait_for(lambda: len(_ticks(got)) >= 10, timeout=60, what="the first ticks followed")
        _kill_leader_holding_printed_output(ha, pg_url, 0, got)
        _kill_leader_holding_printed_output(ha, pg_url, 1, got)
        printed = len(_ticks(got))
        wait_for(
            lambda: len(_ticks(got)) >= printed + 20,
            timeout=60,
            what="ticks followed on the last leader",
        )
        stop.touch()
        follow.wait(timeout=120)
        reader_thread.join(timeout=10)
    finally:
        stop.touch()
        kill_group(follow, timeout=5)
    stderr = err.read_text()
    stored = _ticks(ha.client().logs(job.id).splitlines(keepends=True))
    assert stored == [f"tick-{i}" for i in range(1, len(stored) + 1)], "the store lost ticks"
    shown = _ticks(got)
    missing = sorted(set(stored) - set(shown), key=lambda t: int(t[5:]))
    assert not missing, f"{len(missing)} ticks never printed: {missing[:10]}...; {stderr}"
    assert shown == stored, f"ticks printed twice or out of order; {stderr}"
    assert follow.returncode == 0, stderr
