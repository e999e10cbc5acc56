"""GPU isolation: a job opens only the GPU device files it was given, whatever it sets
`CUDA_VISIBLE_DEVICES` to (devices cgroup v1, or a BPF device program on its cgroup v2).

The GPUs are device files made with mknod in a temp dir (`mgpu node --gpu-device-dir`).
No driver is behind them, so opening one the job may use fails with ENXIO; one the
cgroup denies fails with EPERM first."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import LocalCluster, wait_for
from mgpu.agent import cgroups, devices

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, cgroups)")

GPUS = 4
PROBE = """\
import errno, os, sys
seen = []
for i in range(int(sys.argv[2])):
    try:
        os.close(os.open(f"{sys.argv[1]}/nvidia{i}", os.O_RDONLY))
        seen.append(f"{i}:open")
    except OSError as e:
        seen.append(f"{i}:{errno.errorcode[e.errno]}")
print(os.environ.get("CUDA_VISIBLE_DEVICES", ""), " ".join(seen))
"""


def _free_major() -> int:
    """195 (NVIDIA's) unless a real driver has it here, else one of the local-use majors."""
    with open("/proc/devices") as f:
        text = f.read().split("Block devices:")[0]
    used = {int(line.split()[0]) for line in text.splitlines()[1:] if line.strip()}
    return next(m for m in (195, *range(240, 255)) if m not in used)


@pytest.fixture
def dev_dir() -> Iterator[Path]:
    """A world-traversable dir of fake GPU device files, nvidia0..3, and the probe."""
    top = Path(tempfile.mkdtemp(prefix="mgpu-dev-", dir="/tmp"))
    top.chmod(0o755)
    major = _free_major()
    try:
        for i in range(GPUS):
            os.mknod(top / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(major, i))
            os.chmod(top / f"nvidia{i}", 0o666)  # only the cgroup may say no
        os.mknod(top / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(major, 255))
        (top / "probe.py").write_text(PROBE)
        (top / "probe.py").chmod(0o644)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _usable(method: str, dev_dir: Path) -> str | None:
    key = f"test-probe-{os.getpid()}"
    containment = cgroups.choose(key, cgroups.V2 if method == devices.BPF else "auto")
    iso = devices.choose(key, dev_dir, containment, method)
    for base in (iso.base, containment.base):
        if base is not None:
            cgroups.release(base)
    return None if iso.method == method else f"{method} is not usable here: {iso.why}"


@pytest.fixture
def made() -> Iterator[list[LocalCluster]]:
    clusters: list[LocalCluster] = []
    yield clusters
    for c in clusters:
        c.stop()


def _cluster(made: list[LocalCluster], root: Path, dev_dir: Path, method: str) -> LocalCluster:
    c = LocalCluster(root)
    made.append(c)
    c.env[devices.CHOICE_ENV] = method
    c.start_master()
    c.start_agent("node001", gpus=GPUS, extra=["--gpu-device-dir", str(dev_dir)])
    return c


def _probe_command(dev_dir: Path) -> str:
    # The job widens its own CUDA_VISIBLE_DEVICES first: that must not help it.
    return (
        f"export CUDA_VISIBLE_DEVICES=0,1,2,3; {sys.executable} {dev_dir}/probe.py {dev_dir} {GPUS}"
    )


def _expected(given: list[int]) -> str:
    """What the probe prints: ENXIO (allowed, no driver) for its GPUs, EPERM for the others."""
    seen = " ".join(f"{i}:{'ENXIO' if i in given else 'EPERM'}" for i in range(GPUS))
    return f"0,1,2,3 {seen}\n"


@pytest.mark.parametrize("method", [devices.V1, devices.BPF])
def test_a_job_opens_only_its_own_gpus(
    made: list[LocalCluster], tmp_path: Path, dev_dir: Path, method: str
) -> None:
    why = _usable(method, dev_dir)
    if why:
        pytest.skip(why)
    c = _cluster(made, tmp_path, dev_dir, method)
    client = c.client()
    one = client.submit(_probe_command(dev_dir), gpus=1)
    two = client.submit(_probe_command(dev_dir), gpus=2)
    none = client.submit(_probe_command(dev_dir), gpus=0)
    for job in (one, two, none):
        done = client.wait(job.id, timeout=60)
        assert done["state"] == "completed", (done, client.logs(job.id))
        given = done["allocation"][0]["gpu_ids"]
        assert len(given) == {one.id: 1, two.id: 2, none.id: 0}[job.id]
        assert client.logs(job.id) == _expected(given)

    (node,) = json.loads(c.cli("nodes", "--json", check=True).stdout)["nodes"]
    assert node["gpu_isolation"] == method
    assert node["containment"] == "cgroup-v2"
    if method == devices.V1:  # each run's devices cgroup went with it
        spool = tmp_path / "agent-node001" / "node-node001" / "spool"
        iso = devices.choose(cgroups.agent_key("node001", spool), dev_dir, cgroups.Containment("x"))
        assert iso.base is not None
        assert [e.name for e in os.scandir(iso.base) if e.is_dir()] == []


def test_without_isolation_a_job_opens_every_gpu(
    made: list[LocalCluster], tmp_path: Path, dev_dir: Path
) -> None:
    """What the rules are for (and proof that EPERM above comes from them)."""
    c = _cluster(made, tmp_path, dev_dir, devices.NONE)
    client = c.client()
    job = client.submit(_probe_command(dev_dir), gpus=1)
    assert client.wait(job.id, timeout=60)["state"] == "completed"
    assert client.logs(job.id) == _expected(list(range(GPUS)))
    (node,) = client.nodes()
    assert node["gpu_isolation"] == devices.NONE


def test_a_readopted_run_keeps_its_rules_and_stale_ones_go(
    made: list[LocalCluster], tmp_path: Path, dev_dir: Path
) -> None:
    why = _usable(devices.V1, dev_dir)
    if why:
        pytest.skip(why)
    c = _cluster(made, tmp_path, dev_dir, devices.V1)
    client = c.client()
    go = tmp_path / "go"
    # The job probes only once the agent has been restarted (the file `go` appears).
    job = client.submit(
        f"while [ ! -e {go} ]; do sleep 0.05; done; " + _probe_command(dev_dir), gpus=1
    )
    spool = tmp_path / "agent-node001" / "node-node001" / "spool"
    record = wait_for(lambda: next(spool.glob(f"{job.id}.*.run"), None), what="the run record")
    rules = json.loads(record.read_text())["devices"]
    assert rules and os.path.isdir(rules)

    agent = c.agents["node001"]
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(timeout=10)
    stale = os.path.join(os.path.dirname(rules), "gone.1")  # a run no record names
    os.mkdir(stale)
    c.start_agent("node001", gpus=GPUS, extra=["--gpu-device-dir", str(dev_dir)])
    assert not os.path.exists(stale)
    assert os.path.isdir(rules)
    go.touch()
    done = client.wait(job.id, timeout=60)
    assert done["state"] == "completed"
    assert client.logs(job.id) == _expected(done["allocation"][0]["gpu_ids"])
    assert not os.path.exists(rules)


def test_health_names_the_method(made: list[LocalCluster], tmp_path: Path, dev_dir: Path) -> None:
    c = LocalCluster(tmp_path)
    made.append(c)
    c.start_master()
    argv = ["node", "--node-id", "hc001", "--fake-gpus", "4", "--health"]
    argv += ["--master-port", str(c.port), "--state-dir", str(tmp_path / "hc")]

    def line(*extra: str) -> str:
        res = c.cli(*argv, *extra)
        return next(x for x in res.stdout.splitlines() if "GPU isolation" in x)

    for method in (devices.V1, devices.BPF):
        if _usable(method, dev_dir) is None:
            c.env[devices.CHOICE_ENV] = method
            assert line("--gpu-device-dir", str(dev_dir)) == (
                f"ok    GPU isolation: {method} (4 GPU device file(s))"
            )
    c.env[devices.CHOICE_ENV] = "auto"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert line("--gpu-device-dir", str(empty)) == (
        f"ok    GPU isolation: none (no GPU device files {empty}/nvidia*)"
    )
    res = c.cli(*argv, "--gpu-device-dir", str(tmp_path / "missing"))
    assert res.returncode != 0
    assert res.stderr.strip().endswith(
        f"--gpu-device-dir {tmp_path / 'missing'} is not a directory"
    )
    assert "Traceback" not in res.stderr
