"""Failover of the master (issue 24): two masters on one PostgreSQL database, agents and
clients given both addresses; the leader is killed with `kill -9` and the standby takes
over.  A job running through it completes once, under the new leader, not failed; the
output of a job that ran before it is all there; a client pointed at the standby first gets
its answer (one given the standby alone is told where the leader is); `mgpu logs -f`
through it shows every line once.  (tests/hacluster.py starts the processes; each test
kills them by process group at its end.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hacluster import HaCluster, follow_logs
from helpers import BIN, kill_group, wait_for

FAILOVER_S = 10.0
"""What a test allows for a standby to lead (the issue's target is 5 s; bench/failover.py
measures it; a test on a loaded two-core machine gets some slack)."""


@pytest.fixture
def ha(tmp_path: Path, pg_url: str) -> Iterator[HaCluster]:
    """Master 0 leads, master 1 stands by; two agents with 2 fake GPUs each."""
    cluster = HaCluster(tmp_path, pg_url, masters=2)
    try:
        cluster.start_master(0)
        assert cluster.leader(timeout=30) == 0
        cluster.start_master(1)
        assert cluster.role(1) == "standby"
        for node in ("node001", "node002"):
            cluster.start_agent(node, gpus=2, wait=False)
        for node in ("node001", "node002"):
            cluster.wait_node(node, "online", timeout=60)
        yield cluster
    finally:
        cluster.stop()


def fail_over(ha: HaCluster) -> tuple[int, float]:
    """kill -9 the leader; the new leader's index and the seconds it took to lead."""
    old = ha.leader()
    t = ha.kill_master(old)
    new = ha.leader(timeout=FAILOVER_S + 20, other_than=old)
    took = time.time() - t
    assert took < FAILOVER_S, f"a standby led only after {took:.1f} s\n{ha.logs_of_masters()}"
    return new, took


def state(ha: HaCluster, job_id: str) -> str:
    return str(ha.client().show(job_id)["state"])


def test_a_job_running_through_a_failover_completes_once(ha: HaCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    job = ha.client().submit(f"echo $MGPU_JOB_ID >> {runs}; sleep 4; echo finished", gpus=1)
    wait_for(lambda: state(ha, job.id) == "running", timeout=30, what="the job running")

    new, _ = fail_over(ha)
    ha.start_master(1 - new)  # the old leader comes back, as a standby
    assert ha.role(1 - new) == "standby"

    done = ha.client().wait(job.id, timeout=60)
    assert done["state"] == "completed", done
    assert len(done["attempts"]) == 1, done["attempts"]  # not requeued, not failed
    assert runs.read_text().split() == [job.id]  # run once
    assert "finished" in ha.client().logs(job.id)
    for node in ha.client().nodes():  # no node was marked down for the failover
        assert node["state"] == "online", node


def test_output_of_a_job_that_ran_before_the_failover_is_all_there(ha: HaCluster) -> None:
    job = ha.client().submit("for i in $(seq 1 500); do echo line-$i; done", gpus=1)
    assert ha.client().wait(job.id, timeout=60)["state"] == "completed"
    fail_over(ha)
    # Killed within ms of the end the leader showed, its end (written after the output,
    # a flush away) may not be stored yet: the new leader then has the job running until
    # its agent re-sends the rest and its exit. Either way it ends with all of it.
    assert ha.client().wait(job.id, timeout=60)["state"] == "completed"

    res = ha.cli("logs", job.id, timeout=60)  # MGPU_MASTER names both masters
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [f"line-{i}" for i in range(1, 501)]


def test_a_client_pointed_at_the_standby_first_gets_its_answer(ha: HaCluster) -> None:
    leader = ha.leader()
    standby = 1 - leader
    env = {**ha.env, "MGPU_MASTER": f"{ha.addresses[standby]},{ha.addresses[leader]}"}

    def mgpu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "mgpu"), *args], capture_output=True, text=True, timeout=60, env=env
        )

    res = mgpu("nodes", "--json")
    assert res.returncode == 0, res.stderr
    assert "node001" in res.stdout
    res = mgpu("submit", "--gpus", "0", "echo via-the-standby")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.split()[-1]
    assert ha.client().wait(job_id, timeout=60)["state"] == "completed"
    # The standby alone, in plain HTTP (nothing proves who it is): it says where the
    # leader is, and the client does not go to an address it was not given.
    env.update(MGPU_MASTER=ha.addresses[standby], MGPU_FAILOVER_WAIT="0.5")
    res = mgpu("logs", job_id)
    assert res.returncode != 0
    assert f"standby; the leader is {ha.addresses[leader]}" in res.stderr


def test_logs_follow_through_a_failover_shows_every_line_once(
    ha: HaCluster, tmp_path: Path
) -> None:
    lines = 80
    job = ha.client().submit(f"for i in $(seq 1 {lines}); do echo line-$i; sleep 0.1; done", gpus=1)
    err = tmp_path / "follow.err"
    follow, got, reader = follow_logs(ha, job.id, err)
    try:
        wait_for(lambda: got, timeout=60, what="the first line followed")
        fail_over(ha)
        follow.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        kill_group(follow, timeout=5)
    stderr = err.read_text()
    want = [f"line-{i}" for i in range(1, lines + 1)]
    stored = ha.client().logs(job.id).split()
    assert stored == want, "the stored output lost or repeated lines"
    assert [line.strip() for line in got] == want, stderr
    assert follow.returncode == 0, stderr
    assert ha.client().show(job.id)["state"] == "completed"
