"""Job control through the CLI against a real master and agents: hold and release (arrays
too), requeue with the restart count, update of a queued and a running job (its new limit
enforced by the agent), and `--signal` before the time limit and at preemption, caught by
jobs that save a checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import LocalCluster, local_cluster, wait_for
from mgpu import Client

OTHER = "daemon"
"""A real account of every Debian system, standing in for a user who is not an admin."""

# The checkpoint is moved into place: a test waiting for it never reads it half written.
CHECKPOINT = """#!/bin/sh
trap 'date +%s.%N > {ckpt}.time
echo "saved $MGPU_RESTART_COUNT" > {ckpt}.new; mv {ckpt}.new {ckpt}; exit 0' USR1
echo "run $MGPU_RESTART_COUNT"
sleep 60 & wait
"""


def show(c: LocalCluster, job_id: str) -> dict[str, Any]:
    res = c.cli("show", job_id, "--json", check=True)
    return dict(json.loads(res.stdout))


def submit(c: LocalCluster, *args: str) -> str:
    return c.cli("submit", *args, check=True).stdout.strip()


def state_of(c: LocalCluster, job_id: str, state: str, timeout: float = 30) -> dict[str, Any]:
    return wait_for(
        lambda: (j := c.client().show(job_id))["state"] == state and j,
        timeout=timeout,
        what=f"{job_id} {state}",
    )


# ---- hold / release -------------------------------------------------------------------


def test_hold_and_release(cluster: LocalCluster) -> None:
    c = cluster
    job_id = submit(c, "--hold", "--gpus", "0", "echo released")
    assert show(c, job_id)["reason"] == "held"
    assert "held" in c.cli("queue", check=True).stdout
    res = c.cli("release", job_id, check=True)
    assert res.stdout == f"released {job_id}\n"
    state_of(c, job_id, "completed")
    again = c.cli("release", job_id)
    assert (again.returncode, again.stderr) == (0, f"job {job_id} is not held\n")

    queued = submit(c, "--gpus", "0", "--dependency", f"afterok:{job_id}", "--hold", "true")
    res = c.cli("hold", queued)  # held already: said, exit 0
    assert (res.returncode, res.stderr) == (0, f"job {queued} is held already\n")
    running = submit(c, "--gpus", "0", "sleep 60")
    state_of(c, running, "running")
    refused = c.cli("hold", running)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"mgpu: error: job {running} is running; only a queued job can be held "
        f"(mgpu requeue {running} first)\n"
    )
    c.cli("cancel", running, queued, check=True)
    events = [(e["kind"], e["target"]) for e in c.client().audit()]
    assert ("release", job_id) in events
    assert ("hold", queued) not in events  # held already: nothing changed, nothing audited


def test_hold_and_release_every_task_of_an_array(cluster: LocalCluster) -> None:
    c = cluster
    out = c.cli("submit", "--json", "--hold", "--array", "0-3", "--gpus", "0", "true")
    array = json.loads(out.stdout)
    aid = array["job_id"]
    again = c.cli("hold", aid, check=True)  # every task is held already: said, nothing done
    assert again.stdout == "" and again.stderr.count("is held already") == 4
    res = c.cli("release", aid, check=True)
    assert sorted(res.stdout.splitlines()) == [f"released {t}" for t in array["task_ids"]]
    for task in array["task_ids"]:
        state_of(c, task, "completed")
    gone = c.cli("hold", aid)
    assert gone.returncode == 1
    assert gone.stderr == f"mgpu: error: array {aid} has no queued or running task to hold\n"
    assert [e["detail"] for e in c.client().audit() if e["kind"] == "release"] == [
        "every task of the array"
    ]


def test_releasing_an_array_is_all_or_nothing(cluster: LocalCluster) -> None:
    """Issue 25: a user's `mgpu release ARRAY` with one task held by an admin is refused
    whole (403, audited once) and releases none of the tasks the user held."""
    c = cluster
    admin = c.client()
    token = admin.create_token(OTHER)["token"]
    user = Client(c.address, token=token)
    blocker = user.submit("true", gpus=0, hold=True, cwd="/")  # the tasks wait for it
    array = user.submit("true", gpus=0, array="0-9", dependency=f"afterok:{blocker.id}", cwd="/")
    tasks = array.task_ids or []
    admin.hold(tasks[7])  # held by an admin
    user.hold(array.id)  # the others by the user
    refused = c.cli("--token", token, "release", array.id)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"mgpu: error: not authorised: job {tasks[7]} was held by root; only an admin releases it\n"
    )
    assert all(admin.show(t)["reason"] == "held" for t in tasks)
    denied = [e for e in admin.audit() if e["kind"] == "denied" and array.id in e["target"]]
    assert len(denied) == 1, denied
    c.cli("cancel", array.id, blocker.id, check=True)


# ---- requeue ----------------------------------------------------------------------------


def test_requeue_runs_it_again_with_the_restart_count(cluster: LocalCluster) -> None:
    c = cluster
    job_id = submit(c, "--gpus", "1", 'echo "run $MGPU_RESTART_COUNT"; exec sleep 60')
    wait_for(lambda: "run 0" in c.client().logs(job_id), what="the first run")
    res = c.cli("requeue", job_id, check=True)
    assert res.stdout == f"requeueing {job_id}\n"
    wait_for(lambda: "run 1" in c.client().logs(job_id), what="the second run")
    job = show(c, job_id)
    assert (job["state"], job["retries"], job["restart_count"]) == ("running", 0, 1)
    assert len(job["attempts"]) == 2
    assert job["attempts"][0]["end_reason"].startswith("requested by ")
    c.cli("cancel", job_id, check=True)
    queued = submit(c, "--hold", "--gpus", "0", "true")
    res = c.cli("requeue", queued)
    assert (res.returncode, res.stderr) == (
        0,
        f"job {queued} is queued already: nothing to requeue\n",
    )
    c.cli("cancel", queued, check=True)
    ended = c.cli("requeue", job_id)
    assert ended.returncode == 1 and "has ended (cancelled)" in ended.stderr


# ---- update -----------------------------------------------------------------------------


def test_update_a_queued_job_and_refuse_what_submit_refuses(cluster: LocalCluster) -> None:
    c = cluster
    job_id = submit(c, "--hold", "--name", "before", "true")
    res = c.cli("update", job_id, "--gpus", "2", "--priority", "5", "--name", "after", check=True)
    assert res.stdout.startswith(f"updated {job_id}: name before -> after; priority 0 -> 5")
    job = show(c, job_id)
    assert (job["gpus"], job["priority"], job["name"]) == (2, 5, "after")
    impossible = c.cli("update", job_id, "--gpus", "99")
    at_submit = c.cli("submit", "--gpus", "99", "true")
    assert impossible.returncode == at_submit.returncode == 1
    assert impossible.stderr == at_submit.stderr and impossible.stderr.count("\n") == 1
    bad = c.cli("update", job_id, "--time", "soon")
    assert bad.returncode == 1 and "time limit 'soon' is not understood" in bad.stderr
    nothing = c.cli("update", job_id)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    c.cli("release", job_id, check=True)
    assert state_of(c, job_id, "completed")["allocation"][0]["gpu_ids"] != [0]  # 2 GPUs


def test_a_running_jobs_new_time_limit_is_enforced(cluster: LocalCluster) -> None:
    c = cluster
    job_id = submit(c, "--gpus", "0", "--time", "10", "exec sleep 60")
    started = wait_for(lambda: c.client().show(job_id)["start_time"], what="its start")
    c.cli("update", job_id, "--time", "0:03", check=True)
    job = c.client().wait(job_id, timeout=30)
    assert (job["state"], job["time_limit"]) == ("timeout", 3)
    assert 2.5 <= job["end_time"] - started < 15  # 3 s, then SIGTERM ends sleep at once


def test_only_an_admin_raises_a_running_jobs_limit(cluster: LocalCluster) -> None:
    c = cluster
    admin = c.client()
    token = admin.create_token(OTHER)["token"]
    user = Client(c.address, token=token)
    job = user.submit("exec sleep 60", gpus=0, time="1", cwd="/")
    state_of(c, job.id, "running")
    raised = c.cli("--token", token, "update", job.id, "--time", "5")
    assert raised.returncode == 1
    assert raised.stderr == (
        "mgpu: error: not authorised: only an admin may raise the time limit of a running "
        f"job ({job.id} has 00:01:00; asked 00:05:00)\n"
    )
    c.cli("--token", token, "update", job.id, "--time", "0:50", check=True)  # lowered: fine
    c.cli("update", job.id, "--time", "5", check=True)  # the admin may
    assert admin.show(job.id)["time_limit"] == 300
    mine = submit(c, "--hold", "true")
    other = c.cli("--token", token, "update", mine, "--name", "x")
    assert other.returncode == 1 and "not authorised: job" in other.stderr
    events = [e for e in admin.audit() if e["kind"] == "update"]  # the newest first
    assert [e["detail"] for e in reversed(events)] == [
        "time 00:01:00 -> 00:00:50",
        "time 00:00:50 -> 00:05:00",
    ]
    c.cli("cancel", job.id, mine, check=True)


# ---- --signal ---------------------------------------------------------------------------


def test_signal_before_the_time_limit_lets_the_job_save_its_work(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    c = cluster
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "train.sh"
    script.write_text(CHECKPOINT.format(ckpt=ckpt))
    job_id = submit(c, "--gpus", "0", "--time", "0:08", "--signal", "USR1@5", str(script))
    job = c.client().wait(job_id, timeout=40)
    assert (job["state"], job["exit_code"]) == ("completed", 0)  # it left on its own
    assert ckpt.read_text() == "saved 0\n"  # written by the trap, in the job's environment
    when = float(Path(f"{ckpt}.time").read_text()) - job["start_time"]
    # 3 s after the start: never before, and well before the 8 s limit however loaded.
    assert 2.7 <= when <= 7.0, f"signalled {when:.2f} s after the start, not 3"


TOP_ONLY = """#!/bin/sh
sh -c 'trap "echo got > $0; exit 0" USR1; sleep 9 & wait' {out}.child &
child=$!
trap 'echo top > {out}; wait $child; exit 0' USR1
wait
"""


@pytest.mark.parametrize(("spec", "child_got_it"), [("USR1@8", True), ("B:USR1@8", False)])
def test_b_signals_only_the_top_process(
    cluster: LocalCluster, tmp_path: Path, spec: str, child_got_it: bool
) -> None:
    out = tmp_path / "top"
    script = tmp_path / "top.sh"
    script.write_text(TOP_ONLY.format(out=out))
    c = cluster
    # Signalled 3 s after the start: the child's trap is long set, even on a loaded machine.
    job_id = submit(c, "--gpus", "0", "--time", "0:11", "--signal", spec, str(script))
    assert c.client().wait(job_id, timeout=40)["state"] == "completed"
    assert out.read_text() == "top\n"  # the script's own trap, in both cases
    assert Path(f"{out}.child").exists() is child_got_it  # the whole job, or its top only


@pytest.mark.parametrize(
    ("config", "options"),
    [(None, ["--signal", "USR1@20"]), ("scheduling:\n  preempt_signal: USR1@20\n", [])],
    ids=["its own --signal", "the cluster default"],
)
def test_a_preempted_job_gets_its_signal_and_is_requeued_free(
    tmp_path: Path, config: str | None, options: list[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "low.sh"
    script.write_text(CHECKPOINT.format(ckpt=ckpt))
    (tmp_path / "c").mkdir()
    with local_cluster(tmp_path / "c", agents=1, gpus=1, config=config) as c:
        low = submit(c, "--preemptible", *options, str(script))
        wait_for(lambda: "run 0" in c.client().logs(low), what="the low-priority run")
        t0 = time.time()
        high = submit(c, "--priority", "100000", "true")
        wait_for(ckpt.exists, what="the checkpoint")
        assert ckpt.read_text() == "saved 0\n"
        assert float(Path(f"{ckpt}.time").read_text()) - t0 < 10  # at once, not 20 s later
        assert c.client().wait(high, timeout=30)["state"] == "completed"
        wait_for(lambda: "run 1" in c.client().logs(low), what="the low job's second run")
        job = show(c, low)
        assert (job["retries"], job["restart_count"]) == (0, 1)
        assert job["attempts"][0]["end_reason"] == "preempted by higher-priority work"
        c.cli("cancel", low, check=True)
