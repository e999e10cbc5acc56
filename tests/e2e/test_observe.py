"""Observability end to end: GPU telemetry, metrics, accounting, foreign use, idle jobs,
`mgpu top`, `mgpu node --health`, shell completion and srun's waiting status.

One cluster serves the whole module: node001 (2 simulated GPUs) and node002 (2 simulated
GPUs, GPU 0 used outside mgpu through --fake-foreign).  Every job is pinned to GPUs so
that tests do not depend on placement.
"""

from __future__ import annotations

import json
import os
import pty
import pwd
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, free_port, wait_for
from mgpu import Client

CONFIG = """
networking: {heartbeat_interval: 0.25, timeout: 10}
scheduling:
  idle_after_minutes: 0.02
  idle_action: cancel
  foreign_memory_threshold_mb: 1024
"""
IDLE_MINUTES = "0.02"


def two_users() -> tuple[str, str]:
    """Users to submit as.  An agent running as root starts jobs as their user, so then
    they must be real accounts."""
    if os.geteuid() != 0:
        return "alice", "bob"
    names = {p.pw_name: p.pw_uid for p in pwd.getpwall()}
    picked = [n for n in ("alice", "bob", "daemon", "nobody") if names.get(n, 0) > 0]
    if len(picked) < 2:
        pytest.skip("needs two non-root accounts on this machine to run jobs as")
    return picked[0], picked[1]


@pytest.fixture(scope="module")
def obs() -> Iterator[LocalCluster]:
    # Not pytest's tmp dir: that is private to root, and jobs run as other users here.
    root = Path(tempfile.mkdtemp(prefix="mgpu-observe-"))
    root.chmod(0o755)
    cluster = LocalCluster(root, CONFIG)
    try:
        cluster.start_master()
        cluster.start_agent("node001", gpus=2)
        cluster.start_agent("node002", gpus=2, extra=["--fake-foreign", "0:4096"])
        wait_for(lambda: all(telemetry(cluster, n, 1) for n in ("node001", "node002")))
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def node(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    nodes = json.loads(cluster.cli("nodes", "--json", check=True).stdout)["nodes"]
    return next(n for n in nodes if n["node_id"] == node_id)


def telemetry(cluster: LocalCluster, node_id: str, gpu: int) -> dict[str, Any] | None:
    tel: dict[str, Any] | None = node(cluster, node_id)["gpus"][gpu]["telemetry"]
    return tel


def fake_file(cluster: LocalCluster, node_id: str) -> Path:
    return cluster.root / f"agent-{node_id}" / f"node-{node_id}" / "fake-telemetry.json"


def submit(cluster: LocalCluster, command: str, where: str, *extra: str) -> str:
    res = cluster.cli("submit", "--node-gpu-ids", where, *extra, command, check=True)
    return res.stdout.strip()


def state(cluster: LocalCluster, job_id: str) -> str:
    return str(cluster.client().show(job_id)["state"])


# ---- telemetry ----------------------------------------------------------------


def test_telemetry_in_nodes_and_jobs(obs: LocalCluster) -> None:
    for n in ("node001", "node002"):
        for g in node(obs, n)["gpus"]:
            tel = g["telemetry"]
            assert tel["simulated"] is True
            assert tel["memory_total_mb"] == 81920
            assert 0 <= tel["utilization_pct"] <= 100
            assert tel["temperature_c"] > 0
    job = submit(obs, "sleep 30", "node001:1")
    try:
        # A GPU held by a job looks loaded; its neighbour stays idle.
        wait_for(lambda: (telemetry(obs, "node001", 1) or {}).get("utilization_pct", 0) >= 70)
        assert telemetry(obs, "node001", 0)["utilization_pct"] < 5  # type: ignore[index]
        text = obs.cli("nodes", check=True).stdout
        header = text.splitlines()[0].split()
        assert "UTIL" in header and "MEM" in header
        line = next(row for row in text.splitlines() if row.startswith("node001"))
        assert "%" in line and "/160G" in line

        def sampled() -> dict[str, Any] | None:
            shown = obs.client().show(job)
            return shown if (shown.get("gpu_util_mean") or 0) >= 70 else None

        shown = wait_for(sampled, what="job GPU use")
        assert shown["gpu_memory_peak_mb"] > 1000
        assert shown["idle"] is False
    finally:
        obs.client().cancel(job)
    ended = obs.client().wait(job, timeout=20)
    assert ended["state"] == "cancelled"
    # Kept with the finished job.
    assert ended["gpu_util_mean"] >= 70 and ended["gpu_memory_peak_mb"] > 1000


def test_foreign_use_keeps_the_gpu_free(obs: LocalCluster) -> None:
    gpu0 = node(obs, "node002")["gpus"][0]
    assert gpu0["telemetry"]["foreign_memory_mb"] == 4096
    assert gpu0["foreign_blocked"] is True
    assert node(obs, "node002")["gpus"][1]["foreign_blocked"] is False
    text = obs.cli("nodes", check=True).stdout
    assert "GPU 0 is used outside mgpu (4.0 GiB)" in text
    line = next(row for row in text.splitlines() if row.startswith("node002"))
    assert line.split()[3] == "1"  # FREE: only GPU 1
    job = submit(obs, "echo ran", "node002:0")
    try:
        # Who uses it: the job waiting for it says so in queue and show, as nodes does.
        bob = {"mb": 3072, "pid": 679, "user": "bob"}
        fake_file(obs, "node002").write_text(json.dumps({"foreign": {"0": bob}}))
        said = "node002 GPU 0 is used outside mgpu (3.0 GiB, pid 679, user bob)"
        wait_for(lambda: said in (obs.client().show(job)["reason"] or ""), what="its reason")
        assert obs.client().show(job)["reason"] == f"waiting for GPU 0 on node002: {said}"
        assert state(obs, job) == "queued"
        assert said in obs.cli("show", job, check=True).stdout
        assert said in obs.cli("queue", check=True).stdout
        assert said.removeprefix("node002 ") in obs.cli("nodes", check=True).stdout
        # The outside use stops: the GPU is offered again and the job runs.
        fake_file(obs, "node002").write_text(json.dumps({"foreign": {}}))
        assert obs.client().wait(job, timeout=20)["state"] == "completed"
        assert node(obs, "node002")["gpus"][0]["foreign_blocked"] is False
    finally:
        obs.client().cancel(job)
        fake_file(obs, "node002").unlink(missing_ok=True)
    wait_for(lambda: node(obs, "node002")["gpus"][0]["foreign_blocked"], what="blocked again")


def test_idle_jobs_are_flagged_and_idle_interactive_jobs_cancelled(obs: LocalCluster) -> None:
    batch = submit(obs, "sleep 60", "node001:0", "--name", "idle-batch")
    srun = subprocess.Popen(
        [str(BIN / "mgpu"), "srun", "--node-gpu-ids", "node001:1", "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=obs.env,
    )
    try:
        c = obs.client()
        wait_for(lambda: state(obs, batch) == "running", what="batch running")
        inter = wait_for(
            lambda: next(
                (j for j in c.queue()["jobs"] if j.get("allocation") and j["id"] != batch), None
            ),
            what="srun job running",
        )["id"]
        time.sleep(0.6)
        assert c.show(batch)["idle"] is False  # loaded GPUs: not idle
        fake_file(obs, "node001").write_text(json.dumps({"util": 0}))
        wait_for(lambda: c.show(batch)["idle"], timeout=30, what="idle flag")
        listed = {j["id"]: j for j in json.loads(obs.cli("queue", "--json").stdout)["jobs"]}
        assert listed[batch]["idle"] is True
        assert "idle:" in obs.cli("show", batch, check=True).stdout
        assert "running (idle)" in obs.cli("queue", check=True).stdout
        # idle_action: cancel applies to interactive jobs only.
        _, err = srun.communicate(timeout=20)
        assert srun.returncode != 0
        ended = c.show(inter)
        assert ended["state"] == "cancelled"
        assert ended["reason"] == f"idle for {IDLE_MINUTES} minutes"
        assert f"idle for {IDLE_MINUTES} minutes" in err
        assert state(obs, batch) == "running"
        # Busy again: the flag goes away.
        fake_file(obs, "node001").unlink()
        wait_for(lambda: not c.show(batch)["idle"], timeout=30, what="idle flag cleared")
    finally:
        fake_file(obs, "node001").unlink(missing_ok=True)
        srun.kill()
        srun.wait()
        obs.client().cancel(batch)
        obs.client().wait(batch, timeout=20)


# ---- accounting -----------------------------------------------------------------


def test_history_and_report(obs: LocalCluster) -> None:
    u1, u2 = two_users()
    admin = obs.client()
    tokens = {u: admin.create_token(u)["token"] for u in (u1, u2)}
    clients = {u: Client(obs.address, token=t) for u, t in tokens.items()}
    cwd = str(obs.root)
    ids = [
        clients[u1].submit("sleep 0.4", node_gpu_ids="node001:0,1", cwd=cwd).id,
        clients[u1].submit("sleep 0.2", node_gpu_ids="node002:1", cwd=cwd).id,
        clients[u2].submit("sleep 0.2; exit 3", node_gpu_ids="node001:1", cwd=cwd).id,
    ]
    jobs = {j["id"]: j for j in admin.wait_all(ids, timeout=30)}
    assert [jobs[i]["state"] for i in ids] == ["completed", "completed", "failed"]

    def hours(j: dict[str, Any]) -> float:
        return float(j["gpus"] * (j["end_time"] - j["start_time"]) / 3600)

    def wait_of(j: dict[str, Any]) -> float:
        return float(j["start_time"] - j["submit_time"])

    out = obs.cli("history", "--user", u1, "--json", check=True)
    rows = {r["id"]: r for r in json.loads(out.stdout)["jobs"]}
    assert set(rows) == set(ids[:2])
    for i in ids[:2]:
        assert rows[i]["user"] == u1 and rows[i]["state"] == "completed"
        assert rows[i]["gpu_hours"] == pytest.approx(hours(jobs[i]), abs=1e-5)
        assert rows[i]["runtime"] == pytest.approx(jobs[i]["end_time"] - jobs[i]["start_time"])
        assert rows[i]["exit_code"] == 0
    assert rows[ids[0]]["nodes"] == ["node001"] and rows[ids[0]]["gpus"] == 2
    failed = json.loads(obs.cli("history", "--user", u2, "--state", "failed", "--json").stdout)
    assert [(r["id"], r["exit_code"]) for r in failed["jobs"]] == [(ids[2], 3)]
    text = obs.cli("history", "--user", u1, check=True).stdout
    assert ids[0] in text and "GPU-H" in text and "2 job(s)" in text

    report = json.loads(obs.cli("report", "--by", "user", "--json", check=True).stdout)
    by_user = {r["key"]: r for r in report["rows"]}
    r1, r2 = by_user[u1], by_user[u2]
    assert (r1["jobs"], r1["completed"], r1["success_rate"]) == (2, 2, 1.0)
    assert (r2["jobs"], r2["failed"], r2["success_rate"]) == (1, 1, 0.0)
    assert r1["gpu_hours"] == pytest.approx(hours(jobs[ids[0]]) + hours(jobs[ids[1]]), abs=1e-5)
    waits = [wait_of(jobs[i]) for i in ids[:2]]
    assert r1["mean_wait"] == pytest.approx(sum(waits) / 2, abs=1e-3)
    assert r1["p90_wait"] == pytest.approx(max(waits), abs=1e-3)  # nearest rank of two
    assert r2["p90_wait"] == pytest.approx(wait_of(jobs[ids[2]]), abs=1e-3)

    csv = obs.cli("report", "--by", "user", "--csv", check=True).stdout.splitlines()
    assert (
        csv[0] == "user,jobs,completed,failed,cancelled,gpu_hours,success_rate,mean_wait,p90_wait"
    )
    assert any(line.startswith(f"{u2},1,0,1,0,") for line in csv)
    text = obs.cli("report", check=True).stdout
    assert "GPU-HOURS" in text and "TOTAL" in text and u1 in text

    by_node = json.loads(obs.cli("report", "--by", "node", "--json", check=True).stdout)
    node_hours = sum(r["gpu_hours"] for r in by_node["rows"])
    assert node_hours == pytest.approx(by_node["total"]["gpu_hours"], abs=1e-5)
    assert {"node001", "node002"} <= {r["key"] for r in by_node["rows"]}

    bad = obs.cli("history", "--since", "last tuesday")
    assert bad.returncode == 1
    assert bad.stderr.startswith("mgpu: error: --since 'last tuesday' is not a duration")
    assert obs.cli("report", "--json", "--csv").returncode == 2


def test_metrics(obs: LocalCluster) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    ok = submit(obs, "true", "node002:1")
    bad = submit(obs, "exit 4", "node002:1")
    obs.client().wait_all([ok, bad], timeout=30)
    holder = submit(obs, "sleep 30", "node001:0")
    try:
        wait_for(lambda: (telemetry(obs, "node001", 0) or {}).get("utilization_pct", 0) >= 70)
        import urllib.request

        with urllib.request.urlopen(f"http://{obs.address}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        obs.client().cancel(holder)
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    samples = [s for f in fam.values() for s in f.samples]

    def value(name: str, **labels: str) -> float:
        for s in samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise AssertionError(f"no sample {name} {labels}")

    assert value("mgpu_jobs", state="running") >= 1
    assert value("mgpu_jobs", state="completed") >= 1
    assert value("mgpu_jobs", state="failed") >= 1
    assert value("mgpu_nodes", state="online") == 2
    assert value("mgpu_gpus", state="foreign") == 1
    assert value("mgpu_job_queue_wait_seconds_count") >= 3
    assert value("mgpu_job_runtime_seconds_count") >= 2
    assert fam["mgpu_job_runtime_seconds"].type == "histogram"
    assert value("mgpu_jobs_started_total") >= 3
    assert value("mgpu_jobs_failed_total") >= 1
    assert value("mgpu_scheduler_pass_seconds") >= 0
    assert value("mgpu_gpu_utilization_percent", node="node001", gpu="0") >= 70
    for n in ("node001", "node002"):
        for g in ("0", "1"):
            assert value("mgpu_gpu_memory_used_bytes", node=n, gpu=g) >= 0
            assert value("mgpu_gpu_memory_total_bytes", node=n, gpu=g) == 81920 * 2**20
    assert value("mgpu_gpu_foreign_memory_bytes", node="node002", gpu="0") == 4096 * 2**20
    assert value("mgpu_gpu_allocated", node="node001", gpu="0") == 1


# ---- terminal views and tools --------------------------------------------------------


def test_top_once(obs: LocalCluster) -> None:
    job = submit(obs, "sleep 30", "node001:1", "--name", "topjob")
    try:
        wait_for(lambda: state(obs, job) == "running")
        res = obs.cli("top", "--once", check=True)
    finally:
        obs.client().cancel(job)
    out = res.stdout
    for word in ("mgpu top", "node001", "node002", job, "topjob", "busy", "foreign", "Queue"):
        assert word in out, word
    assert res.stderr == ""


def test_node_health(obs: LocalCluster, tmp_path: Path) -> None:
    base = ["node", "--node-id", "hc001", "--fake-gpus", "2", "--health"]
    good = obs.cli(*base, "--master-port", str(obs.port), "--state-dir", str(tmp_path))
    assert good.returncode == 0, good.stdout
    lines = good.stdout.splitlines()
    assert lines[0].startswith("ok    GPUs visible: 2 simulated GPU(s)")
    assert lines[1].startswith("ok    spool writable:")
    assert lines[2].startswith(f"ok    master reachable: 127.0.0.1:{obs.port}")
    assert (tmp_path / "node-hc001" / "spool").is_dir()

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = obs.cli(*base, "--master-port", str(free_port()), "--state-dir", str(blocker / "x"))
    assert bad.returncode == 1
    assert "FAIL  spool writable" in bad.stdout
    assert "FAIL  master reachable" in bad.stdout
    assert "2 check(s) failed" in bad.stdout


def _complete(script: str, *words: str) -> list[str]:
    prog = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _mgpu; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_completion(obs: LocalCluster) -> None:
    bash = obs.cli("completion", "bash", check=True).stdout
    assert "complete -o default -F _mgpu mgpu mgpu_client" in bash
    assert _complete(bash, "mgpu", "rep") == ["report"]
    assert {"history", "top", "completion", "submit"} <= set(_complete(bash, "mgpu", ""))
    assert _complete(bash, "mgpu", "report", "--by", "") == ["user", "node"]
    assert set(_complete(bash, "mgpu", "--host", "h", "submit", "--gpu-")) == {
        *("--gpu-ids", "--gpu-type", "--gpu-share")  # --gpu-share: listed before it lands
    }
    assert _complete(bash, "mgpu", "completion", "z") == ["zsh"]
    zsh = obs.cli("completion", "zsh", check=True).stdout
    assert zsh.startswith("#compdef mgpu mgpu_client")
    assert "'report:GPU-hours, jobs, success rate and waits per user or node'" in zsh
    assert "'--by[]:by:(user node)'" in zsh
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n"], input=zsh, text=True, check=True)
    bad = obs.cli("completion", "fish")
    assert bad.returncode == 2 and bad.stderr.startswith("mgpu: error:")


# ---- srun while queued -----------------------------------------------------------------


def _read_pty(fd: int, until: float) -> bytes:
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def test_srun_shows_queue_position_while_waiting(obs: LocalCluster, tmp_path: Path) -> None:
    holder = submit(obs, "sleep 60", "node002:1")
    wait_for(lambda: state(obs, holder) == "running")
    argv = [str(BIN / "mgpu"), "srun", "--node-gpu-ids", "node002:1"]
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    said = tmp_path / "verbose.err"  # read as it grows: the holder goes once it is there
    with said.open("w") as err:
        verbose = subprocess.Popen(
            [*argv, "-v", "--", "echo", "verbose"],
            env=obs.env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    plain = subprocess.Popen([*argv, "--", "echo", "plain"], env=obs.env, **pipes)
    master_fd, slave_fd = pty.openpty()
    tty = subprocess.Popen(
        [*argv, "--", "echo", "tty"], stdout=subprocess.PIPE, stderr=slave_fd, env=obs.env
    )
    os.close(slave_fd)
    try:
        wait_for(lambda: sum(j["state"] == "queued" for j in obs.client().queue()["jobs"]) >= 3)
        # The position first, then the scheduler's reason once a pass has seen the job.
        wait_for(lambda: "waiting for" in said.read_text(), timeout=60, what="the reason")
        seen = b""
        deadline = time.monotonic() + 60
        while b"queued (position " not in seen and time.monotonic() < deadline:
            seen += _read_pty(master_fd, time.monotonic() + 0.5)
        obs.client().cancel(holder)
        v_out, _ = verbose.communicate(timeout=30)
        p_out, p_err = plain.communicate(timeout=30)
        t_out, _ = tty.communicate(timeout=30)
        seen += _read_pty(master_fd, time.monotonic() + 0.5)
    finally:
        os.close(master_fd)
        for p in (verbose, plain, tty):
            if p.poll() is None:
                p.kill()
                p.wait()
    v_err = said.read_text()
    assert (v_out, p_out, t_out) == ("verbose\n", "plain\n", b"tty\n")
    assert "queued (position " in v_err and "waiting for" in v_err
    assert p_err == ""  # not a terminal and not verbose: stderr stays clean
    screen = seen.decode(errors="replace")
    assert "\r\x1b[K" in screen and "queued (position " in screen
    assert "\n" not in screen  # one line, rewritten in place


# ---- pure pieces, in process ---------------------------------------------------------


def test_accounting_arithmetic() -> None:
    from factories import master_job
    from mgpu.master.monitor.observe import BadQuery, parse_since, percentile, utilisation_series
    from mgpu.model import Attempt, Job, JobState

    now = 1_000_000.0
    assert parse_since("7d", now) == now - 7 * 86400
    assert parse_since("90m", now) == now - 90 * 60
    assert parse_since("2", now) == now - 2 * 86400  # a bare number is days
    assert parse_since("1700000000", now) == 1_700_000_000
    with pytest.raises(BadQuery):
        parse_since("soon", now)
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == 9.0
    assert percentile([], 90) is None

    def job(start: float, end: float | None, gpus: int) -> Job:
        j = master_job("j", gpus=gpus)
        j.state = JobState.COMPLETED if end is not None else JobState.RUNNING
        j.attempts = [Attempt(1, ["n1"], {"n1": list(range(gpus))}, start, end)]
        return j

    # [0, 100) in four 25 s buckets, 4 GPUs: a 2-GPU job over 10..40, a 1-GPU one
    # running throughout, and measured samples in the last bucket.
    series = utilisation_series(
        [job(10, 40, 2), job(-50, None, 1)], 0, 100, 4, 4, [(80.0, 50.0), (90.0, 70.0)]
    )
    assert [p["allocated"] for p in series["points"]] == [2.2, 2.2, 1.0, 1.0]
    assert series["points"][0]["allocated_pct"] == 55.0
    assert [p["measured_pct"] for p in series["points"]] == [None, None, None, 60.0]
