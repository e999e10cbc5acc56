"""End to end on one machine: a real master and two agents, driven by the CLI and Client."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import BIN, LocalCluster, free_port, wait_for
from mgpu import Client, MgpuError


def job_env(cluster: LocalCluster, job_id: str) -> dict[str, str]:
    out = cluster.client().logs(job_id)
    env = {}
    for line in out.splitlines():
        if "=" in line:
            k, _, v = line.partition("=")
            env[k] = v
    return env


def start_srun(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    """`mgpu srun ARGS` in the background, its output on pipes, in its own session."""
    return subprocess.Popen(
        [str(BIN / "mgpu"), "srun", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        start_new_session=True,
    )


ENV_DUMP = "env | grep -E '^(CUDA_VISIBLE_DEVICES|MGPU_[A-Z_]+)=' | sort"


def test_submit_runs_with_gpu_environment(cluster: LocalCluster) -> None:
    res = cluster.cli("submit", "--gpus", "2", "--name", "envcheck", ENV_DUMP, check=True)
    job_id = res.stdout.strip()
    assert job_id.isdigit(), job_id  # Slurm's ids: integers that grow per cluster
    job = cluster.client().wait(job_id, timeout=30)
    assert job["state"] == "completed", job
    assert job["exit_code"] == 0
    env = job_env(cluster, job_id)
    (slot,) = job["allocation"]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, slot["gpu_ids"]))
    assert len(slot["gpu_ids"]) == 2
    assert env["MGPU_JOB_ID"] == job_id
    assert env["MGPU_NODE_ID"] == slot["node_id"]
    assert env["MGPU_GPU_IDS"] == env["CUDA_VISIBLE_DEVICES"]
    assert slot["pid"] > 0 and slot["hostname"] and slot["ip"] == "127.0.0.1"
    assert job["name"] == "envcheck"
    assert job["submit_time"] <= job["start_time"] <= job["end_time"]


def test_cpu_job_sees_no_gpu(cluster: LocalCluster) -> None:
    job = cluster.client().submit('echo "[$CUDA_VISIBLE_DEVICES]"', gpus=0)
    assert cluster.client().wait(job.id, timeout=30)["state"] == "completed"
    assert cluster.client().logs(job.id) == "[]\n"
    assert cluster.client().show(job.id)["allocation"][0]["gpu_ids"] == []


def test_gpu_variables_a_user_submits_cannot_widen_what_the_job_sees(
    cluster: LocalCluster,
) -> None:
    """The job's GPUs are its grant's (mgpu.agent.grants): the master drops a submitted
    CUDA_VISIBLE_DEVICES, the agent any variable that names GPUs (NVIDIA_VISIBLE_DEVICES
    would widen a container's view)."""
    c = cluster.client()
    wide = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NVIDIA_VISIBLE_DEVICES": "all"}
    dump = "env | grep -E '^(CUDA|NVIDIA)_VISIBLE_DEVICES=' | sort"
    job = c.submit(dump, gpus=1, env=wide | {"PATH": os.environ["PATH"]})
    done = c.wait(job.id, timeout=30)
    assert done["state"] == "completed", done
    (gpu,) = done["allocation"][0]["gpu_ids"]
    assert c.logs(job.id) == f"CUDA_VISIBLE_DEVICES={gpu}\n"


def test_gpu_ids_and_strict_node_gpu_ids(cluster: LocalCluster) -> None:
    c = cluster.client()
    # Hold node002's GPU 1 with a job that waits for a file.
    gate = cluster.root / "gate"
    holder = c.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", node_gpu_ids="node002:1")
    wait_for(lambda: c.show(holder.id)["state"] == "running", what="holder running")
    pinned = c.submit(ENV_DUMP, node_gpu_ids="node002:1,2")
    # Strict: it waits for exactly those GPUs although node001 is idle.
    wait_for(lambda: "waiting" in (c.show(pinned.id)["reason"] or ""), what="pinned waiting")
    assert c.show(pinned.id)["state"] == "queued"
    gate.touch()
    job = c.wait(pinned.id, timeout=30)
    assert job["state"] == "completed"
    assert [(a["node_id"], a["gpu_ids"]) for a in job["allocation"]] == [("node002", [1, 2])]
    assert job_env(cluster, pinned.id)["CUDA_VISIBLE_DEVICES"] == "1,2"

    by_ids = c.submit(ENV_DUMP, gpu_ids="3", nodelist="node001")
    job = c.wait(by_ids.id, timeout=30)
    assert [(a["node_id"], a["gpu_ids"]) for a in job["allocation"]] == [("node001", [3])]


def test_srun_streams_live_and_keeps_streams_apart(cluster: LocalCluster) -> None:
    gate = cluster.root / "gate-srun"
    script = (
        f"echo first; echo oops >&2; while [ ! -e {gate} ]; do sleep 0.05; done; echo last; exit 7"
    )
    proc = start_srun(cluster, "--gpus", "1", "--", "sh", "-c", script)
    try:
        assert proc.stdout is not None
        # The first line arrives while the job is still blocked on the gate.
        assert proc.stdout.readline() == "first\n"
        gate.touch()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert out == "last\n"
    assert err == "oops\n"
    assert proc.returncode == 7


def test_submit_interactive_exit_code_and_output(cluster: LocalCluster) -> None:
    res = cluster.cli("submit", "--interactive", "--gpus", "1", "echo hi; echo e >&2; exit 3")
    assert res.returncode == 3
    assert res.stdout == "hi\n"
    assert res.stderr == "e\n"
    ok = cluster.cli("srun", "--gpus", "0", "--", "true")
    assert ok.returncode == 0, ok.stderr


def test_a_job_killed_by_a_signal_says_so_without_a_shell_line(cluster: LocalCluster) -> None:
    # Killed by SIGKILL: stored as -9 (Python's returncode), told as a shell tells it
    # (137), and no `Killed` line from mgpu's own shell in the job's output.
    res = cluster.cli("submit", "--interactive", "--name", "sigkill", "echo dying; kill -9 $$")
    assert res.returncode == 137, res.stderr
    assert (res.stdout, res.stderr) == ("dying\n", "")
    c = cluster.client()
    job = next(j for j in c.queue(all=True)["jobs"] if j["name"] == "sigkill")
    shown = c.show(job["id"])
    assert (shown["state"], shown["exit_code"]) == ("failed", -9)
    assert shown["reason"] == "killed by signal 9 (SIGKILL)"
    # An exit with 137 is an exit, not a signal's death.
    plain = c.wait(c.submit("echo Killed >&2; exit 137").id, timeout=60)
    assert (plain["state"], plain["exit_code"]) == ("failed", 137)
    assert c.logs(plain["id"]) == "Killed\n"


def test_srun_ctrl_c_cancels_the_job(cluster: LocalCluster) -> None:
    proc = start_srun(cluster, "--name", "ctrlc", "--", "sh", "-c", "echo up; sleep 300")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    c = cluster.client()
    jobs = [j for j in c.queue(all=True)["jobs"] if j["name"] == "ctrlc"]
    assert len(jobs) == 1
    assert c.wait(jobs[0]["id"], timeout=30)["state"] == "cancelled"


def test_cancel_kills_the_whole_process_tree(cluster: LocalCluster) -> None:
    pidfile = cluster.root / "grandchild.pid"
    c = cluster.client()
    job = c.submit(f"sh -c 'sleep 300 & echo $! > {pidfile}; wait' ; true")
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="pid"))
    assert psutil.pid_exists(pid)
    res = cluster.cli("cancel", job.id, check=True)
    assert f"cancelled {job.id}" in res.stdout
    assert c.wait(job.id, timeout=30)["state"] == "cancelled"
    wait_for(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
        what="grandchild gone",
    )
    # Cancelling again is harmless and says so.
    again = cluster.cli("cancel", job.id)
    assert "already ended" in again.stderr


def test_cancel_queued_job(cluster: LocalCluster) -> None:
    c = cluster.client()
    job = c.submit("true", gpus=4, node_gpu_ids="node001:0,1,2,3", dependency=None)
    blocker = c.submit("sleep 300", node_gpu_ids="node002:0")
    waiting = c.submit("true", node_gpu_ids="node002:0")
    wait_for(lambda: c.show(blocker.id)["state"] == "running", what="blocker")
    assert c.show(waiting.id)["state"] == "queued"
    assert c.cancel(waiting.id)["cancelled"] == [waiting.id]
    assert c.show(waiting.id)["state"] == "cancelled"
    c.cancel(blocker.id)
    assert c.wait(blocker.id, timeout=30)["state"] == "cancelled"
    assert c.wait(job.id, timeout=30)["state"] == "completed"


def test_concurrent_submissions_never_double_book(cluster: LocalCluster) -> None:
    """40 jobs from 8 threads on 8 GPUs: no GPU ever runs two jobs at once."""
    ids: list[str] = []
    lock = threading.Lock()

    def submit_some() -> None:
        with Client(cluster.address) as c:
            for _ in range(5):
                job = c.submit("sleep 0.2", gpus=1 + len(ids) % 2)
                with lock:
                    ids.append(job.id)

    threads = [threading.Thread(target=submit_some) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ids) == 40
    c = cluster.client()
    intervals: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for job_id in ids:
        job = c.wait(job_id, timeout=120)
        assert job["state"] == "completed", job
        for a in job["allocation"]:
            for g in a["gpu_ids"]:
                intervals.setdefault((a["node_id"], g), []).append(
                    (job["start_time"], job["end_time"])
                )
    for spans in intervals.values():
        spans.sort()
        for (_s1, e1), (s2, _e2) in itertools.pairwise(spans):
            assert s2 >= e1 - 0.05, f"overlap: {spans}"


def test_queue_show_nodes_json_and_tables(cluster: LocalCluster) -> None:
    c = cluster.client()
    running = c.submit("sleep 300", gpus=2, name="train")
    wait_for(lambda: c.show(running.id)["state"] == "running", what="running")
    q = json.loads(cluster.cli("queue", "--json", check=True).stdout)
    assert set(q) == {"jobs", "nodes"}
    (job,) = [j for j in q["jobs"] if j["id"] == running.id]
    for key in (
        "id",
        "name",
        "user",
        "state",
        "command",
        "gpus",
        "exit_code",
        "reason",
        "allocation",
        "submit_time",
        "start_time",
        "end_time",
        "retries",
        "attempts",
    ):
        assert key in job
    assert {n["node_id"] for n in q["nodes"]} == {"node001", "node002"}
    node = q["nodes"][0]
    for key in ("node_id", "hostname", "ip", "state", "gpus"):
        assert key in node
    assert set(node["gpus"][0]) >= {"index", "name", "memory_mb", "busy_job"}
    busy = [g for n in q["nodes"] for g in n["gpus"] if g["busy_job"] == running.id]
    assert len(busy) == 2

    table = cluster.cli("queue", check=True).stdout
    assert running.id in table_ids(table) and "running" in table and "node001" in table
    assert "FREE" in table and "BUSY" in table

    shown = json.loads(cluster.cli("show", running.id, "--json", check=True).stdout)
    assert shown["id"] == running.id and shown["state"] == "running"
    text = cluster.cli("show", running.id, check=True).stdout
    assert "ran on:" in text and "pid" in text

    nodes = json.loads(cluster.cli("nodes", "--json", check=True).stdout)
    assert len(nodes["nodes"]) == 2
    c.cancel(running.id)
    c.wait(running.id, timeout=30)
    assert running.id not in table_ids(cluster.cli("queue").stdout)  # ids are numbers now:
    assert running.id in table_ids(cluster.cli("queue", "--all").stdout)  # whole cells only


def table_ids(table: str) -> set[str]:
    """The first cell of each row of a table."""
    return {line.split()[0] for line in table.splitlines() if line.strip()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "5", "true"], "no node has 5 GPUs"),
        (["--gpus", "-1", "true"], "--gpus must be greater than or equal to 0"),
        (["--node-gpu-ids", "node009:0", "true"], "node009"),
        (["--node-gpu-ids", "node001:9", "true"], "GPU 9"),
        (["--node-gpu-ids", "node001", "true"], "node001"),
        (["--gpu-ids", "7", "true"], "7"),
        (["--time", "soon", "true"], "soon"),
        (["--dependency", "afterok:deadbeef", "true"], "deadbeef"),
        (["--array", "5-1", "true"], "5-1"),
        (["--nodes", "3", "--gpus-per-node", "1", "true"], "3"),
        (["   "], "empty"),
        (["--gpus", "x", "true"], "invalid int"),
    ],
)
def test_bad_input_is_refused_and_nothing_queued(
    refusing_cluster: LocalCluster, args: list[str], message: str
) -> None:
    cluster = refusing_cluster
    before = len(cluster.client().queue(all=True)["jobs"])
    res = cluster.cli("submit", *args)
    assert res.returncode != 0
    assert res.stderr.startswith("mgpu: error: ")
    assert res.stderr.count("\n") == 1, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert len(cluster.client().queue(all=True)["jobs"]) == before


def test_unreachable_master_is_named_quickly(tmp_path: Path) -> None:
    port = free_port()
    t0 = time.monotonic()
    res = subprocess.run(
        [str(BIN / "mgpu"), "--port", str(port), "queue"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "MGPU_MASTER": ""},
    )
    assert time.monotonic() - t0 < 10
    assert res.returncode != 0
    assert f"127.0.0.1:{port}" in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    env = {**os.environ, "MGPU_MASTER": f"127.0.0.1:{port}"}
    res = subprocess.run(
        [str(BIN / "mgpu"), "nodes"], capture_output=True, text=True, env=env, timeout=30
    )
    assert f"127.0.0.1:{port}" in res.stderr
    with pytest.raises(MgpuError, match=f"127.0.0.1:{port}"):
        Client(f"127.0.0.1:{port}", connect_timeout=1).queue()


def test_python_client_round_trip(cluster: LocalCluster) -> None:
    with Client(cluster.address) as c:
        job = c.submit("python3 -c 'print(6*7)'", gpus=1, name="answer")
        done = c.wait(job.id, timeout=30)
        assert done["state"] == "completed"
        assert c.logs(job.id) == "42\n"
        longer = c.submit(["sleep", "300"], gpus=0)
        wait_for(lambda: c.show(longer.id)["state"] == "running", what="running")
        c.cancel(longer.id)
        assert c.wait(longer.id, timeout=30)["state"] == "cancelled"


def test_failed_job_and_command_not_found(cluster: LocalCluster) -> None:
    c = cluster.client()
    job = c.submit("no-such-command-xyz")
    done = c.wait(job.id, timeout=30)
    assert done["state"] == "failed"
    assert done["exit_code"] == 127
    assert done["retries"] == 0  # a job's own failure is never retried
    assert "not found" in c.logs(job.id)


def test_logs_follow_and_after_the_end(cluster: LocalCluster) -> None:
    c = cluster.client()
    job = c.submit("for i in 1 2 3; do echo $i; sleep 0.1; done")
    res = cluster.cli("logs", "-f", job.id, timeout=30)
    assert res.returncode == 0
    assert res.stdout == "1\n2\n3\n"
    assert cluster.cli("logs", job.id).stdout == "1\n2\n3\n"
    missing = cluster.cli("logs", "00000000")
    assert missing.returncode != 0 and "no such job" in missing.stderr


def test_drain_and_resume(cluster: LocalCluster) -> None:
    c = cluster.client()
    res = cluster.cli("drain", "node001", "--reason", "maintenance", check=True)
    assert "drained" in res.stdout
    jobs = [c.submit("true") for _ in range(3)]
    for j in jobs:
        done = c.wait(j.id, timeout=30)
        assert done["allocation"][0]["node_id"] == "node002"
    nodes = {n["node_id"]: n for n in c.nodes()}
    assert nodes["node001"]["state"] == "drained"
    assert nodes["node001"]["reason"] == "maintenance"
    cluster.cli("resume", "node001", check=True)
    assert {n["node_id"]: n for n in c.nodes()}["node001"]["state"] == "online"


def test_legacy_aliases(cluster: LocalCluster) -> None:
    host, port = cluster.address.split(":")
    env = {**cluster.env, "MGPU_MASTER": ""}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    sub = run(
        str(BIN / "mgpu_client"),
        "--host",
        host,
        "--port",
        port,
        "submit",
        "--gpus",
        "1",
        "echo legacy",
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    q = run(str(BIN / "mgpu_queue"), "--host", host, "--port", port)
    assert q.returncode == 0 and "Nodes:" in q.stdout
    srun = run(str(BIN / "mgpu_srun"), "--host", host, "--port", port, "--", "echo", "ok")
    assert srun.returncode == 0 and srun.stdout == "ok\n"
    Client(cluster.address).wait(job_id, timeout=30)
    can = run(str(BIN / "mgpu_cancel"), "--host", host, "--port", port, job_id)
    assert "already ended" in can.stderr


def test_seed_timeout_options_are_accepted(cluster: LocalCluster) -> None:
    res = cluster.cli(
        "submit",
        "--interactive",
        "--gpus",
        "1",
        "--session-timeout",
        "3600",
        "--max-consecutive-timeouts",
        "60",
        "--connection-timeout",
        "15",
        "--max-wait-time",
        "600",
        "echo fine",
    )
    assert res.returncode == 0 and res.stdout == "fine\n"
    res = cluster.cli("submit", "--interactive", "--session-timeout", "0.5", "sleep 5; echo x")
    assert res.returncode == 124
    assert "keeps running" in res.stderr


def test_master_restart_keeps_queue_and_output(cluster: LocalCluster) -> None:
    c = cluster.client()
    done = c.submit("echo kept")
    c.wait(done.id, timeout=30)
    queued = c.submit("true", node_gpu_ids="node001:0", dependency=f"afterok:{done.id}", time="1")
    assert cluster.master is not None
    cluster.master.send_signal(signal.SIGKILL)
    cluster.master.wait(timeout=10)
    cluster.start_master()
    assert cluster.client().logs(done.id) == "kept\n"
    assert cluster.client().wait(queued.id, timeout=60)["state"] == "completed"


def test_up_and_down(tmp_path: Path) -> None:
    port = free_port()
    state = str(tmp_path / "state")
    # As on the master's own machine: the client finds the owner's admin token there.
    env = {**os.environ, "MGPU_MASTER": f"127.0.0.1:{port}", "MGPU_STATE_DIR": state}
    env.pop("MGPU_TOKEN", None)

    def mgpu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "mgpu"), *args], capture_output=True, text=True, env=env, timeout=60
        )

    try:
        up = mgpu("up", "--port", str(port), "--fake-gpus", "2", "--state-dir", state)
        assert up.returncode == 0, up.stderr
        assert "mgpu down" in up.stdout
        res = mgpu("srun", "--", "echo", "from-up")
        assert res.stdout == "from-up\n"
        nodes = json.loads(mgpu("nodes", "--json").stdout)["nodes"]
        assert len(nodes[0]["gpus"]) == 2
    finally:
        down = mgpu("down", "--state-dir", state)
    assert down.returncode == 0
    assert "stopped" in down.stdout
    assert mgpu("queue").returncode != 0
