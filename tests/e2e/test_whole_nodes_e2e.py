"""Whole nodes, all of a node's memory and CPUs the machine lacks, end to end: a master and
a real agent (`--fake-gpus 2 --fake-cpus N --fake-mem 2G`), jobs on this machine's cgroups.

* `--exclusive` (sbatch's and `mgpu submit`'s) keeps a node to one job: it waits for a
  `--gpus 0` job that holds none of the node's GPUs, CPUs or memory, and no such job
  starts beside it;
* `--mem=0` is all of the node's memory: granted, and the job's cgroup limit;
* a grant of CPU ids this machine does not have (`--fake-cpus` beyond its cores) is held by
  a CPU quota of as many CPUs (the job's cgroup's `cpu.cfs_quota_us` or `cpu.max`);
* a running job's peak memory is known before it ends (`mgpu show`, sacct's MaxRSS),
  counted even when it was granted no memory.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, LocalCluster, wait_for

WAIT = 90.0
"""Seconds for a job to start or end on a loaded machine."""
MIB = 1 << 20
CORES = os.cpu_count() or 1
FAKE_CPUS = max(8, CORES + 2)
"""More CPUs than this machine has: a grant of CORES + 1 names some it lacks."""

# Prints the job's own cgroup files (v1: each controller's hierarchy; v2: the unified one).
CGROUP_PY = """\
import json, os
mounts = {}
for line in open("/proc/self/mountinfo"):
    f, tail = line.split(), line.split(" - ")[1].split()
    if tail[0] == "cgroup2":
        mounts.setdefault("", (f[3], f[4]))
    elif tail[0] == "cgroup":
        for c in tail[2].split(","):
            mounts.setdefault(c, (f[3], f[4]))
dirs = {}
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.strip().split(":", 2)
    for c in ctrls.split(",") if ctrls else [""]:
        if c in mounts:
            root, point = mounts[c]
            dirs[c] = point + (path[len(root):] if root != "/" and path.startswith(root) else path)
def read(ctrl, name):
    for key in (ctrl, ""):
        d = dirs.get(key)
        if d and os.path.exists(os.path.join(d, name)):
            return open(os.path.join(d, name)).read().strip()
    return None
names = {"memory": ["memory.limit_in_bytes", "memory.max"],
         "cpu": ["cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.max"]}
print(json.dumps({n: read(c, n) for c, ns in names.items() for n in ns}))
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("whole"), config="networking: {heartbeat_interval: 1}\n"
    )
    try:
        c.start_master()
        extra = ["--fake-cpus", str(FAKE_CPUS), "--fake-mem", "2G"]
        c.start_agent("node001", gpus=2, extra=extra)
        yield c
    finally:
        c.stop()


def _submit(c: LocalCluster, *args: str) -> str:
    return c.cli("submit", *args, check=True).stdout.strip()


def _sbatch(c: LocalCluster, tmp: Path, *args: str, script: str) -> str:
    path = tmp / f"job{len(list(tmp.glob('job*.sh')))}.sh"
    path.write_text(f"#!/bin/sh\n{script}\n")
    res = subprocess.run(
        [str(BIN / "mgpu"), "sbatch", "--parsable", "-D", str(tmp), *args, str(path)],
        capture_output=True,
        text=True,
        env=c.env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _show(c: LocalCluster, job_id: str) -> dict[str, Any]:
    return c.client().show(job_id)  # type: ignore[no-any-return]


def _state_is(c: LocalCluster, job_id: str, *states: str) -> bool:
    return _show(c, job_id)["state"] in states


def _waits(c: LocalCluster, job_id: str) -> str:
    """The job's reason once a pass has looked at it (it is queued still)."""
    reason = wait_for(lambda: _show(c, job_id)["reason"], WAIT, what="a pass over the job")
    assert _show(c, job_id)["state"] == "queued"
    return str(reason)


def _hold(gate: Path) -> str:
    return f"while [ ! -e {gate} ]; do sleep 0.05; done"


def _cgroup_files(c: LocalCluster, job_id: str) -> dict[str, str | None]:
    wait_for(lambda: _state_is(c, job_id, "completed", "failed"), WAIT, what="the job's end")
    job = _show(c, job_id)
    assert job["state"] == "completed", job
    out = c.cli("logs", job_id, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _needs_root_and(controller: str) -> None:
    from mgpu.agent import cgroups, runlimits

    if os.geteuid() != 0:
        pytest.skip("needs root (cgroups)")
    key = f"test-probe-{os.getpid()}"
    containment = cgroups.choose(key)
    limits = runlimits.choose(key, containment)
    for where in {w.base for w in limits.where.values()} | {containment.base}:
        if where is not None:
            cgroups.release(where)
    if controller not in limits.where:
        pytest.skip(f"no {controller} controller (v1 or v2) the agent can use here")


# --------------------------------------------------------------------------- --exclusive


def test_exclusive_keeps_a_node_to_one_job(node: LocalCluster, tmp_path: Path) -> None:
    c = node
    # A CPU-only job holds none of the node's GPUs, CPUs or memory, yet runs there.
    first_gate, second_gate = tmp_path / "first", tmp_path / "second"
    cpu_only = _submit(c, "--gpus", "0", _hold(first_gate))
    wait_for(lambda: _state_is(c, cpu_only, "running"), WAIT, what="the CPU-only job running")
    whole = _sbatch(c, tmp_path, "--exclusive", "--gres=gpu:1", script="true")
    assert _waits(c, whole) == "waiting for a whole node"
    first_gate.touch()
    wait_for(lambda: _state_is(c, whole, "completed"), WAIT, what="the exclusive job done")
    a, b = _show(c, cpu_only), _show(c, whole)
    assert b["start_time"] >= a["end_time"]
    assert (b["cpus"], b["mem_mb"]) == (FAKE_CPUS, 2048)

    # mgpu's own --exclusive: while it runs, not even a job holding nothing starts there.
    mine = _submit(c, "--exclusive", "--gpus", "1", _hold(second_gate))
    wait_for(lambda: _state_is(c, mine, "running"), WAIT, what="mgpu's exclusive job running")
    shown = _show(c, mine)
    assert shown["resources"]["exclusive"] is True
    assert len(shown["allocation"][0]["gpu_ids"]) == 2  # every GPU of the node
    beside = _submit(c, "--gpus", "0", "true")
    _waits(c, beside)
    second_gate.touch()
    wait_for(lambda: _state_is(c, beside, "completed"), WAIT, what="the job beside it done")
    assert _show(c, beside)["start_time"] >= _show(c, mine)["end_time"]


# --------------------------------------------------------------------------- --mem=0


def test_mem_0_is_all_of_the_nodes_memory_granted_and_enforced(
    node: LocalCluster, tmp_path: Path
) -> None:
    _needs_root_and("memory")
    c = node
    script = tmp_path / "cgroup.py"
    script.write_text(CGROUP_PY)
    job_id = _sbatch(c, tmp_path, "--mem=0", "--gres=gpu:1", script=f"python3 {script}")
    files = _cgroup_files(c, job_id)
    assert _show(c, job_id)["mem_mb"] == 2048
    limit = files["memory.limit_in_bytes"] or files["memory.max"]
    assert limit is not None and int(limit) == 2048 * MIB, files


# --------------------------------------------------------------------------- a quota


def test_cpus_the_machine_lacks_are_held_by_a_quota_of_as_many(
    node: LocalCluster, tmp_path: Path
) -> None:
    _needs_root_and("cpu")
    c = node
    script = tmp_path / "cgroup.py"
    script.write_text(CGROUP_PY)
    asked = CORES + 1  # more than this machine has: some ids are not its CPUs
    job_id = _submit(c, "--gpus", "1", "--cpus", str(asked), f"python3 {script}")
    files = _cgroup_files(c, job_id)
    granted = _show(c, job_id)["allocation"][0]["cpu_ids"]
    assert len(granted) == asked and max(granted) >= CORES
    if files["cpu.cfs_quota_us"] is not None:
        quota, period = int(files["cpu.cfs_quota_us"]), int(files["cpu.cfs_period_us"] or 0)
    else:
        assert files["cpu.max"] is not None, files
        quota_text, period_text = files["cpu.max"].split()
        quota, period = int(quota_text), int(period_text)
    assert period > 0 and quota == asked * period, files


# --------------------------------------------------------------------------- peak memory


PEAK_PY = """\
import os, sys, time
hold = b"x" * (96 << 20)  # written: resident
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_a_running_jobs_peak_memory_is_known_before_it_ends(
    node: LocalCluster, tmp_path: Path
) -> None:
    _needs_root_and("memory")
    c = node
    script, gate = tmp_path / "peak.py", tmp_path / "gate"
    script.write_text(PEAK_PY)
    job_id = _submit(c, "--gpus", "1", f"python3 {script} {gate}")  # no memory asked

    def peak() -> int | None:
        job = _show(c, job_id)
        mb = job.get("max_rss_mb")
        return mb if job["state"] == "running" and mb is not None and mb >= 90 else None

    try:
        mb = wait_for(peak, WAIT, what="the running job's peak")
        assert mb < 1024
        rows = subprocess.run(
            [str(BIN / "mgpu"), "sacct", "-P", "-n", "-X", "-j", job_id, "-o", "State,MaxRSS"],
            capture_output=True,
            text=True,
            env=c.env,
            timeout=60,
        ).stdout.split()
        assert rows and rows[0].startswith("RUNNING|") and rows[0].split("|")[1], rows
        assert "max rss:" in c.cli("show", job_id, check=True).stdout
    finally:
        gate.touch()
    wait_for(lambda: _state_is(c, job_id, "completed"), WAIT, what="the job's end")
    assert _show(c, job_id)["max_rss_mb"] >= 90
