"""`--gpu-share F` end to end through the CLI: packing on one fake GPU, the job's share
variables, MPS where a (fake) control daemon's pipe is found, placement policies,
accounting at F x time, and the one-sentence refusals."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import LocalCluster, local_cluster, wait_for

ENV_DUMP = (
    'echo "share=$MGPU_GPU_SHARE mem=$MGPU_GPU_MEMORY_LIMIT_MB '
    "pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE cvd=$CUDA_VISIBLE_DEVICES "
    'pin=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT pipe=$CUDA_MPS_PIPE_DIRECTORY"'
)


@pytest.fixture
def mps_node(tmp_path: Path) -> Iterator[LocalCluster]:
    """One agent with one fake GPU, and a fake MPS control daemon's pipe on its node."""
    pipes = tmp_path / "mps"
    pipes.mkdir(mode=0o755)  # the daemon's: root's, not writable by others (mgpu.agent.mps)
    os.mkfifo(pipes / "control")
    logs = tmp_path / "mps-log"
    logs.mkdir(mode=0o755)
    c = LocalCluster(tmp_path)
    try:
        c.start_master()
        c.env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipes)  # the agent's environment
        c.env["CUDA_MPS_LOG_DIRECTORY"] = str(logs)
        c.start_agent("node001", gpus=1)
        c.env.pop("CUDA_MPS_PIPE_DIRECTORY")
        c.env.pop("CUDA_MPS_LOG_DIRECTORY")
        yield c
    finally:
        c.stop()


def submit(c: LocalCluster, *args: str) -> str:
    return c.cli("submit", *args, check=True).stdout.strip()


def test_four_quarters_share_one_gpu_and_a_whole_job_waits(mps_node: LocalCluster) -> None:
    c = mps_node
    client = c.client()
    gate = c.root / "gate"
    hold = f"{ENV_DUMP}; while [ ! -e {gate} ]; do sleep 0.05; done"
    shares = [submit(c, "--gpu-share", "0.25", hold) for _ in range(4)]
    wait_for(
        lambda: all(client.show(j)["state"] == "running" for j in shares),
        what="four shares running at once",
    )
    whole = submit(c, "--gpus", "1", "echo whole")
    wait_for(lambda: "GPU" in (client.show(whole)["reason"] or ""), what="the whole job's reason")
    assert client.show(whole)["state"] == "queued"

    queue = c.cli("queue", check=True).stdout
    for j in shares:
        assert "node001:0(0.25)" in next(line for line in queue.splitlines() if j in line)
    assert "GPU 0 shared: 1 used by 4 jobs" in queue
    gpu = client.nodes()[0]["gpus"][0]
    assert gpu["busy_job"] is None and gpu["share_used"] == 1.0
    assert sorted(t["job_id"] for t in gpu["shared_jobs"]) == sorted(shares)
    shown = json.loads(c.cli("show", "--json", shares[0], check=True).stdout)
    assert shown["gpu_share"] == 0.25

    for j in shares:
        wait_for(lambda j=j: "share=" in client.logs(j), what=f"{j}'s environment")
        line = client.logs(j).strip()
        # 0.25 of the fake GPU's 81920 MB; MPS found: the pinned memory capped at the share
        assert line == (f"share=0.25 mem=20480 pct=25 cvd=0 pin=0=20480M pipe={c.root / 'mps'}"), (
            line
        )
    gate.touch()
    assert client.wait(whole, timeout=30)["state"] == "completed"
    ended = [client.wait(j, timeout=30) for j in shares]
    assert all(j["state"] == "completed" for j in ended)
    # The whole job started only once the last share had let go of the GPU.
    assert client.show(whole)["start_time"] >= max(j["end_time"] for j in ended)


def test_accounting_charges_the_share(mps_node: LocalCluster) -> None:
    c = mps_node
    client = c.client()
    job = submit(c, "--gpu-share", "0.25", "sleep 1")
    done = client.wait(job, timeout=30)
    assert done["state"] == "completed"
    row = next(r for r in client.history()["jobs"] if r["id"] == job)
    assert row["runtime"] >= 1.0
    assert row["gpu_hours"] == pytest.approx(0.25 * row["runtime"] / 3600, abs=2e-6)
    report = json.loads(c.cli("report", "--by", "node", "--json", check=True).stdout)
    node = next(r for r in report["rows"] if r["key"] == "node001")
    assert node["gpu_hours"] == pytest.approx(row["gpu_hours"], abs=2e-6)


@pytest.mark.parametrize(
    ("policy", "same_gpu"), [("fill_first", True), ("spread", False)], ids=["packs", "spreads"]
)
def test_policies_pack_or_spread_shares(tmp_path: Path, policy: str, same_gpu: bool) -> None:
    with local_cluster(tmp_path, agents=1, gpus=2) as c:
        client = c.client()
        jobs = [submit(c, "--gpu-share", "0.5", "--policy", policy, "sleep 30") for _ in range(2)]
        wait_for(
            lambda: all(client.show(j)["state"] == "running" for j in jobs), what="both running"
        )
        gpus = [client.show(j)["allocation"][0]["gpu_ids"] for j in jobs]
        assert (gpus[0] == gpus[1]) is same_gpu, gpus
        c.cli("cancel", *jobs, check=True)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpu-share", "1.5"], "between 0 and 1"),
        (["--gpu-share", "0"], "between 0 and 1"),
        (["--gpu-share", "0.5", "--gpus", "2"], "cannot be combined with --gpus 2"),
        (["--gpu-share", "0.5", "--node-gpu-ids", "node001:0,1"], "--node-gpu-ids"),
        (["--gpu-share", "0.5", "--nodes", "2"], "--nodes"),
        (["--gpu-share", "half"], "invalid float value"),
    ],
)
def test_bad_shares_are_refused_with_one_sentence(
    refusing_cluster: LocalCluster, args: list[str], words: str
) -> None:
    cluster = refusing_cluster
    res = cluster.cli("submit", *args, "true")
    assert res.returncode != 0
    assert res.stderr.startswith("mgpu: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert words in res.stderr
    assert cluster.client().queue(all=True)["jobs"] == []
