"""No token in the master's or an agent's log, even at --verbose, where the `websockets`
library logs every handshake header (issue 25 item 3; mgpu/logredact.py)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from mgpu.client.api import RequestError
from mgpu.testing import BIN, LocalCluster, wait_for


def test_a_verbose_master_and_agent_log_no_token(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    try:
        argv = [str(BIN / "mgpu"), "master", "--verbose", "--port", str(cluster.port)]
        argv += ["--state-dir", str(cluster.state_dir)]
        cluster.master = cluster._spawn(argv, tmp_path / "master.log")
        wait_for(cluster._load_tokens, what="the master's tokens")
        wait_for(lambda: cluster.client().nodes() is not None, what="the master")
        cluster.start_agent("node001", gpus=1, extra=["--verbose"])
        admin = cluster.client()
        user_token = admin.create_token("alice")["token"]
        alice = type(admin)(cluster.address, token=user_token, connect_timeout=2)

        # A client's WebSocket handshake carries `Authorization: Bearer <token>`.
        with pytest.raises(RequestError):
            alice.attach("0badc0de")
        # A dashboard link carries the token in its query.
        url = f"http://{cluster.address}/?token={cluster.admin_token}"
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        job = admin.submit("true").id
        wait_for(lambda: admin.show(job)["state"] == "completed", what="a job")
        node_secret = (tmp_path / "agent-node001" / "node-node001" / "node-secret").read_text()
    finally:
        cluster.stop()

    master, agent = cluster.log("master"), cluster.log("node001")
    # The header lines were logged (the test would pass vacuously otherwise), redacted.
    assert re.search(r"(?i)authorization: <redacted>", master), master[-3000:]
    assert "token=<redacted>" in master
    secrets = [user_token, cluster.admin_token, cluster.join_token, node_secret]
    for secret in secrets:
        bare = secret.partition(".")[0]
        assert bare not in master and bare not in agent
