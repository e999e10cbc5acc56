"""The submit path against a real master and agent: warnings the CLI prints, strings that
are odd but valid reaching the job intact, malformed requests, and jobs submitted before
any node joined being judged once nodes have."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, local_cluster, wait_for
from mgpu.execspec import is_reserved_env_name


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master and one agent with 2 fake GPUs."""
    with local_cluster(tmp_path_factory.mktemp("submit"), agents=1, gpus=2) as c:
        yield c


def clean_env(c: LocalCluster, **extra: str) -> dict[str, str]:
    """The cluster's client environment without reserved names a developer's shell may
    hold (a test run inside a Slurm job has SLURM_*), plus `extra`."""
    env = {k: v for k, v in c.env.items() if k.startswith("MGPU_") or not is_reserved_env_name(k)}
    env.pop("MGPU_JOB_ID", None)
    return {**env, **extra}


def mgpu(
    env: dict[str, str], *args: str, cwd: bytes | str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "mgpu"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def post(c: LocalCluster, body: bytes) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {c.admin_token}", "Content-Type": "application/json"}
        conn.request("POST", "/api/jobs", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_cli_warns_once_about_variables_not_passed(one_node: LocalCluster) -> None:
    env = clean_env(
        one_node,
        CUDA_VISIBLE_DEVICES="3",
        SLURM_JOB_ID="77",
        MGPU_EXTRA="mine",  # mgpu's own namespace: dropped without a word
        LATIN1_VAR="caf\udce9",  # b"caf\xe9": not UTF-8
        GOOD="yes",
    )
    script = 'echo "[$CUDA_VISIBLE_DEVICES] [${SLURM_JOB_ID-}] [${LATIN1_VAR-unset}] $GOOD"'
    res = mgpu(env, "srun", "--gpus", "1", "--", "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    assert res.stderr == (
        "mgpu: warning: not passed to the job (name or value not UTF-8, or not a variable "
        "name): LATIN1_VAR\n"
        "mgpu: warning: not passed to the job, mgpu sets them itself: CUDA_VISIBLE_DEVICES, "
        "SLURM_JOB_ID\n"
    )
    assert res.stdout in ("[0] [] [unset] yes\n", "[1] [] [unset] yes\n")

    quiet = mgpu(clean_env(one_node, GOOD="yes"), "submit", "--json", "true")
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert set(json.loads(quiet.stdout)) == {"job_id"}  # the contract's answer, unchanged

    inside = clean_env(one_node, MGPU_JOB_ID="a1b2c3d4", CUDA_VISIBLE_DEVICES="0", RANK="0")
    res = mgpu(inside, "submit", "true")  # from inside a job: all of it came from mgpu
    assert res.returncode == 0 and res.stderr == ""


def test_cli_refuses_a_directory_whose_path_is_not_utf8(
    one_node: LocalCluster, tmp_path: Path
) -> None:
    odd = os.path.join(os.fsencode(tmp_path), b"r\xe9sultats")
    os.mkdir(odd)
    before = len(one_node.client().queue(all=True)["jobs"])
    res = mgpu(clean_env(one_node), "submit", "true", cwd=odd)
    assert res.returncode == 1
    assert res.stderr == (
        f"mgpu: error: the current directory {tmp_path}/r\\xe9sultats is not valid UTF-8, "
        "and the job would run there; submit from another directory or give cwd\n"
    )
    assert len(one_node.client().queue(all=True)["jobs"]) == before


def test_odd_but_valid_strings_reach_the_job_intact(one_node: LocalCluster) -> None:
    c = one_node.client()
    words = ["a b", "ü 训练 🚀", "line1\nline2", "'\"$HOME`x`\\", "-n", "\t"]
    # An exported bash function is accepted (whether it reaches bash depends on /bin/sh).
    env = {"ODD": "x\ny 🚀 = ; $(true)", "EMPTY": "", "BASH_FUNC_greet%%": "() {  echo hi\n}"}
    job = c.submit(
        ["python3", "-c", "import json,os,sys; print(json.dumps([sys.argv[1:], "
         "os.environ['ODD'], os.environ['EMPTY']]))", *words],
        gpus=0, env={**env, "PATH": os.environ["PATH"]}, name="训练 run",
    )  # fmt: skip
    done = c.wait(job.id, timeout=60)
    assert done["state"] == "completed", done
    assert json.loads(c.logs(job.id)) == [words, env["ODD"], ""]
    assert done["name"] == "训练 run"


def test_refused_requests_answer_one_sentence_and_store_nothing(one_node: LocalCluster) -> None:
    before = len(one_node.client().queue(all=True)["jobs"])
    cases: list[tuple[bytes, int, str]] = [
        (
            b'{"command": "true",}',
            422,
            "the request body is not valid JSON (Expecting property name enclosed in "
            "double quotes at character 19)",
        ),
        (b'{"command": "\\ud800"}', 422, "the command is not valid UTF-8 (character 1 is"),
        (b'{"argv": ["echo", "a\\u0000"]}', 422, "--argv[1] contains a NUL byte"),
        (b'{"command": "true", "env": {"A=B": "x"}}', 422, "--env name 'A=B' is not a"),
        (b'{"command": "true", "gpus_per_node": -1}', 422, "--gpus-per-node must be"),
        (b'{"command": "true", "gpus": 3}', 400, "no node has 3 GPUs (the largest has 2)"),
        (b"[]", 422, "the request body must be a JSON object"),
    ]
    for body, status, sentence in cases:
        got, answer = post(one_node, body)
        assert got == status, (body, answer)
        assert answer["detail"].startswith(sentence), (body, answer)
        assert "\n" not in answer["detail"]
    got, answer = post(one_node, b'{"command": "caf\xe9"}')  # bytes that are not UTF-8
    assert 400 <= got < 500 and "\n" not in answer["detail"]
    assert len(one_node.client().queue(all=True)["jobs"]) == before
    assert mgpu(clean_env(one_node), "queue").returncode == 0


def test_jobs_queued_before_any_node_are_judged_once_nodes_join(tmp_path: Path) -> None:
    # Listed nodes that never said hello have no GPUs to judge a job against either.
    config = "networking:\n  heartbeat_interval: 0.3\nnodes:\n  - node_id: node001\n"
    c = LocalCluster(tmp_path, config=config + "  - node_id: node002\n")
    try:
        c.start_master()
        client = c.client()
        big = client.submit("true", gpus=8)
        pinned = client.submit("true", node_gpu_ids="node009:0")
        small = client.submit("echo ran", gpus=1)
        array = client.submit("true", gpus=8, array="0-2")
        assert client.show(big.id)["state"] == "queued"  # nothing to judge against yet
        c.start_agent("node001", gpus=4)
        for job_id in (big.id, pinned.id, *(array.task_ids or [])):
            job = client.wait(job_id, timeout=30)
            assert job["state"] == "failed", job
        assert client.wait(small.id, timeout=30)["state"] == "completed"
        # The reason is the sentence submit gives now that the node is known.
        for job_id, opts in ((big.id, "--gpus=8"), (pinned.id, "--node-gpu-ids=node009:0")):
            res = mgpu(clean_env(c), "submit", opts, "true")
            assert res.returncode == 1
            assert res.stderr == f"mgpu: error: {client.show(job_id)['reason']}\n"
        late = client.submit("true", gpus=1)  # judged at submit from now on, and fits
        assert client.wait(late.id, timeout=30)["state"] == "completed"
        node = wait_for(lambda: client.nodes()[0], what="the node")
        assert node["failures"] == 0 and node["state"] == "online"
    finally:
        c.stop()
