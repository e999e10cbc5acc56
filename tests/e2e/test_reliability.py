"""Issue 4, reliability: node loss, retries with backoff, agent and master restarts,
time limits, cancel of escaped processes, drain, and a small chaos run.

Real master and agents on loopback (LocalCluster) with short heartbeats.  Every
wait is on an observable condition with a deadline; every process this file
starts, job processes included, is killed at the end by pid or process group.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import LocalCluster, wait_for
from mgpu import MgpuError

BASE = 0.5  # scheduling.retry_backoff_base
GRACE = 1.0  # scheduling.kill_grace
TIMEOUT = 1.5  # networking.timeout, where a test waits for a node to be declared lost
PATIENT = 8.0  # where a restart must come back before it (a loaded machine is slow to start)


def config(timeout: float = TIMEOUT) -> str:
    return f"""
networking:
  heartbeat_interval: 0.2
  timeout: {timeout}
scheduling:
  retry_backoff_base: {BASE}
  retry_backoff_max: 10
  node_failure_threshold: 2
  kill_grace: {GRACE}
"""


# ---- harness ------------------------------------------------------------------


def tagged_pids(tag: str) -> list[int]:
    """Processes started by jobs of one test (their environment carries RELTEST=tag)."""
    want = f"RELTEST={tag}".encode()
    found = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


class Rel:
    """A LocalCluster plus the helpers these tests share."""

    def __init__(self, root: Path, timeout: float = TIMEOUT) -> None:
        self.root = root
        self.c = LocalCluster(root, config(timeout))
        self.tag = str(root)
        self.c.env["RELTEST"] = self.tag  # jobs submitted with the CLI carry it too
        self.gpus: dict[str, int] = {}

    # processes

    def start(self, *nodes: str, gpus: int = 2) -> None:
        if self.c.master is None or self.c.master.poll() is not None:
            self.c.start_master()
        for n in nodes:
            self.start_agent(n, gpus=gpus, wait=False)
        for n in nodes:
            self.c.wait_node(n, "online")

    def start_agent(self, node: str, gpus: int | None = None, wait: bool = True) -> None:
        self.gpus[node] = gpus if gpus is not None else self.gpus.get(node, 2)
        self.c.start_agent(node, gpus=self.gpus[node], wait=wait)

    def kill_agent(self, node: str) -> float:
        """kill -9 the agent alone (its jobs live in their own sessions and go on)."""
        proc = self.c.agents[node]
        t = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return t

    def kill_master(self) -> None:
        assert self.c.master is not None
        os.killpg(self.c.master.pid, signal.SIGKILL)
        self.c.master.wait(timeout=10)

    def wait_disconnected(self, node: str) -> None:
        wait_for(lambda: not self.node(node)["connected"], timeout=30, what=f"{node} disconnected")

    def stop(self) -> None:
        self.c.stop()
        for pid in tagged_pids(self.tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    # queries

    def submit(self, command: str, **options: Any) -> str:
        env = {"RELTEST": self.tag, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return self.c.client().submit(command, env=env, **options).id

    def show(self, job_id: str) -> dict[str, Any]:
        return self.c.client().show(job_id)

    def show_cli(self, job_id: str) -> dict[str, Any]:
        return dict(json.loads(self.c.cli("show", job_id, "--json", check=True).stdout))

    def node(self, node_id: str) -> dict[str, Any]:
        (n,) = [n for n in self.c.client().nodes() if n["node_id"] == node_id]
        return n

    def wait_running(self, job_id: str, timeout: float = 15) -> dict[str, Any]:
        """Until the job runs with a pid (the agent reported the start)."""

        def check() -> dict[str, Any] | None:
            j = self.show(job_id)
            ok = j["state"] == "running" and j["allocation"] and j["allocation"][0]["pid"]
            return j if ok else None

        return wait_for(check, timeout=timeout, what=f"{job_id} running")

    def wait_end(self, job_id: str, timeout: float = 30) -> dict[str, Any]:
        job = self.c.client().wait(job_id, timeout=timeout)
        assert job["state"] not in ("queued", "running"), job
        return job

    def logs(self, job_id: str) -> str:
        return self.c.client().logs(job_id)


@pytest.fixture
def rel(tmp_path: Path) -> Iterator[Rel]:
    r = Rel(tmp_path)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def patient(tmp_path: Path) -> Iterator[Rel]:
    """For restarts that must not be mistaken for a lost node."""
    r = Rel(tmp_path, timeout=PATIENT)
    try:
        yield r
    finally:
        r.stop()


def gated(gate: Path, before: str = "", after: str = "") -> str:
    """A shell snippet that waits (polling) until `gate` exists."""
    return f"{before}while [ ! -e {gate} ]; do sleep 0.02; done;{after}"


def assert_backoff(job: dict[str, Any], base: float = BASE) -> None:
    """Attempt k+1 starts no earlier than base * 2**(k-1) after attempt k ended."""
    attempts = job["attempts"]
    for k, (prev, nxt) in enumerate(itertools.pairwise(attempts), start=1):
        if nxt["start_time"] is None:
            continue
        gap = nxt["start_time"] - prev["end_time"]
        assert gap >= base * 2 ** (k - 1) - 0.02, f"retry {k} after {gap:.3f} s: {attempts}"


# ---- 1. node loss ---------------------------------------------------------------


def test_node_loss_requeues_elsewhere_and_lists_both_attempts(rel: Rel) -> None:
    rel.start("node001", "node002")
    gate = rel.root / "gate"
    job_id = rel.submit(gated(gate, before="echo on $MGPU_NODE_ID;"), name="survivor")
    first = rel.wait_running(job_id)["allocation"][0]["node_id"]
    other = ({"node001", "node002"} - {first}).pop()
    t_kill = rel.kill_agent(first)

    # Observed through the API: the job goes back to the queue (backoff), then runs again.
    states: list[str] = []

    def requeued_and_running() -> bool:
        j = rel.show(job_id)
        if not states or states[-1] != j["state"]:
            states.append(j["state"])
        return j["state"] == "running" and j["allocation"][0]["node_id"] == other

    wait_for(requeued_and_running, timeout=TIMEOUT + 10, interval=0.01, what="rerun")
    assert states[-2:] == ["queued", "running"], states
    offline = rel.node(first)
    assert offline["state"] == "offline"
    assert offline["last_seen"] >= t_kill - 1.0

    gate.touch()
    rel.wait_end(job_id)
    job = rel.show_cli(job_id)
    assert job["state"] == "completed", job
    assert job["retries"] == 1
    a1, a2 = job["attempts"]
    assert a1["nodes"] == [first] and a2["nodes"] == [other]
    assert a1["end_reason"] == f"node {first} lost"
    # Detection waits for the heartbeat timeout, never less.
    assert a1["end_time"] - t_kill >= TIMEOUT - 0.5
    assert a1["start_time"] < a1["end_time"] <= a2["start_time"] < a2["end_time"]
    assert_backoff(job)
    assert job["allocation"][0]["node_id"] == other
    assert f"on {other}\n" in rel.logs(job_id)

    # No retries left: the job fails with the node's loss as its reason.
    res = rel.c.cli("submit", "--retries", "0", gated(gate.with_suffix(".never")), check=True)
    doomed = res.stdout.strip()
    assert rel.wait_running(doomed)["allocation"][0]["node_id"] == other
    rel.kill_agent(other)
    job = rel.wait_end(doomed, timeout=TIMEOUT + 15)
    assert job["state"] == "failed"
    assert f"node {other} lost" in job["reason"]
    assert job["retries"] == 0
    assert [a["end_reason"] for a in job["attempts"]] == [f"node {other} lost"]


# ---- 3. a job's own failure ---------------------------------------------------------


def test_job_failure_is_never_retried(rel: Rel) -> None:
    rel.start("node001")
    three = rel.submit("echo x; exit 3", retries=5)
    missing = rel.submit("no-such-command-rel-xyz", retries=5)
    for job_id, code in ((three, 3), (missing, 127)):
        job = rel.wait_end(job_id)
        assert job["state"] == "failed", job
        assert job["exit_code"] == code
        assert job["reason"] == f"exit code {code}"
        assert job["retries"] == 0
        assert len(job["attempts"]) == 1
    assert rel.node("node001")["failures"] == 0
    assert rel.node("node001")["state"] == "online"


# ---- 2 and 4. launch failures are node failures; backoff; drain after the threshold -----


def test_launch_failure_retries_with_backoff_then_drains_the_node(rel: Rel) -> None:
    rel.start("node001")
    # Break node001 after its agent started: its spool directory becomes a plain file.
    spool = rel.root / "agent-node001" / "node-node001" / "spool"
    assert spool.is_dir()
    shutil.rmtree(spool)
    spool.write_text("not a directory\n")

    job_id = rel.submit("echo ran on $MGPU_NODE_ID", retries=5)

    def failed_once() -> dict[str, Any] | None:
        n = rel.node("node001")
        return n if n["failures"] >= 1 else None

    wait_for(failed_once, timeout=30, what="first launch failure")
    # The job is back in the queue: a node failure, not the job's.
    job = rel.show(job_id)
    assert job["retries"] >= 1 and "could not launch" in job["attempts"][0]["end_reason"]

    # After node_failure_threshold (2) consecutive failures the node drains itself.
    drained = rel.c.wait_node("node001", "drained", timeout=60)
    assert drained["failures"] == 2
    assert "2 consecutive failures" in drained["reason"]
    assert "could not launch the job" in drained["reason"]
    table = rel.c.cli("nodes", check=True).stdout
    assert "drained" in table and "2 consecutive failures" in table

    # The job waits for a healthy node and runs there.
    assert rel.show(job_id)["state"] == "queued"
    rel.start("node002")
    job = rel.wait_end(job_id)
    assert job["state"] == "completed", job
    assert rel.logs(job_id) == "ran on node002\n"
    assert job["retries"] == 2
    assert [a["nodes"] for a in job["attempts"]] == [["node001"], ["node001"], ["node002"]]
    for a in job["attempts"][:2]:
        assert "node001 could not launch the job" in a["end_reason"]
        assert "spool" in a["end_reason"]
    # Exponential: the second retry waited at least twice the base.
    assert_backoff(job)
    assert rel.node("node002")["failures"] == 0


# ---- 5. agent restart -----------------------------------------------------------------


def test_agent_restart_readopts_the_running_job(patient: Rel) -> None:
    rel = patient
    rel.start("node001")
    a, b, mark = rel.root / "a", rel.root / "b", rel.root / "during"
    script = (
        "echo before; echo err-before >&2;"
        + gated(a)
        + f"echo during; touch {mark};"
        + gated(b)
        + "echo after; exit 3"
    )
    job_id = rel.submit(script)
    pid = rel.wait_running(job_id)["allocation"][0]["pid"]
    wait_for(lambda: "before\n" in rel.logs(job_id), what="first line")
    rel.kill_agent("node001")
    rel.wait_disconnected("node001")
    a.touch()  # the job prints while its agent is down
    wait_for(mark.exists, what="the job ran on while the agent was down")
    rel.start_agent("node001")
    assert psutil.pid_exists(pid)
    wait_for(lambda: "during\n" in rel.logs(job_id), what="output written while down")
    b.touch()
    job = rel.wait_end(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 3, job
    assert job["retries"] == 0 and len(job["attempts"]) == 1
    assert rel.logs(job_id) == "before\nerr-before\nduring\nafter\n"
    assert rel.node("node001")["failures"] == 0


# ---- 6. master restart ------------------------------------------------------------------


def test_master_restart_jobs_run_on_and_queue_keeps_its_order(patient: Rel) -> None:
    rel = patient
    rel.start("node001", "node002")
    a, b, mark = rel.root / "a", rel.root / "b", rel.root / "during"
    long_script = (
        "echo one;" + gated(a) + f"echo two; touch {mark};" + gated(b) + "echo three; exit 4"
    )
    long = rel.submit(long_script, node_gpu_ids="node001:0")
    short = rel.submit(gated(a, before="echo s1;", after="echo s2"), node_gpu_ids="node002:0")
    queued = [rel.submit(f"echo q{i}", node_gpu_ids="node001:0") for i in range(4)]
    rel.wait_running(long)
    rel.wait_running(short)
    wait_for(lambda: rel.logs(long) == "one\n" and rel.logs(short) == "s1\n", what="output")

    rel.kill_master()
    a.touch()  # `short` ends and `long` prints while the master is down
    wait_for(mark.exists, what="long job printing while the master is down")
    wait_for(lambda: not tagged_pid_alive(rel, short), what="short job ended")
    rel.c.start_master()
    rel.c.wait_node("node001", "online")
    rel.c.wait_node("node002", "online")

    q = rel.c.client().queue()
    waiting = [j["id"] for j in q["jobs"] if j["state"] == "queued"]
    assert waiting == queued  # still queued, still in submit order
    job = rel.wait_end(short)
    assert job["state"] == "completed" and job["retries"] == 0, job
    assert rel.logs(short) == "s1\ns2\n"
    assert rel.show(long)["state"] == "running"
    b.touch()
    job = rel.wait_end(long)
    assert job["state"] == "failed" and job["exit_code"] == 4 and job["retries"] == 0, job
    assert rel.logs(long) == "one\ntwo\nthree\n"
    starts = [rel.wait_end(j)["start_time"] for j in queued]
    assert starts == sorted(starts)
    assert [rel.logs(j) for j in queued] == [f"q{i}\n" for i in range(4)]


def tagged_pid_alive(rel: Rel, job_id: str) -> bool:
    """Is any process of this job still alive (seen through its MGPU_JOB_ID)?"""
    want = f"MGPU_JOB_ID={job_id}".encode()
    for pid in tagged_pids(rel.tag):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0") and not gone(pid):
                    return True
        except OSError:
            continue
    return False


def kill_job_processes(rel: Rel, job_id: str) -> None:
    want = f"MGPU_JOB_ID={job_id}".encode()
    for pid in tagged_pids(rel.tag):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    wait_for(lambda: not tagged_pid_alive(rel, job_id), what=f"{job_id} killed")


def test_master_restart_requeues_or_fails_jobs_the_agent_no_longer_runs(patient: Rel) -> None:
    rel = patient
    rel.start("node001")
    never = rel.root / "never"
    keep = rel.submit(gated(never), node_gpu_ids="node001:0")  # default retries
    last = rel.submit(gated(never), node_gpu_ids="node001:1", retries=0)
    for j in (keep, last):
        rel.wait_running(j)

    rel.kill_master()
    # node001 is wiped while the master is down: agent, its jobs and their records (it
    # keeps its node secret: without it, it could not join as node001 again).
    rel.kill_agent("node001")
    kill_job_processes(rel, keep)
    kill_job_processes(rel, last)
    shutil.rmtree(rel.root / "agent-node001" / "node-node001" / "spool")

    rel.c.start_master()
    rel.start_agent("node001", wait=False)  # comes back empty-handed
    job = rel.wait_end(last)
    assert job["state"] == "failed", job
    assert job["reason"] == "node001 restarted and no longer runs it"
    # `keep` has retries left: requeued (a retry counted), and runs again on node001.
    job = wait_for(
        lambda: (j := rel.show(keep))["retries"] == 1 and j["attempts"][0]["end_time"] and j,
        what="keep requeued",
    )
    assert job["attempts"][0]["end_reason"] == "node001 restarted and no longer runs it"
    job = rel.wait_running(keep)
    assert [a["nodes"] for a in job["attempts"]] == [["node001"], ["node001"]]
    # One restart that lost two jobs is one node failure, not two.
    assert rel.node("node001")["failures"] == 1


def test_master_restart_requeues_jobs_of_a_node_that_never_returns(rel: Rel) -> None:
    rel.start("node001")
    job_id = rel.submit(gated(rel.root / "never"), retries=3)
    rel.wait_running(job_id)
    rel.kill_master()
    rel.kill_agent("node001")  # dies for good with its job
    kill_job_processes(rel, job_id)
    rel.c.start_master()
    # Loaded as running on a node that is offline and silent: requeued after the timeout.
    job = wait_for(
        lambda: (j := rel.show(job_id))["state"] == "queued" and j,
        timeout=TIMEOUT + 10,
        what="job of a node that never came back requeued",
    )
    assert job["retries"] == 1
    assert job["attempts"][0]["end_reason"] == "node node001 lost", job
    assert rel.node("node001")["state"] == "offline"
    assert rel.node("node001")["jobs"] == []


def test_agent_back_after_being_declared_lost_has_its_stale_run_killed(rel: Rel) -> None:
    rel.start("node001", "node002")
    gate = rel.root / "gate"
    job_id = rel.submit(gated(gate, before="echo on $MGPU_NODE_ID;"))
    job = rel.wait_running(job_id)
    first, pid = job["allocation"][0]["node_id"], job["allocation"][0]["pid"]
    other = ({"node001", "node002"} - {first}).pop()
    wait_for(lambda: rel.logs(job_id) == f"on {first}\n", what="first attempt's output")
    # The agent dies but its job runs on; the master declares the node lost and reruns
    # the job elsewhere (a new epoch).
    rel.kill_agent(first)
    rel.c.wait_node(first, "offline", timeout=TIMEOUT + 10)
    rerun = rel.wait_running(job_id)
    assert rerun["allocation"][0]["node_id"] == other
    assert psutil.pid_exists(pid)
    # Back with the same state dir, the agent re-adopts the old run and reports it: the
    # master does not expect it (stale epoch) and has it killed before anything else.
    rel.start_agent(first)
    wait_for(lambda: gone(pid), what="stale run killed")
    assert rel.show(job_id)["state"] == "running"
    gate.touch()
    job = rel.wait_end(job_id)
    assert job["state"] == "completed" and job["retries"] == 1, job
    assert rel.logs(job_id) == f"on {first}\non {other}\n"  # both attempts' output, once


def test_master_that_lost_its_jobs_kills_their_processes(rel: Rel) -> None:
    rel.start("node001")
    job_id = rel.submit("sleep 300")
    pid = rel.wait_running(job_id)["allocation"][0]["pid"]
    rel.kill_master()
    # The master comes back without its job records (same identity: tokens, CA).
    db = sqlite3.connect(rel.c.state_dir / "mgpu.db")
    with db:
        db.execute("DELETE FROM jobs")
    db.close()
    rel.c.start_master()
    # The agent reconnects and reports a process the master has never heard of: killed.
    wait_for(lambda: gone(pid), what="unknown job killed")
    wait_for(lambda: not tagged_pid_alive(rel, job_id), what="its processes too")
    with pytest.raises(MgpuError, match="no such job"):
        rel.show(job_id)


# ---- 7. time limits ----------------------------------------------------------------------


def test_time_limit_sigterm_grace_sigkill(rel: Rel) -> None:
    rel.start("node001")
    plain = rel.c.cli("submit", "--time", "0:02", "echo start; sleep 30", check=True)
    stubborn_script = "trap 'echo got TERM' TERM; echo start; while :; do sleep 0.05; done"
    stubborn = rel.c.cli("submit", "--time", "0:02", stubborn_script, check=True)
    p, s = plain.stdout.strip(), stubborn.stdout.strip()
    for job_id in (p, s):
        job = rel.wait_end(job_id, timeout=20)
        assert job["state"] == "timeout", job
        assert job["reason"] == "time limit reached"
        assert job["retries"] == 0
    jp, js = rel.show(p), rel.show(s)
    ran_p = jp["end_time"] - jp["start_time"]
    ran_s = js["end_time"] - js["start_time"]
    assert 2.0 <= ran_p < 2.0 + GRACE - 0.2, ran_p  # ended at SIGTERM, before the grace
    assert ran_s >= 2.0 + GRACE - 0.05, ran_s  # ignored SIGTERM: killed after the grace
    assert ran_s < 2.0 + GRACE + 2.0, ran_s
    assert rel.logs(s).startswith("start\n") and "got TERM\n" in rel.logs(s)
    wait_for(lambda: not tagged_pid_alive(rel, s), what="stubborn job gone")


# ---- 8. cancel reaches escaped processes -------------------------------------------------------


def test_cancel_kills_setsid_grandchildren(rel: Rel) -> None:
    rel.start("node001")
    child, orphan = rel.root / "child.pid", rel.root / "orphan.pid"
    script = (
        # a child in a new session (still a descendant) ...
        f"setsid sh -c 'echo $$ > {child}; exec sleep 300' &"
        # ... and a double-forked one in a new session (reparented away from the job)
        f" (setsid sh -c 'echo $$ > {orphan}; exec sleep 300' &) ;"
        " wait"
    )
    job_id = rel.submit(script)
    pids = []
    for f in (child, orphan):
        pids.append(int(wait_for(lambda f=f: f.exists() and f.read_text().strip(), what="pid")))
    for pid in pids:
        assert psutil.pid_exists(pid)
        assert os.getsid(pid) == pid  # really escaped the job's session
    rel.c.cli("cancel", job_id, check=True)
    assert rel.wait_end(job_id)["state"] == "cancelled"
    for pid in pids:
        wait_for(lambda pid=pid: gone(pid), what=f"escaped pid {pid} killed")


# ---- 9. drain ----------------------------------------------------------------------------------


def test_drain_lets_running_jobs_finish_and_resume_reopens(rel: Rel) -> None:
    rel.start("node001", "node002")
    gate = rel.root / "gate"
    running = rel.submit(gated(gate, after="echo done"), nodelist="node001")
    rel.wait_running(running)
    rel.c.cli("drain", "node001", "--reason", "disk swap", check=True)
    node = rel.node("node001")
    assert node["state"] == "draining" and node["reason"] == "disk swap"
    assert rel.show(running)["state"] == "running"
    elsewhere = rel.submit("echo hi")
    assert rel.wait_end(elsewhere)["allocation"][0]["node_id"] == "node002"
    assert rel.node("node001")["state"] == "draining"
    gate.touch()
    job = rel.wait_end(running)
    assert job["state"] == "completed" and rel.logs(running) == "done\n"
    wait_for(lambda: rel.node("node001")["state"] == "drained", what="drained")
    assert "disk swap" in rel.c.cli("nodes", check=True).stdout
    rel.c.cli("resume", "node001", check=True)
    assert rel.node("node001")["state"] == "online"
    back = rel.submit("true", nodelist="node001")
    assert rel.wait_end(back)["state"] == "completed"


# ---- 10. chaos ----------------------------------------------------------------------------------


def test_chaos_master_and_agent_killed_no_job_lost_or_doubled(patient: Rel) -> None:
    rel = patient
    nodes = ("node001", "node002", "node003")
    rel.start(*nodes)
    locks = rel.root / "locks"
    locks.mkdir()
    doubles = rel.root / "doubles"
    # Each job proves it is the only copy running (a lock the kernel drops when the holder
    # dies), and tags its output with its shim's pid: the allocation's pid of that attempt.
    script = (
        f"exec 9>{locks}/$MGPU_JOB_ID; flock -n 9 || echo $MGPU_JOB_ID >> {doubles};"
        " echo out-$MGPU_JOB_ID-$PPID; sleep 0.5"
    )
    n_jobs = 60
    ids = [rel.submit(script, gpus=1) for _ in range(n_jobs)]
    client = rel.c.client()

    def count(state: str) -> int:
        return sum(1 for j in client.queue(all=True)["jobs"] if j["state"] == state)

    # Kill the master once some jobs are done, while others run.
    wait_for(lambda: count("completed") >= 10, timeout=30, what="10 done")
    rel.kill_master()
    rel.c.start_master()
    for n in nodes:
        rel.c.wait_node(n, "online")
    # Kill an agent that runs jobs; bring it back before the heartbeat timeout.
    victim = wait_for(
        lambda: next((n for n in nodes if rel.node(n)["jobs"]), None),
        timeout=30,
        what="a busy node",
    )
    rel.kill_agent(victim)
    rel.wait_disconnected(victim)
    rel.start_agent(victim)

    jobs = client.wait_all(ids, timeout=60)
    states = {j["id"]: j["state"] for j in jobs}
    assert set(states.values()) == {"completed"}, states
    assert not doubles.exists(), doubles.read_text()
    for j in jobs:
        spans = sorted((a["start_time"], a["end_time"]) for a in j["attempts"] if a["start_time"])
        for (_s1, e1), (s2, _e2) in itertools.pairwise(spans):
            assert s2 >= e1, f"{j['id']} ran twice at once: {j['attempts']}"
        pid = j["allocation"][0]["pid"]
        assert rel.logs(j["id"]) == f"out-{j['id']}-{pid}\n", j


# ---- 8. a stop survives an agent restart (issue 25 item 8) ------------------------------


@pytest.mark.parametrize("how", ["requeue", "cancel"])
def test_a_stop_interrupted_by_an_agent_restart_stays_that_stop(patient: Rel, how: str) -> None:
    """`mgpu requeue` (or cancel) of a job that traps TERM, its agent killed with SIGKILL
    during the kill grace and restarted: requeued without a retry (cancelled), never
    failed, and the node is charged nothing."""
    rel = patient
    rel.start("node001")
    termed = rel.root / "termed"
    script = f"trap 'touch {termed}' TERM; echo up; while true; do sleep 0.05; done"
    job_id = rel.submit(script, retries=0)
    rel.wait_running(job_id)
    wait_for(lambda: "up\n" in rel.logs(job_id), what="the job runs")
    getattr(rel.c.client(), how)(job_id)
    wait_for(termed.exists, what="the job got TERM")  # the grace (GRACE s) has begun
    rel.kill_agent("node001")
    rel.wait_disconnected("node001")
    rel.start_agent("node001")
    if how == "cancel":
        job = rel.wait_end(job_id)
        assert job["state"] == "cancelled", job
    else:
        job = wait_for(
            lambda: (j := rel.show(job_id))["restart_count"] == 1 and j,
            what="the job requeued",
        )
        assert job["state"] in ("queued", "running"), job
        assert job["attempts"][0]["end_reason"] == "requested by root"
    assert job["retries"] == 0, job
    assert rel.node("node001")["failures"] == 0
