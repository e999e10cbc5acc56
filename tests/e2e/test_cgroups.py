"""Each job in its own cgroup: nothing a job started outlives its end, cancel or time-out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import LocalCluster, wait_for
from mgpu.agent import cgroups

# ---- choosing the method (unit) ----------------------------------------------------------

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
37 31 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = "6:freezer:/\n5:pids:/user.slice\n0::/system.slice/mgpu-node.service\n"


def test_candidates_come_from_mountinfo_v2_first() -> None:
    assert cgroups.candidates(HYBRID, HYBRID_SELF) == [
        (cgroups.V2, "/sys/fs/cgroup/unified/system.slice/mgpu-node.service"),
        (cgroups.V1_FREEZER, "/sys/fs/cgroup/freezer"),
    ]
    pure_v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
    assert cgroups.candidates(pure_v2, "0::/\n") == [(cgroups.V2, "/sys/fs/cgroup")]
    # v1 only, freezer co-mounted with another controller, own cgroup nested.
    v1 = "40 31 0:33 / /cg/cpu,freezer rw - cgroup cgroup rw,cpu,freezer\n"
    assert cgroups.candidates(v1, "4:cpu,freezer:/a/b\n") == [
        (cgroups.V1_FREEZER, "/cg/cpu,freezer/a/b")
    ]
    # A container's view: the mount's root is our own cgroup; a space in a path is escaped.
    boxed = "50 40 0:26 /box /sys/fs/my\\040cg rw - cgroup2 cgroup2 rw\n"
    assert cgroups.candidates(boxed, "0::/box/job\n") == [(cgroups.V2, "/sys/fs/my cg/job")]
    assert cgroups.candidates("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "") == []


def _fake_hierarchies(tmp_path: Path, v2_files: list[str], freezer_files: list[str]) -> None:
    """A stand-in cgroupfs: directories that look like v2 and v1-freezer cgroups."""
    v2, freezer = tmp_path / "unified", tmp_path / "freezer"
    key = "n1-abc"
    for root, files in ((v2, v2_files), (freezer, freezer_files)):
        base = root / "agent" / cgroups.TOP / key
        base.mkdir(parents=True)
        for name in files:
            (base / name).write_text("")
    (tmp_path / "mountinfo").write_text(
        f"41 31 0:38 / {v2} rw - cgroup2 cgroup2 rw\n"
        f"37 31 0:33 / {freezer} rw - cgroup cgroup rw,freezer\n"
    )
    (tmp_path / "cgroup").write_text("6:freezer:/agent\n0::/agent\n")


def _choose(tmp_path: Path, prefer: str = "auto") -> cgroups.Containment:
    return cgroups.choose("n1-abc", prefer, str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))


@pytest.mark.parametrize(
    ("v2_files", "freezer_files", "prefer", "method"),
    [
        (["cgroup.kill", "cgroup.procs"], ["freezer.state", "cgroup.procs"], "auto", "cgroup-v2"),
        # A kernel before 5.14 has v2 but no cgroup.kill: the freezer does the job.
        (["cgroup.procs"], ["freezer.state", "cgroup.procs"], "auto", "cgroup-v1-freezer"),
        (["cgroup.procs"], ["cgroup.procs"], "auto", "process-tree"),
        (["cgroup.kill", "cgroup.procs"], ["freezer.state", "cgroup.procs"], "cgroup-v1-freezer",
         "cgroup-v1-freezer"),
        (["cgroup.kill", "cgroup.procs"], [], "process-tree", "process-tree"),
        (["cgroup.procs"], ["cgroup.procs"], "cgroup-v2", "process-tree"),  # asked, not there
    ],
)  # fmt: skip
def test_choose_falls_back_in_order(
    tmp_path: Path, v2_files: list[str], freezer_files: list[str], prefer: str, method: str
) -> None:
    _fake_hierarchies(tmp_path, v2_files, freezer_files)
    chosen = _choose(tmp_path, prefer)
    assert chosen.method == method
    if method == "process-tree":
        assert chosen.base is None
    else:
        root = "unified" if method == "cgroup-v2" else "freezer"
        assert chosen.base == str(tmp_path / root / "agent" / cgroups.TOP / "n1-abc")


def test_choose_without_permission_or_cgroupfs(tmp_path: Path) -> None:
    _fake_hierarchies(tmp_path, ["cgroup.kill", "cgroup.procs"], [])
    (tmp_path / "unified" / "agent" / cgroups.TOP / "n1-abc" / "cgroup.procs").chmod(0o444)
    if os.geteuid() != 0:  # root writes anyway
        assert _choose(tmp_path).method == "process-tree"
    missing = tmp_path / "nowhere"
    assert cgroups.choose("k", "auto", str(missing), str(missing)).method == "process-tree"


def test_a_v2_base_made_again_enables_its_runs_controllers_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A neighbour agent's start-up removes this agent's empty directory; the next run's
    cgroup makes it again.  A new v2 cgroup enables nothing for its children, so the run's
    CPU and memory limit files would not be there: the parent's controllers are enabled."""
    top = tmp_path / "agent" / cgroups.TOP
    top.mkdir(parents=True)
    (top / "cgroup.subtree_control").write_text("cpuset cpu memory\n")
    base = top / "n1-abc"  # not there: removed
    writes: list[tuple[str, str, str]] = []
    monkeypatch.setattr(cgroups, "write", lambda *a: writes.append(a))
    path = cgroups.create(cgroups.Containment(cgroups.V2, str(base)), "7", 1)
    assert path == str(base / "7.1") and os.path.isdir(path)
    assert writes == [
        (str(base), "cgroup.subtree_control", f"+{c}") for c in ("cpuset", "cpu", "memory")
    ]


def test_a_run_dir_is_made_again_when_its_base_goes_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A neighbour agent's start-up removes this agent's empty directory just as a run's
    limit cgroup is being made in it: the launch was refused (a retry spent)."""
    base = tmp_path / "mgpu" / "n1-abc"
    base.mkdir(parents=True)
    mkdir, removed = os.mkdir, []

    def neighbour_sweeps_first(path: Any, *args: Any, **kw: Any) -> None:
        if not removed and str(path) == str(base / "7.1"):
            removed.append(cgroups.release(str(base)))
        mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "mkdir", neighbour_sweeps_first)
    cgroups.make_run_dir(str(base / "7.1"))
    assert removed == [True] and (base / "7.1").is_dir()


def test_agent_key_is_per_node_and_spool(tmp_path: Path) -> None:
    one = cgroups.agent_key("node001", tmp_path / "a" / "spool")
    assert one.startswith("node001-") and "/" not in one
    assert one != cgroups.agent_key("node001", tmp_path / "b" / "spool")
    assert one == cgroups.agent_key("node001", tmp_path / "a" / "spool")
    assert "/" not in cgroups.agent_key("../x/y", tmp_path)


# ---- real cgroups, real agent (root) -----------------------------------------------------


def _usable(method: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    probe = cgroups.choose(f"test-probe-{os.getpid()}", method)
    if probe.base is not None:
        cgroups.release(probe.base)
    return None if probe.method == method else f"{method} is not usable here"


@pytest.fixture
def share(tmp_path: Path) -> Iterator[Path]:
    """A directory the jobs write their escaped processes' pids to."""
    yield tmp_path


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[LocalCluster]]:
    clusters: list[LocalCluster] = []
    yield clusters
    for c in clusters:
        c.stop()


def _cluster(
    made: list[LocalCluster], root: Path, method: str | None = None
) -> tuple[LocalCluster, Path]:
    c = LocalCluster(root, config="scheduling: {kill_grace: 1}\n")
    made.append(c)
    if method is not None:
        c.env[cgroups.CHOICE_ENV] = method
    c.start_master()
    c.start_agent("node001", gpus=2)
    return c, root / "agent-node001" / "node-node001" / "spool"


def _pid(path: Path) -> int:
    return int(wait_for(lambda: path.read_text().strip(), timeout=20, what=str(path)))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _reap(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


# A child that leaves everything a process-tree scan knows: the process group and session
# (setsid), its parent (the subshell exits at once) and the run's tag (env -i).
ESCAPE = "(env -i /usr/bin/setsid /bin/sh -c 'echo $$ > {out}; exec sleep 1000' &)"


@pytest.mark.parametrize("method", ["cgroup-v2", "cgroup-v1-freezer"])
def test_nothing_outlives_end_cancel_or_time_limit(
    made: list[LocalCluster], tmp_path: Path, method: str
) -> None:
    why = _usable(method)
    if why:
        pytest.skip(why)
    c, spool = _cluster(made, tmp_path, method)
    client = c.client()
    pids: list[int] = []
    try:
        # Normal end: a setsid child of a job that exits 0.
        # It writes its pid once in its own session (out of reach of the job's process
        # group); the job waits for that, then exits.
        end = tmp_path / "end"
        ended = client.submit(
            f"setsid sh -c 'echo $$ > {end}; exec sleep 1000' & "
            f"while [ ! -s {end} ]; do sleep 0.01; done; echo done",
            gpus=1,
        )
        done = client.wait(ended.id, timeout=30)
        pids.append(_pid(tmp_path / "end"))
        assert done["state"] == "completed", done
        assert not _alive(pids[-1]), "a setsid child outlived its job"

        # Cancel: a double-forked child with a cleaned environment.
        cancelled = client.submit(ESCAPE.format(out=f"{tmp_path}/cancel") + "; sleep 300", gpus=1)
        pids.append(_pid(tmp_path / "cancel"))
        record = json.loads(next(spool.glob(f"{cancelled.id}.*.run")).read_text())
        assert record["cgroup"].endswith(f"/{cancelled.id}.1")
        client.cancel(cancelled.id)
        assert client.wait(cancelled.id, timeout=30)["state"] == "cancelled"
        assert not _alive(pids[-1]), "a double-forked child survived cancel"
        assert not os.path.exists(record["cgroup"])  # removed once empty

        # Time limit: the same escapee.
        timed = client.submit(
            ESCAPE.format(out=f"{tmp_path}/timed") + "; sleep 300", gpus=1, time="0:02"
        )
        pids.append(_pid(tmp_path / "timed"))
        done = client.wait(timed.id, timeout=30)
        assert done["state"] == "timeout", done
        assert not _alive(pids[-1]), "a double-forked child survived the time limit"
    finally:
        _reap(pids)


def test_process_tree_fallback_misses_a_double_fork(
    made: list[LocalCluster], tmp_path: Path
) -> None:
    """What the cgroups are for: without them such a child survives (and this test would
    catch a cgroup method that silently did nothing)."""
    c, _ = _cluster(made, tmp_path, "process-tree")
    client = c.client()
    job = client.submit(ESCAPE.format(out=f"{tmp_path}/esc") + "; sleep 300", gpus=1)
    pid = _pid(tmp_path / "esc")
    try:
        client.cancel(job.id)
        assert client.wait(job.id, timeout=30)["state"] == "cancelled"
        assert _alive(pid)
    finally:
        _reap([pid])


def test_readopted_run_keeps_its_cgroup_and_stale_ones_go(
    made: list[LocalCluster], tmp_path: Path
) -> None:
    why = _usable("cgroup-v2")
    if why:
        pytest.skip(why)
    c, spool = _cluster(made, tmp_path)
    client = c.client()
    pids: list[int] = []
    stray: subprocess.Popen[bytes] | None = None
    try:
        job = client.submit(ESCAPE.format(out=f"{tmp_path}/esc") + "; sleep 300", gpus=1)
        pids.append(_pid(tmp_path / "esc"))
        agent = c.agents["node001"]
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)

        # While the agent is down, a cgroup no run record names appears (a run that died
        # with a torn record): the restarted agent kills what is in it and removes it.
        base = cgroups.choose(cgroups.agent_key("node001", spool), "cgroup-v2").base
        assert base is not None
        stale = os.path.join(base, "gone.1")
        os.mkdir(stale)
        stray = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        assert cgroups.enter(stale, stray.pid)

        c.start_agent("node001", gpus=2)
        wait_for(lambda: stray.poll() is not None, timeout=30, what="the stale cgroup killed")
        assert not os.path.exists(stale)
        assert client.show(job.id)["state"] == "running"
        assert _alive(pids[0])  # the re-adopted run's cgroup was left alone...
        client.cancel(job.id)
        assert client.wait(job.id, timeout=30)["state"] == "cancelled"
        assert not _alive(pids[0])  # ...and found again at its end
    finally:
        _reap(pids)
        if stray is not None and stray.poll() is None:
            stray.kill()
            stray.wait(timeout=5)


def test_health_names_the_method(made: list[LocalCluster], tmp_path: Path) -> None:
    c = LocalCluster(tmp_path)
    made.append(c)
    c.start_master()
    argv = ["node", "--node-id", "hc001", "--fake-gpus", "1", "--health"]
    argv += ["--master-port", str(c.port), "--state-dir", str(tmp_path / "hc")]
    expected = "cgroup-v2" if _usable("cgroup-v2") is None else None
    res = c.cli(*argv)
    line = next(x for x in res.stdout.splitlines() if "job containment" in x)
    if expected is not None:
        assert line == "ok    job containment: cgroup-v2", res.stdout
    c.env[cgroups.CHOICE_ENV] = "process-tree"
    res = c.cli(*argv)
    assert "ok    job containment: process-tree (no usable cgroup here" in res.stdout
