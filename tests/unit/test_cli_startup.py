"""`mgpu queue` and `mgpu show` start at the floor: they import nothing heavy.

Not a timing (this machine's timings wander): what the commands import, measured on the
real console script against a small fake master, and the two shortcuts that make it so,
checked against what they replace (argparse for the plain command lines, the `json`
package for JSON).
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import http_server
from mgpu.client import jsonlite
from mgpu.client.cli import _quick_args, build_parser, cmd_queue, cmd_show

MGPU = Path(sys.executable).parent / "mgpu"

JOB = {
    "id": "a1b2c3d4",
    "name": "train",
    "user": "alice",
    "state": "running",
    "command": "python train.py",
    "gpus": 1,
    "exit_code": None,
    "reason": None,
    "allocation": [{"node_id": "node001", "gpu_ids": [0], "hostname": "h", "ip": "10.0.0.1"}],
    "submit_time": 1700000000.0,
    "start_time": 1700000001.0,
    "end_time": None,
    "retries": 0,
    "max_retries": 5,
    "attempts": [],
}
NODE = {
    "node_id": "node001",
    "state": "online",
    "connected": True,
    "hostname": "h",
    "ip": "10.0.0.1",
    "gpus": [{"index": 0, "name": "Fake GPU", "memory_mb": 81920, "busy_job": "a1b2c3d4"}],
}

# Modules a one-shot query has no use for.  The first line is the server stacks and what
# this client replaced (http.client imports email); the rest is what `mgpu queue` avoids
# to stay at its floor: each costs it 1 to 5 ms.
HEAVY = {
    *("pydantic", "fastapi", "starlette", "uvicorn", "rich", "yaml", "email", "http.client"),
    *("ssl", "asyncio", "subprocess", "threading", "mgpu.master", "mgpu.agent", "mgpu.scheduler"),
    *("argparse", "json", "re", "enum", "typing", "socket", "selectors", "pathlib"),
    *("collections", "dataclasses", "urllib.parse", "ipaddress", "encodings.idna"),
}


class _FakeMaster(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == "/api/jobs":
            self._answer(200, {"jobs": [JOB], "nodes": [NODE]})
        elif path == f"/api/jobs/{JOB['id']}":
            self._answer(200, JOB)
        else:
            self._answer(404, {"detail": "no such job or node"})

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    with http_server(_FakeMaster) as address:
        yield address


def imported(argv: list[str], address: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime ARGV` and return it with the modules it imported."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "MGPU_MASTER": address}
    env["MGPU_TOKEN"] = "mgpu_test"
    res = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    modules = set()
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                modules.add(name)
    return res, modules


@pytest.mark.parametrize(
    "argv",
    [
        ["queue"],
        ["queue", "--json", "--all"],
        ["show", "a1b2c3d4"],
        ["show", "a1b2c3d4", "--json"],
        ["show", "a1b2c3d4", "--all"],
    ],
)
def test_queue_and_show_import_nothing_heavy(argv: list[str], master: str) -> None:
    if not MGPU.exists():
        pytest.skip("no mgpu console script next to this Python")
    _, at_start = imported(["-c", "pass"], master)  # what the interpreter loads anyway
    res, modules = imported([str(MGPU), *argv], master)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "a1b2c3d4" in res.stdout
    if "--json" in argv:
        out = json.loads(res.stdout)
        assert out == ({"jobs": [JOB], "nodes": [NODE]} if argv[0] == "queue" else JOB)
    assert "mgpu.client.api" in modules  # the measurement sees mgpu's imports
    heavy = {m for m in modules - at_start if m in HEAVY or m.split(".")[0] in HEAVY}
    assert not heavy, f"mgpu {' '.join(argv)} imports {sorted(heavy)}"


def test_a_master_that_is_down_costs_no_more(tmp_path: Path) -> None:
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        _, at_start = imported(["-c", "pass"], address)
        res, modules = imported([str(MGPU), "queue"], address)
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1].startswith(
        f"mgpu: error: cannot reach the mgpu master at {address} (connection refused)"
    )
    heavy = {m for m in modules - at_start if m in HEAVY or m.split(".")[0] in HEAVY}
    assert not heavy, f"mgpu queue with the master down imports {sorted(heavy)}"


def test_errors_stay_one_line(master: str) -> None:
    res, modules = imported([str(MGPU), "show", "nosuchjob"], master)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr.splitlines()[-1] == "mgpu: error: no such job or node"
    res, modules = imported([str(MGPU), "queue", "--bogus"], master)
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1] == "mgpu: error: unrecognized arguments: --bogus"
    assert "argparse" in modules  # what is not a plain command line goes to argparse


# ---- the command-line shortcut agrees with argparse ----------------------------------

WORDS = ["--host", "--port", "--token", "h", "8080", "x1", "-1", "queue", "show", "--all"]
WORDS += ["-a", "--json", "--", "-h", "a1b2", "--al", "--host=h", "", "nodes", "-aj"]


def _same(argv: list[str]) -> None:
    quick = _quick_args(argv)
    if quick is None:
        return  # argparse's to parse (or to refuse)
    full = build_parser().parse_args(argv)
    assert quick.fn is {"queue": cmd_queue, "show": cmd_show}[full.cmd] is full.fn
    assert vars(quick) == {k: v for k, v in vars(full).items()}, argv


@pytest.mark.parametrize(
    "argv",
    [
        ["queue"],
        ["queue", "--json", "-a"],
        ["--host", "h", "--port", "8080", "--token", "t", "show", "x", "--json"],
        ["--port", "01", "queue"],
        ["show", "", "--json"],
        ["show", "x", "--all"],
        ["--host", "a", "--host", "b", "queue"],
    ],
)
def test_quick_parse_is_argparse(argv: list[str]) -> None:
    assert _quick_args(argv) is not None
    _same(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--host"],
        ["--host", "--port", "1", "queue"],  # argparse: --host expected one argument
        ["--port", "x", "queue"],
        ["--port", "-1", "queue"],
        ["queue", "--al"],  # an abbreviation
        ["--host=h", "queue"],
        ["show"],
        ["show", "a", "b"],
        ["show", "-x"],
        ["queue", "extra"],
        ["queue", "-h"],
        ["nodes"],
    ],
)
def test_quick_parse_leaves_the_rest_to_argparse(argv: list[str]) -> None:
    assert _quick_args(argv) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=7))
def test_quick_parse_never_disagrees_with_argparse(argv: list[str]) -> None:
    _same(argv)


# ---- jsonlite is the json package -----------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_jsonlite_is_json(value: Any) -> None:
    assert jsonlite.dumps(value) == json.dumps(value)
    text = json.dumps(value, ensure_ascii=False, indent=1)
    assert jsonlite.loads(text) == json.loads(text)
    assert jsonlite.loads(text.encode()) == json.loads(text.encode())


def test_jsonlite_edges() -> None:
    special = [
        float("inf"),
        -0.0,
        1e300,
        {2: "a", True: "b", None: "c", 2.5: "d"},
        '\u2028"\\\x00é',
    ]
    assert jsonlite.dumps(special) == json.dumps(special)
    assert math.isnan(jsonlite.loads(" \n[NaN]\t")[0])
    for bad in ["", "  ", "{", '{"a": 1} x', "[1,]", "nul", "'a'"]:
        with pytest.raises(ValueError):
            jsonlite.loads(bad)
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonlite.dumps({"a": object()})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        jsonlite.dumps(loop)
    assert jsonlite.dumps([1]) == "[1]"  # the failed encode left nothing behind
