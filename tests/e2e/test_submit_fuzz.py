"""Hostile input on the submit path: a property test against a real master and agent.

Hypothesis generates bodies for POST /api/jobs: the fields a client sends, with values
that look valid, and hostile ones (lone surrogates as a non-UTF-8 byte becomes, NUL,
strings of 70 KB to 1 MB, odd JSON types, negative and huge numbers, weird environment
names), plus bodies that are not JSON objects at all.  Each must be either refused with
a 4xx and one sentence, or accepted and end on its own (every command it can run is
`echo`, `true`, `exit 3` or a program that does not exist).  Afterwards the master
answers /healthz and `mgpu queue`, every accepted job has ended, and the node is online
and was never blamed (`failures == 0`).
"""

from __future__ import annotations

import getpass
import http.client
import json
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import BIN, LocalCluster
from mgpu.execspec import is_reserved_env_name

MAX_EXAMPLES = 150
ME = getpass.getuser()
JARGON = ("Input should", "Value error", "Field required", "Traceback", "[type=")


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("fuzz"))
    try:
        c.start_master()
        c.start_agent("node001", gpus=2, extra=["--container-runtime", "none"])
        yield c
    finally:
        c.stop()


# ---- strategies ---------------------------------------------------------------------

HOSTILE = st.sampled_from(
    [
        "\ud800",
        "\udcff",
        "caf\udce9",  # b"caf\xe9" from a Latin-1 environment, as the CLI used to send it
        "a\x00b",
        "\x00",
        "",
        " ",
        "\n",
        "\r\n\t",
        "\u202eevil",
        "🚀",
        "--privileged",
        "../../etc/passwd",
        "-1",
        "x" * 70_000,
        "é" * 40_000,
        "y" * 1_000_000,
    ]
)
TEXT = st.one_of(HOSTILE, st.text(max_size=20))
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    HOSTILE,
)


def options(*valid: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(valid), ODD)


COMMAND = st.one_of(
    st.sampled_from(["true", "exit 3", "echo hi", "echo $HOME", "no-such-program-xyz"]),
    TEXT.map(lambda t: "echo " + shlex.quote(t)),
    ODD,
)
ARGV = st.one_of(
    st.tuples(
        st.sampled_from(["echo", "true", "/nonexistent/prog", "", " ", "\ud800", "e\x00"]),
        st.lists(TEXT, max_size=3),
    ).map(lambda t: [t[0], *t[1]]),
    st.lists(st.sampled_from(["echo", "x"]), max_size=5000),
    ODD,
)
ENV_NAME = st.sampled_from(
    [
        "A",
        "PATH",
        "LD_PRELOAD",
        "CUDA_VISIBLE_DEVICES",
        "MGPU_JOB_ID",
        "SLURM_X",
        "BASH_FUNC_f%%",
        "",
        "A=B",
        "1A",
        "A B",
        "\ud800",
        "A\x00",
    ]
)
ENV = st.one_of(st.dictionaries(ENV_NAME, st.one_of(TEXT, ODD), max_size=4), ODD)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(TEXT, ODD),
    "user": options(ME, "", "../x", "a b", "x" * 100, "r\udcffot", "nobody\x00"),
    "gpus": st.one_of(st.integers(min_value=-2, max_value=4), ODD),
    "gpu_ids": options("0", "1", "0,1", "0-1", "5", "-1", "x", [0], [1, 0], [7], [-1]),
    "node_gpu_ids": options("node001:0", "node001:0,1", "node002:0", "node001", ";"),
    "nodes": st.one_of(st.integers(min_value=-1, max_value=3), ODD),
    "gpus_per_node": st.one_of(st.integers(min_value=-1, max_value=3), ODD),
    "nodelist": options("node001", "node[001-002]", ["node001"], "node0[", ["x", 1]),
    "exclude": options("node002", ["node002"], "node001", "[]"),
    "gpu_type": options("A100", "fake", "\x1b[31m"),
    "policy": options("fill_first", "spread", "best"),
    "distributed": st.one_of(st.booleans(), ODD),
    "mpi": st.one_of(st.booleans(), ODD),
    "time": options("0:05", "1", "UNLIMITED", "0", "-1", "soon", "99999999999"),
    "priority": st.one_of(st.integers(min_value=-(10**7), max_value=10**7), ODD),
    "retries": st.one_of(st.integers(min_value=-1, max_value=3), ODD),
    "dependency": options("afterok:deadbeef", "afterany:", "afterok:zz", "x"),
    "array": options("0-2", "0-1%1", "3", "5-1", "0-99999999", "0-2%0"),
    "preemptible": st.one_of(st.booleans(), ODD),
    "interactive": st.one_of(st.booleans(), ODD),
    "cwd": options("/tmp", "/", "/nonexistent/dir", "relative", "/tmp/\udcff"),
    "env": ENV,
    "image": options("busybox", "-v", "a b"),
    "bogus_field": ODD,
}
SAFE_TEXT = st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=20)
"""Text a program can be given (hypothesis leaves surrogates out by default)."""
VALID: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["train", "训练 run", "x" * 128]),
    "gpus": st.integers(min_value=0, max_value=2),
    "gpu_ids": st.sampled_from(["0", "1", "0-1", [1], [0, 1]]),
    "node_gpu_ids": st.sampled_from(["node001:0", "node001:1", "node001:0,1"]),
    "nodes": st.just(1),
    "gpus_per_node": st.integers(min_value=0, max_value=2),
    "nodelist": st.sampled_from(["node001", ["node001"]]),
    "exclude": st.sampled_from(["node002", []]),
    "policy": st.sampled_from(["fill_first", "spread"]),
    "distributed": st.booleans(),
    "mpi": st.booleans(),
    "time": st.sampled_from(["0:05", "1", "UNLIMITED"]),
    "priority": st.integers(min_value=-100, max_value=100),
    "retries": st.integers(min_value=0, max_value=3),
    "array": st.sampled_from(["0-2", "0-1%1", "3"]),
    "preemptible": st.booleans(),
    "interactive": st.booleans(),
    "cwd": st.sampled_from(["/tmp", "/", "/nonexistent/dir"]),
    "env": st.dictionaries(st.sampled_from(["A", "B_2", "CUDA_VISIBLE_DEVICES"]), SAFE_TEXT),
}
ANY = {"command": COMMAND, "argv": ARGV, **FIELDS}


@st.composite
def job_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible job (a harmless command, a few valid options), then zero to two fields
    replaced by anything, hostile values included."""
    body: dict[str, Any] = draw(
        st.one_of(
            st.fixed_dictionaries({"command": st.sampled_from(["true", "echo hi", "exit 3"])}),
            st.fixed_dictionaries(
                {"argv": st.lists(SAFE_TEXT, max_size=3).map(lambda words: ["echo", *words])}
            ),
        )
    )
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=3, unique=True)):
        body[name] = draw(VALID[name])
    for name in draw(st.lists(st.sampled_from(sorted(ANY)), max_size=2, unique=True)):
        body[name] = draw(ANY[name])
    return body


NOT_AN_OBJECT = st.sampled_from(
    [b"", b"[]", b'"true"', b"null", b"5", b'{"command": "true",}', b"{", b'{"command": "\xff"}']
)


# ---- the property ---------------------------------------------------------------------


def post(c: LocalCluster, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {c.admin_token}", "Content-Type": "application/json"}
        conn.request("POST", "/api/jobs", body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw)
    finally:
        conn.close()


def check_refusal(status: int, answer: Any) -> None:
    assert 400 <= status < 500, (status, answer)
    detail = answer["detail"]
    assert isinstance(detail, str) and detail.strip() == detail and detail, answer
    assert "\n" not in detail, detail
    assert not any(j in detail for j in JARGON), detail
    assert len(detail) < 1000, detail


def test_hostile_submissions_are_refused_or_run_and_never_hurt_the_node(
    fuzz_cluster: LocalCluster,
) -> None:
    c = fuzz_cluster
    accepted: list[str] = []
    refused = 0

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(job_bodies().map(lambda body: json.dumps(body).encode()), NOT_AN_OBJECT))
    def one(body: bytes) -> None:
        nonlocal refused
        status, answer = post(c, body)
        if status == 201:
            accepted.extend(answer.get("task_ids") or [answer["job_id"]])
            assert all(is_reserved_env_name(n) for n in answer.get("dropped_env", []))
        else:
            check_refusal(status, answer)
            refused += 1

    one()
    assert accepted and refused, (len(accepted), refused)  # both sides were exercised
    client = c.client()
    jobs = client.wait_all(accepted, timeout=120)
    stuck = [
        (j["id"], j["state"], j["reason"]) for j in jobs if j["state"] in ("queued", "running")
    ]
    assert not stuck, stuck
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
    env = {k: v for k, v in c.env.items() if k.startswith("MGPU_") or not is_reserved_env_name(k)}
    for args in (["queue"], ["queue", "--all"], ["queue", "--json", "--all"]):
        res = _mgpu(env, *args)
        assert res.returncode == 0, res.stderr
    [node] = client.nodes()
    assert (node["state"], node["connected"], node["failures"]) == ("online", True, 0), node
    after = client.submit(["echo", "still fine"], gpus=1)
    assert client.wait(after.id, timeout=60)["state"] == "completed"
    assert client.logs(after.id) == "still fine\n"


def _mgpu(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "mgpu"), *args], env=env, capture_output=True, text=True, timeout=60
    )
