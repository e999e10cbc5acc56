"""CPUs and memory end to end: a node started with `--fake-cpus 4 --fake-mem 8G` says them
in its node JSON, two `--cpus 3` jobs whose GPUs fit run one after the other, a request no
node could ever hold is refused at submit in Slurm's words, and a job that asks nothing
runs beside others as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, wait_for


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path)
    try:
        c.start_master()
        c.start_agent("node001", gpus=2, extra=["--fake-cpus", "4", "--fake-mem", "8G"])
        yield c
    finally:
        c.stop()


def _node(c: LocalCluster) -> dict[str, Any]:
    """The node as `mgpu nodes --json` has it."""
    (n,) = json.loads(c.cli("nodes", "--json", check=True).stdout)["nodes"]
    return n  # type: ignore[no-any-return]


def _submit(c: LocalCluster, *args: str) -> str:
    return c.cli("submit", *args, check=True).stdout.strip()


def test_two_jobs_whose_cpus_do_not_fit_together_run_one_after_the_other(
    node: LocalCluster,
) -> None:
    c = node
    n = _node(c)
    assert (n["cpus"], n["cpus_free"], n["mem_mb"], n["mem_free_mb"]) == (4, 4, 8192, 8192)
    client = c.client()
    gate = c.root / "gate"
    hold = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    first = _submit(c, "--gpus", "1", "--cpus", "3", "--mem", "2G", hold)
    wait_for(lambda: client.show(first)["state"] == "running", what="the first job running")
    second = _submit(c, "--gpus", "1", "--cpus", "3", "true")
    shown = client.show(first)
    assert (shown["cpus"], shown["mem_mb"]) == (3, 2048)
    assert len(shown["allocation"][0]["cpu_ids"]) == 3
    n = _node(c)
    assert (n["cpus_free"], n["mem_free_mb"]) == (1, 6144)
    # A GPU is free, but one CPU is not three: the second waits for the first.
    wait_for(lambda: client.show(second)["reason"] is not None, what="a pass over the second")
    assert client.show(second)["state"] == "queued"
    nodes = c.cli("nodes", check=True).stdout.splitlines()
    assert "CPUS" in nodes[0] and "RAM" in nodes[0] and " 1/4 " in nodes[1]
    queue = c.cli("queue", check=True).stdout
    assert "CPUS" in queue and "2G" in queue
    assert "per node:   3 CPUs, 2G memory" in c.cli("show", first, check=True).stdout
    metrics = urllib.request.urlopen(f"http://{c.address}/metrics", timeout=10).read().decode()
    assert 'mgpu_node_cpus_free{node="node001"} 1.0' in metrics
    assert f'mgpu_job_cpus{{job="{first}",node="node001"}} 3.0' in metrics

    gate.touch()
    wait_for(lambda: client.show(second)["state"] == "completed", what="the second job done")
    a, b = client.show(first), client.show(second)
    assert a["state"] == "completed" and b["start_time"] >= a["end_time"]


def test_a_request_no_node_could_ever_hold_is_refused_at_submit(node: LocalCluster) -> None:
    c = node
    res = c.cli("submit", "--gpus", "1", "--cpus", "16", "true")
    assert res.returncode != 0
    assert "Requested node configuration is not available" in res.stderr
    assert "16 CPUs asked per node, the most any node offers is 4" in res.stderr
    res = c.cli("submit", "--gpus", "1", "--mem", "lots", "true")
    assert res.returncode != 0 and "'lots' is not a memory size" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert c.client().queue()["jobs"] == []  # nothing stored


def test_a_job_that_asks_nothing_shares_the_node_as_before(node: LocalCluster) -> None:
    c = node
    client = c.client()
    gate = c.root / "gate"
    hold = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    jobs = [_submit(c, "--gpus", "1", hold) for _ in range(2)]
    wait_for(
        lambda: all(client.show(j)["state"] == "running" for j in jobs),
        what="both jobs running at once",
    )
    for j in jobs:
        shown = client.show(j)
        assert (shown["cpus"], shown["mem_mb"], shown["resources"]) == (None, None, None)
    assert _node(c)["cpus_free"] == 4
    assert "CPUS" not in c.cli("queue", check=True).stdout.split("Nodes:")[0]
    gate.touch()
    wait_for(lambda: all(client.show(j)["state"] == "completed" for j in jobs), what="both done")


HOG = """import sys, time
chunks = []
for _ in range(400):  # 400 MiB, far past the job's 64M
    chunks.append(bytearray(1 << 20))
    time.sleep(0.002)
print("survived")
"""


def test_the_master_grants_what_the_agent_enforces(tmp_path: Path) -> None:
    """The whole chain: `--cpus`/`--mem` at submit, the master's grant, the agent's cgroup:
    a job past its memory ends failed as out_of_memory (Slurm's OUT_OF_MEMORY, 0:125) and is
    not retried, while its neighbour on the same node runs on the one CPU it was given."""
    from mgpu.agent import runlimits

    status = Path("/proc/self/status").read_text()
    mine = sorted(runlimits.cpu_list(status.split("Cpus_allowed_list:")[1].split()[0]))
    if len(mine) < 2 or os.geteuid() != 0:
        pytest.skip("needs two CPUs and root (cgroups)")
    c = LocalCluster(tmp_path)
    try:
        c.start_master()
        c.start_agent("node001", gpus=2, extra=["--fake-cpus", "2", "--fake-mem", "1G"])
        client = c.client()
        hog_py = c.root / "hog.py"
        hog_py.write_text(HOG)
        hog = _submit(c, "--gpus", "1", "--cpus", "1", "--mem", "64M", sys.executable, str(hog_py))
        neighbour = _submit(
            c,
            "--gpus",
            "1",
            "--cpus",
            "1",
            "--mem",
            "256M",
            "grep Cpus_allowed_list /proc/self/status",
        )
        done = ("completed", "failed", "cancelled", "timeout")
        wait_for(
            lambda: all(client.show(j)["state"] in done for j in (hog, neighbour)),
            timeout=120,
            what="both jobs ended",
        )
        h, n = client.show(hog), client.show(neighbour)
        assert (h["state"], h["end_code"], h["end_reason"]) == (
            "failed",
            "out_of_memory",
            "out_of_memory",
        ), h
        assert h["retries"] == 0 and len(h["attempts"]) == 1
        assert h["max_rss_mb"] is not None and h["max_rss_mb"] <= 80
        assert n["state"] == "completed", n
        granted = n["allocation"][0]["cpu_ids"]
        assert len(granted) == 1 and granted != h["allocation"][0]["cpu_ids"]
        out = c.cli("logs", neighbour, check=True).stdout
        assert out.split()[-1] == str(granted[0]), out
        assert _node(c)["state"] == "online"  # the node is not blamed
        rows = subprocess.run(
            [str(BIN / "mgpu"), "sacct", "-P", "-j", hog, "--format=JobID,State,ExitCode"],
            capture_output=True,
            text=True,
            env=c.env,
            timeout=60,
        ).stdout.splitlines()
        assert f"{hog}|OUT_OF_MEMORY|0:125" in rows, rows
    finally:
        c.stop()
