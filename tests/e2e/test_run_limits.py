"""A job held to the CPUs and memory of its grant, on this machine's real cgroups (v1 or v2,
whichever has each controller): a job past its memory is killed whole and ends out of
memory while its neighbour finishes; a job runs on exactly its CPUs; and it cannot raise
its limits or leave its cgroups.

A real agent is driven by a stand-in master that sends the Launch messages a master sends
once it grants CPUs and memory (`Grant.cpus`, `Grant.mem_mb`), so all of the agent's path
is the one a real cluster takes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for
from mgpu.agent import cgroups, runlimits
from mgpu.agent.agent import Agent
from mgpu.protocol import Welcome, encode
from standinmaster import agent_served_until

PYTHON = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups, jobs as nobody)"),
    pytest.mark.skipif(PYTHON is None, reason="no /usr/bin/python3 for the jobs"),
]

# Runs as nobody.  In the background: a process that allocates until the kernel kills it;
# in front: one that would sleep for minutes (killed whole, it does not).
HOG = """\
import os, sys, time
print(open("/proc/self/status").read().split("Cpus_allowed_list:")[1].split()[0], flush=True)
open(sys.argv[1], "w").write(str(os.getpid()))
if os.fork() == 0:
    hold = []
    while True:
        hold.append(bytearray(8 << 20))
time.sleep(300)
"""
# Runs as nobody: its CPUs, then each of its cgroups' limit files it tries to raise, and
# the parent cgroup it tries to move into.
NEIGHBOUR = """\
import errno, os
print(open("/proc/self/status").read().split("Cpus_allowed_list:")[1].split()[0])
mounts = {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    kind, opts = line.split(" - ")[1].split()[0], line.split(" - ")[1].split()[2]
    if kind == "cgroup2":
        mounts.setdefault("", f[4])
    elif kind == "cgroup":
        for c in opts.split(","):
            mounts.setdefault(c, f[4])
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.strip().split(":", 2)
    for c in ctrls.split(",") if ctrls else [""]:
        d = mounts.get(c, "") + path
        for name in ("memory.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                     "memory.swap.max", "cpuset.cpus", "cpu.max", "cpu.cfs_quota_us",
                     "../cgroup.procs"):
            p = os.path.join(d, name)
            if "/mgpu/" not in p:
                continue
            try:
                with open(p, "w") as f:
                    f.write("max" if "max" in name else str(os.getpid()))
                print("WROTE", p)
            except OSError as e:
                if e.errno != errno.ENOENT:  # EACCES: the file's, or a private dir above it
                    print("refused", e.errno, p)
"""


def _limits_here(tmp_path: Path) -> runlimits.Limits:
    key = f"test-probe-{os.getpid()}"
    containment = cgroups.choose(key)
    limits = runlimits.choose(key, containment)
    for where in {w.base for w in limits.where.values()} | {containment.base}:
        if where is not None:
            cgroups.release(where)
    return limits


def launch(job_id: str, script: str, *args: str, **grant: Any) -> dict[str, Any]:
    return {
        "type": "launch",
        "job_id": job_id,
        "epoch": 1,
        "grant": {"gpus": [], **grant},
        "user": "nobody",
        "argv": [PYTHON, "-c", script, *args],
        "env": {"PATH": "/usr/bin:/bin"},
        "cwd": "/",
    }


async def _serve(tmp_path: Path, frame: list[dict[str, Any]]) -> dict[str, Any]:
    """A real agent given `frame` by a stand-in master; every job's exit and output."""

    seen: dict[str, Any] = {"exited": {}, "out": {}}
    done = asyncio.Event()
    want = {m["job_id"] for m in frame}

    async def serve(ws: Any) -> None:
        json.loads(await ws.recv())  # hello
        await ws.send(encode(Welcome(heartbeat_interval=0.5)))
        await ws.send(json.dumps(frame))
        async for raw in ws:
            items = json.loads(raw)
            for msg in items if isinstance(items, list) else [items]:
                if msg["type"] == "exited":
                    seen["exited"][msg["job_id"]] = msg
                elif msg["type"] == "output":
                    key = (msg["job_id"], msg["stream"])
                    seen["out"][key] = seen["out"].get(key, "") + msg["data"]
            if want <= set(seen["exited"]):
                done.set()
                return

    agent = await agent_served_until(serve, done, tmp_path, timeout=120, after=_clean_up)
    seen["limits"] = agent.launcher.limits
    return seen


def _clean_up(agent: Agent) -> None:
    """What a failed run of this test would leave: its jobs' processes (a stopped agent
    leaves its jobs running), their cgroups, the agent's directories of them."""
    launcher = agent.launcher
    for run in launcher.running.values():
        for path in filter(None, (run.rec.cgroup, *run.rec.limits)):
            cgroups.kill(path)
            wait_for(lambda p=path: not cgroups.populated(p), timeout=30, what=path)
            cgroups.release(path)
    bases = {w.base for w in launcher.limits.where.values()} | {launcher.containment.base}
    for base in filter(None, bases):
        cgroups.release(base)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_job_past_its_memory_is_killed_whole_and_its_neighbour_finishes(
    tmp_path: Path,
) -> None:
    limits = _limits_here(tmp_path)
    if runlimits.MEMORY not in limits.where:
        pytest.skip("no memory controller (v1 or v2) the agent can use here")
    status = Path("/proc/self/status").read_text()
    cpus = sorted(runlimits.cpu_list(status.split("Cpus_allowed_list:")[1].split()[0]))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    shared = Path(tempfile.mkdtemp(prefix="mgpu-limits-", dir="/tmp"))
    shared.chmod(0o777)  # nobody writes the pid of its job's top process there
    pidfile = shared / "hog.pid"
    frame = [
        launch("hog", HOG, str(pidfile), cpus=[cpus[1]], mem_mb=64),
        launch("neighbour", NEIGHBOUR, cpus=[cpus[0]], mem_mb=256),
    ]
    try:
        seen = asyncio.run(_serve(tmp_path, frame))
        top = int(pidfile.read_text())
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    hog, neighbour = seen["exited"]["hog"], seen["exited"]["neighbour"]
    hog["err"] = seen["out"].get(("hog", "e"))
    neighbour["err"] = seen["out"].get(("neighbour", "e"))

    assert hog["out_of_memory"] is True, hog
    assert hog["exit_code"] != 0 and hog["launch_error"] is None, hog
    assert hog["max_rss_mb"] is not None and 32 <= hog["max_rss_mb"] <= 72, hog
    assert not _alive(top)  # the sleeping top process died too

    assert neighbour["exit_code"] == 0 and neighbour["out_of_memory"] is False, neighbour
    assert neighbour["max_rss_mb"] is not None and neighbour["max_rss_mb"] < 256

    if runlimits.CPUSET in limits.where:
        assert seen["out"][("hog", "o")].split()[0] == str(cpus[1])
        assert seen["out"][("neighbour", "o")].split()[0] == str(cpus[0])
    lines = seen["out"][("neighbour", "o")].splitlines()[1:]
    assert not [line for line in lines if line.startswith("WROTE")], lines
    refused = [line for line in lines if line.startswith("refused 13 ")]  # EACCES
    assert any("/memory.limit_in_bytes" in x or "/memory.max" in x for x in refused), lines
    assert any("cgroup.procs" in line for line in refused), lines
    if runlimits.CPUSET in limits.where:
        assert any("cpuset.cpus" in line for line in refused), lines


def test_a_v1_cpuset_taken_away_is_made_again_with_its_cpus() -> None:
    """The agent's v1 cpuset directory removed while it runs (it is empty between runs: an
    rmdir of it succeeds): the next run's directory is made again under it, and a new v1
    cpuset has no CPUs, so a grant of a CPU fell back to a quota of one (the job saw every
    CPU).  It is given its parent's CPUs again, and the run its own CPU."""
    key = f"test-cpuset-{os.getpid()}"
    containment = cgroups.choose(key)
    limits = runlimits.choose(key, containment)
    where = limits.where.get(runlimits.CPUSET)
    mine = sorted(runlimits.cpu_list(Path("/proc/self/status").read_text().split(
        "Cpus_allowed_list:")[1].split()[0]))  # fmt: skip
    if where is None or where.version != 1 or len(mine) < 2:
        pytest.skip("needs a v1 cpuset hierarchy and two CPUs")
    made = None
    try:
        assert cgroups.release(where.base)  # taken away
        made = runlimits.apply(limits, "cpus", 1, [mine[1]], None, None)
        [path] = [p for p in made.join if p.startswith(where.base + "/")]
        assert Path(path, "cpuset.cpus").read_text().strip() == str(mine[1])
        assert not any(p.startswith("/sys/fs/cgroup/cpu/") for p in made.join)  # no quota
    finally:
        for path in made.join if made is not None else []:
            cgroups.release(path)
        for base in {w.base for w in limits.where.values()} | {containment.base}:
            if base is not None:
                cgroups.release(base)


def test_a_neighbour_starting_beside_an_agent_does_not_cost_it_its_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two agents starting on one machine (tests, several node ids): each removes the
    others' empty directories (`cgroups.sweep`).  A removal between this agent's making its
    own directory in a hierarchy and checking it took that hierarchy for one it cannot
    use: its jobs ran held to no memory ("not limited"; seen in CI, slurmdiff's agents).
    Staged here at that very moment: the directory is made again."""
    with open("/proc/self/mountinfo") as f, open("/proc/self/cgroup") as g:
        mountinfo, self_cgroup = f.read(), g.read()
    mine, neighbour = f"test-mine-{os.getpid()}", f"test-neighbour-{os.getpid()}"
    owns = {c: cgroups.v1_hierarchy(mountinfo, self_cgroup, c) for c in runlimits.CONTROLLERS}
    bases = {c: os.path.join(own, cgroups.TOP, mine) for c, own in owns.items() if own}
    if runlimits.MEMORY not in bases:
        pytest.skip("no v1 memory hierarchy here")
    access, raced = os.access, set()

    def neighbour_sweeps_first(path: Any, mode: int, **kw: Any) -> bool:
        for ctrl, base in bases.items():
            if base not in raced and str(path).startswith(base + "/"):
                raced.add(base)
                theirs = os.path.join(os.path.dirname(base), neighbour)
                os.makedirs(theirs, exist_ok=True)
                runlimits.sweep(runlimits.Limits({ctrl: runlimits.Hierarchy(1, theirs)}), set())
                assert not os.path.isdir(base)  # the race staged: this agent's is gone
        return access(path, mode, **kw)

    monkeypatch.setattr(os, "access", neighbour_sweeps_first)
    try:
        limits = runlimits.choose(mine, cgroups.Containment(cgroups.PROCESS_TREE))
    finally:
        monkeypatch.undo()
        for base in bases.values():
            cgroups.release(base)
            cgroups.release(os.path.join(os.path.dirname(base), neighbour))
    assert raced == set(bases.values())
    assert limits.where == {c: runlimits.Hierarchy(1, b) for c, b in bases.items()}
