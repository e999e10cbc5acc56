"""Fuzz the master's HTTP API from its own OpenAPI document (schemathesis, in process).

The app runs in process over ASGI with a state dir that knows one (offline) node with
two GPUs, so valid submissions are accepted and queued but nothing ever runs: no fuzzed
command is executed.  Every operation gets bounded examples; each must answer without a
server error, and a refused request (any 4xx) must change no job, in memory or on disk.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from mgpu.config import ClusterConfig  # noqa: E402
from mgpu.master.http.app import create_app  # noqa: E402
from mgpu.master.store.sqlite import SqliteStore  # noqa: E402

MAX_EXAMPLES = 25


def _seed(state_dir: Path) -> None:
    """A master state dir that knows one node (offline: it never runs anything)."""
    store = SqliteStore(state_dir / "mgpu.db")
    gpus = [{"index": i, "name": "Fake GPU", "memory_mb": 16384} for i in range(2)]
    store.save_node("node001", {"hostname": "fuzzhost", "ip": "127.0.0.1", "gpus": gpus})
    store.close()


# Built at import (schemathesis parametrizes at collection) but started lazily: the
# master's lifespan begins with the first request of the first example.
STATE_DIR = Path(tempfile.mkdtemp(prefix="mgpu-fuzz-"))
atexit.register(shutil.rmtree, STATE_DIR, ignore_errors=True)  # also when nothing ran
_seed(STATE_DIR)
APP = create_app(STATE_DIR, ClusterConfig())
schema = schemathesis.openapi.from_dict(APP.openapi())
schema.app = APP  # calls go to the app in process (ASGI), not over the network


def start_master() -> None:
    """Start the master's lifespan if it is not running: schemathesis ends it after each
    test item, so every operation begins with a master restart on the same state dir."""
    schema["/healthz"]["GET"].Case().call()


@dataclass
class Api:
    headers: dict[str, str]

    def job_count(self) -> tuple[int, int]:
        """(jobs in memory, job rows on disk)."""
        cluster = APP.state.cluster
        (rows,) = cluster.store.db.execute("SELECT COUNT(*) FROM jobs").fetchone()
        return len(cluster.jobs), int(rows)


@pytest.fixture(scope="module")
def api() -> Api:
    start_master()  # its first start writes the admin token
    token = (STATE_DIR / "admin-token").read_text().strip()
    return Api({"Authorization": f"Bearer {token}"})


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_api_never_500_and_refusals_change_nothing(case: Any, api: Api) -> None:
    start_master()
    before = api.job_count()
    if case.path == "/readyz":
        # A readiness probe: 503 is its answer while not ready (just after a start).
        response = case.call(headers=api.headers)
        assert response.status_code < 500 or response.status_code == 503, response.text
    else:
        response = case.call_and_validate(headers=api.headers, checks=[not_a_server_error])
    after = api.job_count()
    if response.status_code >= 400:
        assert after == before, (
            f"{case.method} {case.path} answered {response.status_code} "
            f"but changed the jobs: {before} -> {after}"
        )
    elif case.method == "POST" and case.path == "/api/jobs":
        assert response.status_code == 201
        created = len(response.json().get("task_ids") or [None])  # an array: its tasks
        assert after[1] == before[1] + created
