"""Users' clients while the leader is frozen (issue 32, item 3): the leader is stopped with
SIGSTOP (a frozen VM, a swap storm: it takes connections and says nothing) while `mgpu
queue`, the Python Client and `mgpu logs -f` are used; each reaches the new leader well
before its 30 s timeout, and `logs -f` follows on the new leader with no line lost or
repeated.  (tests/hacluster.py starts the processes; every one is stopped by process
group, and the frozen master continued, at the end.)"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from hacluster import HaCluster, Timed, follow_logs, leader_standby_and_agents
from helpers import kill_group, wait_for
from mgpu.client.api import Client

CLIENT_TIMEOUT = 30.0
"""The clients' own timeout (the default): what they waited on a frozen leader before."""


@pytest.fixture
def ha(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[HaCluster]:
    # Where clients remember the leader (this process's Client and the CLI's alike).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with leader_standby_and_agents(tmp_path, pg_url) as cluster:
        cluster.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
        yield cluster


def test_clients_leave_a_frozen_leader_for_the_new_one(
    ha: HaCluster, tmp_path: Path, pg_url: str
) -> None:
    lines = 150
    script = f"for i in $(seq 1 {lines}); do echo line-$i; sleep 0.1; done"
    job = ha.client().submit(script, gpus=1)
    err = tmp_path / "follow.err"
    follow, got, reader_thread = follow_logs(ha, job.id, err)
    frozen = ha.masters[0]
    assert frozen is not None
    try:
        wait_for(lambda: got, timeout=60, what="the first line followed")
        # Users who talked to the leader before it froze: the CLI remembers it (in its
        # cache), each Client keeps a connection to it in its pool.
        assert ha.cli("queue").returncode == 0
        reader, submitter = Client(ha.address), Client(ha.address)
        reader.queue()
        submitter.queue()
        assert reader.address == submitter.address == ha.addresses[0]

        os.killpg(frozen.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        cli = Timed(lambda: ha.cli("queue", timeout=120))
        queue = Timed(reader.queue)
        submit = Timed(lambda: submitter.submit("echo made-once", gpus=0, cwd=str(tmp_path)))
        assert ha.leader(timeout=60, other_than=0) == 1
        led = time.monotonic()
        for work in (cli, queue, submit):
            work.join(timeout=120)
            assert not work.is_alive()
            assert work.error is None, work.error
            waited = work.ended - stopped
            assert waited < CLIENT_TIMEOUT - 2, f"answered {waited:.1f} s after the stop"
            assert work.ended - led < 12, f"{work.ended - led:.1f} s after the new leader"
        assert cli.result.returncode == 0, cli.result.stderr
        assert job.id in cli.result.stdout
        assert reader.address == submitter.address == ha.addresses[1]

        follow.wait(timeout=120)
        reader_thread.join(timeout=10)
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
        kill_group(follow, timeout=5)
    stderr = err.read_text()
    want = [f"line-{i}" for i in range(1, lines + 1)]
    assert [line.strip() for line in got] == want, stderr
    assert follow.returncode == 0, stderr
    assert ha.client().logs(job.id).split() == want
    # The submit made one job, wherever its request went.
    with psycopg.connect(pg_url) as db:
        (made,) = db.execute("SELECT count(*) FROM jobs WHERE record LIKE '%made-once%'").fetchone()
    assert made == 1
