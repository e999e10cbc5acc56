"""Slurm's steps end to end: `srun` inside a job (a batch job, an allocation) runs tasks on
the job's nodes, never a new job (master/control/srun.py, mgpu/client/steps.py).

`srun` here is a small stand-in for Slurm's command (mgpu.slurm.srun parses its options and
is tested apart), put on the job's PATH: it calls `mgpu.client.steps.run_step` as that
command does inside a job. A batch job is submitted through the API with a `slurm` block."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import BIN, LocalCluster, wait_for
from mgpu.client.api import Client, RequestError, SubmittedJob

SRUN = f"""#!{sys.executable}
import argparse, sys
from mgpu.client.steps import StepOptions, run_step

p = argparse.ArgumentParser(prog="srun")
p.add_argument("-N", "--nodes", type=int)
p.add_argument("-n", "--ntasks", type=int)
p.add_argument("--ntasks-per-node", type=int)
p.add_argument("-w", "--nodelist")
p.add_argument("--gpus-per-task", type=int)
p.add_argument("-l", "--label", action="store_true")
p.add_argument("-K", "--kill-on-bad-exit", action="store_true")
p.add_argument("--pty", action="store_true")
p.add_argument("argv", nargs=argparse.REMAINDER)
a = p.parse_args()
options = StepOptions(
    nodes=a.nodes, ntasks=a.ntasks, ntasks_per_node=a.ntasks_per_node, nodelist=a.nodelist,
    gpus_per_task=a.gpus_per_task, label=a.label, kill_on_bad_exit=a.kill_on_bad_exit,
    pty=a.pty,
)
sys.exit(run_step(a.argv, options))
"""


@pytest.fixture
def env(cluster: LocalCluster, tmp_path: Path) -> dict[str, str]:
    """The cluster's environment with `srun` (and `mgpu`) first on PATH."""
    shims = tmp_path / "shims"
    shims.mkdir()
    srun = shims / "srun"
    srun.write_text(SRUN)
    srun.chmod(0o755)
    return {**cluster.env, "PATH": f"{shims}:{BIN}:{cluster.env.get('PATH', '')}"}


def _submit(client: Client, script: str, **options: Any) -> SubmittedJob:
    return client.submit_script(script, name="batch", **options)


def _batch(
    cluster: LocalCluster, env: dict[str, str], script: str, **slurm: Any
) -> tuple[str, dict[str, Any], str]:
    """Run `script` as a 2-node batch job (2 GPUs a node): its id, its end, its output."""
    client = cluster.client()
    job = _submit(client, script, nodes=2, gpus_per_node=2, env=env, slurm={"batch": True, **slurm})
    end = client.wait(job.id, timeout=90)
    return job.id, end, client.logs(job.id)


def test_a_batch_script_runs_once_and_its_sruns_run_tasks_on_every_node(
    cluster: LocalCluster, env: dict[str, str]
) -> None:
    script = """#!/bin/sh
echo "script on $MGPU_NODE_ID"
srun -l sh -c 'echo "task $SLURM_PROCID of $SLURM_NTASKS on $MGPU_NODE_ID node $SLURM_NODEID \
local $SLURM_LOCALID step $SLURM_STEP_ID gpus $CUDA_VISIBLE_DEVICES $SLURMD_NODENAME"'
srun --gpus-per-task 1 sh -c 'echo "own $SLURM_PROCID $CUDA_VISIBLE_DEVICES"'
"""
    _, end, out = _batch(cluster, env, script, ntasks_per_node=2)
    assert (end["state"], end["exit_code"]) == ("completed", 0), out
    (first, second) = end["allocation"]
    assert re.findall(r"^script on .*$", out, re.M) == [f"script on {first['node_id']}"]
    tasks = sorted(line for line in out.splitlines() if re.match(r"^\d: task", line))
    gpus = [",".join(map(str, s["gpu_ids"])) for s in (first, second)]
    a, b = first["node_id"], second["node_id"]
    assert tasks == [
        f"0: task 0 of 4 on {a} node 0 local 0 step 0 gpus {gpus[0]} {a}",
        f"1: task 1 of 4 on {a} node 0 local 1 step 0 gpus {gpus[0]} {a}",
        f"2: task 2 of 4 on {b} node 1 local 0 step 0 gpus {gpus[1]} {b}",
        f"3: task 3 of 4 on {b} node 1 local 1 step 0 gpus {gpus[1]} {b}",
    ]  # each once: srun's output is the script's, not added to the job's again; each task
    # has its own node's SLURMD_NODENAME (node ids: the agents here share one host name)
    own = sorted(line for line in out.splitlines() if line.startswith("own"))
    ids = [g for s in (first, second) for g in s["gpu_ids"]]
    assert own == [f"own {t} {ids[t]}" for t in range(4)]  # --gpus-per-task: its own GPU


def test_srun_exit_codes_kill_on_bad_exit_background_steps_and_refusals(
    cluster: LocalCluster, env: dict[str, str], tmp_path: Path
) -> None:
    # Each background step's tasks wait for the other step's: both end only if they run at once.
    meet = (
        "touch {g}/{me}$SLURM_PROCID; for i in $(seq 400); do "
        "[ -e {g}/{other}$SLURM_PROCID ] && break; sleep 0.05; done; "
        "[ -e {g}/{other}$SLURM_PROCID ] && echo {me}$SLURM_STEP_ID"
    )
    a = meet.format(g=tmp_path, me="A", other="B")
    b = meet.format(g=tmp_path, me="B", other="A")
    script = f"""#!/bin/sh
srun sh -c 'exit $((SLURM_PROCID + 3))'; echo "highest=$?"
srun -K sh -c 'if [ $SLURM_PROCID = 1 ]; then exit 5; fi; exec sleep 60'; echo "killed=$?"
srun -n 3 true; echo "refused=$?"
srun -N 3 true; echo "nodes=$?"
srun -w nowhere true; echo "where=$?"
srun sh -c '{a}' & srun sh -c '{b}' & wait
echo done
"""
    job_id, end, out = _batch(cluster, env, script, ntasks=2)
    assert (end["state"], end["exit_code"]) == ("completed", 0), out
    lines = out.splitlines()
    assert "highest=4" in lines
    # -K: task 0's sleep stopped; as Slurm's srun, the step cancelled: the signal's 143
    assert "killed=143" in lines
    host = end["allocation"][1]["node_id"]  # Slurm's name for it: the hosts here share one
    assert f"srun: error: {host}: task 1: Exited with exit code 4" in lines
    assert f"srun: error: {host}: task 1: Exited with exit code 5" in lines
    refused = f"srun: error: Unable to create step for job {job_id}: "
    assert refused + "More processors requested than permitted" in lines
    assert "srun: error: Only allocated 2 nodes asked for 3" in lines
    assert refused + "Requested node configuration is not available" in lines
    codes = [x for x in lines if re.match(r"(refused|nodes|where)=", x)]
    assert codes == ["refused=1", "nodes=1", "where=1"]
    steps = sorted(x for x in lines if re.fullmatch(r"[AB]\d", x))
    assert len(steps) == 4 and {x[1] for x in steps} == {"2", "3"}  # refused: no step id
    assert lines[-1] == "done"
    # Every step that ran is kept with the job, and sacct lists them after its batch step.
    kept = cluster.client().show(job_id)["steps"]
    shown = [(s["number"], s["name"], s["state"], s["exit_code"], s["ntasks"]) for s in kept]
    assert shown[:2] == [(0, "sh", "failed", 4, 2), (1, "sh", "cancelled", 143, 2)]
    assert sorted(shown[2:]) == [(2, "sh", "completed", 0, 2), (3, "sh", "completed", 0, 2)]
    res = subprocess.run(
        [str(BIN / "mgpu"), "sacct", "-j", job_id, "-P", "-n", "--format=JobID,State,ExitCode"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.stdout.splitlines()[:4] == [
        f"{job_id}|COMPLETED|0:0",
        f"{job_id}.batch|COMPLETED|0:0",
        f"{job_id}.0|FAILED|4:0",
        f"{job_id}.1|CANCELLED|0:15",  # -K: Slurm's step, its tasks killed
    ], res.stderr
    # Listings leave the steps out (store/steps.py); sacct without -j asks for them.
    (listed,) = [j for j in cluster.client().queue(all=True)["jobs"] if j["id"] == job_id]
    assert "steps" not in listed
    res = subprocess.run(
        [str(BIN / "mgpu"), "sacct", "-P", "-n", "--format=JobID,State"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    rows = [row for row in res.stdout.splitlines() if row.startswith(f"{job_id}.")]
    assert rows[:3] == [
        f"{job_id}.batch|COMPLETED",
        f"{job_id}.0|FAILED",
        f"{job_id}.1|CANCELLED",
    ]
    assert len(rows) == 5, res.stderr


def test_cancelling_a_batch_job_stops_its_steps(
    cluster: LocalCluster, env: dict[str, str], tmp_path: Path
) -> None:
    marker = "317.25"  # sleep's argument: finds the tasks' processes
    started = tmp_path / "started"
    script = f"""#!/bin/sh
srun sh -c 'echo $SLURM_PROCID >> {started}; exec sleep {marker}'
"""
    client = cluster.client()
    job = _submit(client, script, nodes=2, gpus_per_node=1, env=env, slurm={"batch": True})

    def tasks() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] == ["sleep", marker]:
                found.append(p)
        return found

    wait_for(lambda: len(tasks()) == 2, timeout=30, what="both tasks to run")
    client.cancel(job.id)
    end = client.wait(job.id, timeout=30)
    assert end["state"] == "cancelled"
    wait_for(lambda: not tasks(), timeout=30, what="the tasks to be stopped")


def test_srun_inside_an_allocation_runs_its_tasks_there(
    cluster: LocalCluster, env: dict[str, str]
) -> None:
    script = (
        "srun -l -n 3 sh -c 'echo $SLURM_PROCID/$SLURM_NTASKS@$MGPU_NODE_ID'; "
        "srun --gpus-per-task 4 true; echo gpus=$?"
    )
    alloc = [str(BIN / "mgpu"), "alloc", "--nodes", "2", "--gpus-per-node", "2"]
    res = subprocess.run(
        [*alloc, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    (job,) = cluster.client().queue(all=True)["jobs"]
    first, second = (s["node_id"] for s in job["allocation"])
    assert sorted(res.stdout.splitlines()) == [
        f"0: 0/3@{first}",
        f"1: 1/3@{first}",
        f"2: 2/3@{second}",
        "gpus=1",
    ]
    sentence = "Requested node configuration is not available"
    assert f"srun: error: Unable to create step for job {job['id']}: {sentence}" in res.stderr
    assert job["kind"] == "allocation" and os.environ.get("MGPU_JOB_ID") is None


def test_srun_pty_inside_an_allocation_is_a_terminal(
    cluster: LocalCluster, env: dict[str, str]
) -> None:
    from test_terminals import Term

    script = "test -t 0 && test -t 1 && echo TTY$SLURM_PROCID:$(stty size); exit 3"
    t = Term(env, "alloc", "--gpus", "1", "--", "srun", "--pty", "sh", "-c", script, rows=33)
    try:
        t.expect(r"TTY0:33 80")
        assert t.wait() == 3  # the terminal's program's code, through srun and the allocation
        assert t.restored()
    finally:
        t.close()


def test_bad_step_requests_are_refused_with_one_sentence(cluster: LocalCluster) -> None:
    client = cluster.client()
    held = client.submit("true", gpus=1, hold=True).id

    def refusal(job_id: str, **body: Any) -> tuple[int, str]:
        with pytest.raises(RequestError) as e:
            client._request("POST", f"/api/jobs/{job_id}/srun", {"argv": ["true"], **body})
        return e.value.status, str(e.value)

    assert refusal("nosuchjob") == (404, "no such job or node: nosuchjob")
    assert refusal(held) == (409, f"job {held} has not started: it runs no steps yet")
    status, sentence = refusal(held, ntasks=0)
    assert status == 422 and "ntasks" in sentence and "\n" not in sentence
    status, sentence = refusal(held, argv=[])
    assert status == 422 and "argv" in sentence and "\n" not in sentence
    with pytest.raises(RequestError) as e:
        client._request("GET", "/api/sruns/nosuchstep/output")
    assert (e.value.status, str(e.value)) == (404, "no such step: nosuchstep")
