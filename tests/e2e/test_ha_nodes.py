"""Nodes through a failover (issue 32, item 6): a new leader shows a node it has not heard
from yet as the last leader had it, not connected (`online*`), never offline before the
node's own heartbeat timeout.  One agent is stopped (SIGSTOP) across a kill -9 of the
leader, so that it cannot say hello to the new one for as long as the test looks.
(tests/hacluster.py starts the processes; each is stopped by process group at the end,
and the stopped agent continued.)"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hacluster import HaCluster, leader_standby_and_agents
from helpers import wait_for


@pytest.fixture
def ha(tmp_path: Path, pg_url: str) -> Iterator[HaCluster]:
    with leader_standby_and_agents(tmp_path, pg_url) as cluster:
        yield cluster


class NodesPoll(threading.Thread):
    """GET /api/nodes on one master, again and again: every answer it gave with 200."""

    def __init__(self, address: str, token: str) -> None:
        super().__init__(daemon=True)
        self.address, self.token = address, token
        self.answers: list[dict[str, dict[str, Any]]] = []
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        request = urllib.request.Request(
            f"http://{self.address}/api/nodes", headers={"Authorization": f"Bearer {self.token}"}
        )
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(request, timeout=5) as r:
                    nodes = json.loads(r.read())["nodes"]
                self.answers.append({n["node_id"]: n for n in nodes})
            except (OSError, ValueError, KeyError):  # a standby's 503 (HTTPError), or down
                pass
            self.done.wait(0.05)

    def since(self, count: int) -> list[dict[str, dict[str, Any]]]:
        return self.answers[count:]


def test_a_new_leader_shows_no_node_offline_before_its_timeout(ha: HaCluster) -> None:
    agent = ha.agents["node002"]
    poll = NodesPoll(ha.addresses[1], ha.admin_token)
    os.killpg(agent.pid, signal.SIGSTOP)
    try:
        ha.kill_master(0)
        killed = time.monotonic()
        assert ha.leader(timeout=60, other_than=0) == 1
        # node001's agent finds the new leader; node002's cannot (stopped).
        wait_for(
            lambda: poll.answers and poll.answers[-1]["node001"]["connected"],
            timeout=60,
            what="node001 to say hello to the new leader",
        )
        seen = len(poll.answers)
        wait_for(lambda: len(poll.since(seen)) >= 20, timeout=60, what="more looks at the nodes")
        shown = json.loads(ha.cli("nodes", "--json", check=True).stdout)["nodes"]
        table = ha.cli("nodes", check=True).stdout
        assert time.monotonic() - killed < 30, "the test looked past node002's timeout"
        node002 = next(n for n in shown if n["node_id"] == "node002")
        assert (node002["state"], node002["connected"]) == ("online", False)
        assert any(line.split()[:2] == ["node002", "online*"] for line in table.splitlines())
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
    ha.wait_node("node002", "online", timeout=60)  # its agent, continued, says hello
    poll.done.set()
    poll.join(timeout=10)

    assert poll.answers, "the new leader never answered"
    offline = [
        (node_id, n["state"])
        for answer in poll.answers
        for node_id, n in answer.items()
        if n["state"] == "offline"
    ]
    assert offline == [], f"shown offline during the failover: {offline[:5]}"
    assert any(a["node002"]["connected"] is False for a in poll.answers)
