"""A leader whose PostgreSQL is paused (every server process SIGSTOP-ed, as a frozen VM)
while jobs flow: it goes on answering from memory, refuses what needs the database with a
quick 503 and one sentence, judges no node, and after SIGCONT takes work again with
nothing lost (store/dbthread.py; docs/HA.md).

Each test has a PostgreSQL server of its own (pausing the session's would stall every
other test's database) and one master on it, so that the master that was paused is the
one that goes on after (with two, a standby may take the lease at the resume).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pgserver
from hacluster import HaCluster, get_json
from helpers import wait_for
from mgpu.client.api import Client, RequestError
from pgserver import PgServer

PAUSE_S = 10.0
"""How long the database is stopped (the issue's shorter pause)."""
ANSWER_S = 5.0
"""What a request may take during the pause (the master waits 2 s at most; a loaded
two-core machine gets the rest)."""
STALLED = "the database does not answer (paused or cut): try again"
CONFIG = """
networking:
  heartbeat_interval: 0.5
  timeout: 5
"""
"""Nodes silent for 5 s are lost: a master that judged them through the 10 s pause would
lose both."""


@pytest.fixture
def server() -> Iterator[PgServer]:
    with pgserver.own_server() as server:
        yield server  # never left stopped: `paused()` continues it whatever happens


@pytest.fixture
def leader(tmp_path: Path, server: PgServer) -> Iterator[HaCluster]:
    """One master on the server's database, two agents with 2 fake GPUs each."""
    cluster = HaCluster(tmp_path, server.create_database("mgpu"), masters=1, config=CONFIG)
    try:
        cluster.start_master(0)
        assert cluster.leader(timeout=60) == 0
        for node in ("node001", "node002"):
            cluster.start_agent(node, gpus=2, wait=False)
        for node in ("node001", "node002"):
            cluster.wait_node(node, "online", timeout=60)
        yield cluster
    finally:
        cluster.stop()


class Watch:
    """Polls the leader through the pause from a thread: /healthz, the nodes, the queue
    through the CLI; keeps what went wrong."""

    def __init__(self, cluster: HaCluster) -> None:
        self.cluster = cluster
        self.client = cluster.client()
        self.problems: list[str] = []
        self.polls = 0
        self.queue_runs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _timed(self, what: str, took: float) -> None:
        if took > ANSWER_S:
            self.problems.append(f"{what} took {took:.1f} s")

    def _run(self) -> None:
        address = self.cluster.addresses[0]
        while not self._stop.is_set():
            t = time.monotonic()
            status, body = get_json(address, "/healthz", timeout=ANSWER_S + 5)
            self._timed("/healthz", time.monotonic() - t)
            if status != 200:
                self.problems.append(f"/healthz answered {status} {body}")
            t = time.monotonic()
            status, body = get_json(address, "/readyz", timeout=ANSWER_S + 5)
            self._timed("/readyz", time.monotonic() - t)
            if status not in (200, 503):
                self.problems.append(f"/readyz answered {status} {body}")
            t = time.monotonic()
            try:
                states = {n["node_id"]: n["state"] for n in self.client.nodes()}
            except Exception as e:
                self.problems.append(f"nodes: {e}")
            else:
                if set(states.values()) != {"online"}:
                    self.problems.append(f"nodes shown {states}")
            self._timed("nodes", time.monotonic() - t)
            t = time.monotonic()
            res = self.cluster.cli("queue", timeout=60)
            self._timed("mgpu queue", time.monotonic() - t)
            if res.returncode != 0 and STALLED not in res.stderr:
                self.problems.append(f"mgpu queue: {res.returncode} {res.stderr.strip()}")
            self.queue_runs += 1
            self.polls += 1
            self._stop.wait(0.3)


def test_a_paused_database_leaves_the_leader_answering_and_losing_nothing(
    leader: HaCluster, server: PgServer, tmp_path: Path
) -> None:
    client = leader.client()
    # A token never used yet: the master must look it up in the database.
    fresh = Client(leader.addresses[0], token=client.create_token("bob")["token"])
    long = client.submit("sleep 300", gpus=1).id
    wait_for(lambda: client.show(long)["state"] == "running", timeout=60, what="the long job")
    # Jobs that end during the pause: their ends are written then, and their only line of
    # output is appended then (the master must wait for neither on its event loop).
    flowing = [client.submit(f"sleep {1 + i % 3}; echo done", gpus=1).id for i in range(6)]
    wait_for(
        lambda: sum(client.show(j)["state"] == "running" for j in flowing) >= 2,
        timeout=60,
        what="jobs running when the database is paused",
    )
    submitted_during: list[str] = []
    with Watch(leader) as watch, server.paused():
        time.sleep(PAUSE_S / 2)  # the thread polls meanwhile; then a submit, mid-pause
        t = time.monotonic()
        with pytest.raises(RequestError, match=re.escape(STALLED)):
            fresh.queue()
        assert time.monotonic() - t <= ANSWER_S, "an unknown token's request waited"
        t = time.monotonic()
        res = leader.cli("submit", "--gpus", "1", "true", timeout=60)
        took = time.monotonic() - t
        if res.returncode == 0:  # a client that waited the pause out: made once
            submitted_during.append(res.stdout.split()[-1])
        else:
            assert STALLED in res.stderr, res.stderr
            assert took <= ANSWER_S + 3, f"a refused submit took {took:.1f} s"
        time.sleep(PAUSE_S / 2)
    assert watch.polls >= 3, f"the leader was polled only {watch.polls} times in the pause"
    assert not watch.problems, f"{watch.problems[:10]}\n{leader.logs_of_masters()}"

    # The database is back: work is taken again, and nothing was lost.
    def submit() -> str | None:
        try:
            return client.submit("echo after", gpus=1).id
        except Exception:
            return None

    after = wait_for(submit, timeout=60, interval=0.5, what="a submit after the pause")
    ended = client.wait_all([*flowing, *submitted_during, after], timeout=120)
    assert {j["id"]: j["state"] for j in ended} == {
        j: "completed" for j in [*flowing, *submitted_during, after]
    }
    # Each ran once.  A launch decided as the pause began may not reach its agent (the
    # lease ran out before it was written): that job is queued again, never run twice.
    again = {j["id"]: j["attempts"] for j in ended if len(_started(j)) != 1}
    assert not again, f"{again}\n{leader.logs_of_masters()}"
    assert [client.logs(j).strip() for j in flowing] == ["done"] * len(flowing)
    running = client.show(long)
    assert running["state"] == "running" and len(_started(running)) <= 1, running
    assert "lost: silent" not in leader.logs_of_masters(tail=None)
    assert {n["state"] for n in client.nodes()} == {"online"}


def test_agents_that_watch_for_the_leader_stay_linked_through_the_pause(
    tmp_path: Path, server: PgServer
) -> None:
    """An agent given several masters watches for the leader itself, and a master out of
    its lease keeps it (control/nodes.py).  Jobs that end during the pause have their ends
    written when the database answers again, and their agents told to forget them, which
    may come before the lease is renewed: those messages wait for the renewal
    (state/registry.py, `may_hold`).  Before, each closed its agent's link, and every
    agent said hello again (and launches were sent again) after every pause."""
    cluster = HaCluster(tmp_path, server.create_database("mgpu"), masters=1, config=CONFIG)
    # A second master address where nothing answers: the agents watch for a leader there
    # (none ever leads) and stay with this one, as with a standby on a paused database.
    masters = f"{cluster.addresses[0]},127.0.0.1:{pgserver.free_port()}"
    try:
        cluster.start_master(0)
        assert cluster.leader(timeout=60) == 0
        for node in ("node001", "node002"):
            cluster.start_agent(node, gpus=2, wait=False, extra=["--master-host", masters])
        for node in ("node001", "node002"):
            cluster.wait_node(node, "online", timeout=60)
        client = cluster.client()
        flowing = [client.submit(f"sleep {1 + i % 3}; echo done", gpus=1).id for i in range(4)]
        wait_for(
            lambda: sum(client.show(j)["state"] == "running" for j in flowing) >= 2,
            timeout=60,
            what="jobs running when the database is paused",
        )
        before = {n: len(cluster.log(n)) for n in ("master0", "node001", "node002")}
        with server.paused():
            time.sleep(PAUSE_S)
        ended = client.wait_all(flowing, timeout=120)
        assert {j["id"]: j["state"] for j in ended} == dict.fromkeys(flowing, "completed")
        again = {j["id"]: j["attempts"] for j in ended if len(_started(j)) != 1}
        assert not again, f"{again}\n{cluster.logs_of_masters()}"
        # Their agents were told to forget them (the lease renewed by then): links intact.
        wait_for(
            lambda: "lease is held again" in cluster.log("master0")[before["master0"] :],
            timeout=60,
            what="the lease renewed after the pause",
        )
        since = {n: cluster.log(n)[k:] for n, k in before.items()}
        assert "disconnected" not in since["master0"], since["master0"]
        for node in ("node001", "node002"):
            assert "connection to the master lost" not in since[node], since[node]
        assert {n["state"] for n in client.nodes()} == {"online"}
    finally:
        cluster.stop()


def _started(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's attempts that started on a node (a launch that never reached one did not)."""
    return [a for a in job.get("attempts") or [] if a.get("start_time") is not None]
