"""A leader whose lease another master took writes nothing and steps down at its first
refused write (master/http/app.py wires `Fenced` to `Leadership.deposed`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mgpu.config import ClusterConfig
from mgpu.master.ha.identity import ensure_identity
from mgpu.master.ha.leadership import Leadership, LeaseTiming
from mgpu.master.http.app import create_app
from mgpu.master.store.fence import Fence
from mgpu.testing import wait_for

psycopg = pytest.importorskip("psycopg")

SECRET = b"the cluster's secret, forty bytes long!!"


def test_the_first_refused_write_deposes_the_leader(tmp_path: Path, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_identity(tmp_path, conn, SECRET)
    # Renewals far apart: the refused write, not the lease loop, finds the takeover.
    slow = LeaseTiming(ttl=120, renew=60, retry=0.1)
    leadership = Leadership(pg_url, "127.0.0.1:1", Fence(), slow)
    lost: list[str] = []
    leadership.on_lost = lost.append
    app = create_app(tmp_path, ClusterConfig(), leadership=leadership)
    token = (tmp_path / "admin-token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        wait_for(lambda: client.get("/readyz").status_code == 200, what="it to lead")
        assert client.get("/healthz").json()["role"] == "leader"
        ok = client.post("/api/jobs", json={"command": "true", "gpus": 0}, headers=auth)
        assert ok.status_code == 201, ok.text
        with psycopg.connect(pg_url, autocommit=True) as conn:
            (before,) = conn.execute("SELECT count(*) FROM jobs").fetchone()
            conn.execute("UPDATE mgpu_lease SET generation = generation + 1, holder = 'other'")
        refused = client.post("/api/jobs", json={"command": "true", "gpus": 0}, headers=auth)
        assert refused.status_code >= 500
        wait_for(lambda: lost, timeout=30, what="the leader to step down")
        assert "another master leads now" in lost[0]
        assert not leadership.may_send()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            (after,) = conn.execute("SELECT count(*) FROM jobs").fetchone()
        assert after == before
