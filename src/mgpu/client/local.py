"""`mgpu up` / `mgpu down`: an all-in-one local cluster in the background."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mgpu.client.api import Client, MgpuError


def _state_dir(raw: str | None) -> Path:
    from mgpu.master.server import default_state_dir

    return Path(raw).expanduser() if raw else default_state_dir()


def _pidfile(state_dir: Path) -> Path:
    return state_dir / "local-cluster.json"


def _alive(pid: int, started: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 0.05
    except psutil.Error:
        return False


def _private_log(path: Path) -> int:
    """A log file only this account reads (logs name jobs, users and paths), for appending."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # one made by an older version was 0644
    return fd


def _start(argv: list[str], log: Path, umask: int = -1) -> tuple[int, float]:
    import psutil

    fd = _private_log(log)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            umask=umask,
        )
    finally:
        os.close(fd)
    return proc.pid, psutil.Process(proc.pid).create_time()


def _private_dirs(state_dir: Path, node_id: str) -> None:
    """The state dir (the master's and this node's: tokens, the database, job output and
    spool files) 0700 before anything is written in it.  The master tightens it again as
    it starts; the agent's own dir is made here so it is private from the first file on.
    (The agent sets umask 0077 for itself; its jobs get 0022.)"""
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    for d in (state_dir, state_dir / f"node-{node_id}", state_dir / f"node-{node_id}" / "spool"):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)


def cluster_up(port: int, fake_gpus: int | None, state_dir_raw: str | None) -> int:
    state_dir = _state_dir(state_dir_raw)
    _private_dirs(state_dir, "node001")
    pidfile = _pidfile(state_dir)
    if pidfile.exists():
        info = json.loads(pidfile.read_text())
        if any(_alive(p["pid"], p["started"]) for p in info["processes"]):
            print(f"a local cluster is already running on port {info['port']} (mgpu down stops it)")
            return 0
    if fake_gpus is None:
        from mgpu.agent.gpus import detect_gpus

        gpus, _ = detect_gpus(None)
        fake_gpus = None if gpus else 4
    exe = [sys.executable, "-m", "mgpu"]
    master = _start(
        [*exe, "master", "--port", str(port), "--state-dir", str(state_dir)],
        state_dir / "master.log",
        umask=0o077,  # as the master sets itself, from its first file on
    )
    deadline = time.monotonic() + 30
    while not (state_dir / "join-token").exists() and time.monotonic() < deadline:
        if not _alive(master[0], master[1]):
            break
        time.sleep(0.05)  # the agent needs the join token the master writes at start
    node_argv = [
        *exe,
        "node",
        "--node-id",
        "node001",
        "--master-port",
        str(port),
        "--state-dir",
        str(state_dir),
    ]
    if fake_gpus is not None:
        node_argv += ["--fake-gpus", str(fake_gpus)]
    node = _start(node_argv, state_dir / "node001.log")
    procs = [
        {"role": "master", "pid": master[0], "started": master[1]},
        {"role": "node001", "pid": node[0], "started": node[1]},
    ]
    fd = os.open(pidfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"port": port, "processes": procs}))
    client = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            client = client or _client(state_dir, port)
            nodes = client.nodes()
            if any(n["state"] == "online" for n in nodes):
                break
        except (MgpuError, OSError):
            pass
        if not _alive(master[0], master[1]):
            print(
                f"mgpu: error: the master did not start; see {state_dir / 'master.log'}",
                file=sys.stderr,
            )
            cluster_down(str(state_dir))
            return 1
        time.sleep(0.1)
    else:
        print("mgpu: error: the local cluster did not come up within 30 s", file=sys.stderr)
        return 1
    what = f"{fake_gpus} simulated GPUs" if fake_gpus is not None else "its GPUs"
    print(f"local cluster up: master on 127.0.0.1:{port}, node001 with {what}")
    token = (state_dir / "admin-token").read_text().strip()
    print(f"dashboard: http://127.0.0.1:{port}/#token={token}")
    print(f"state and logs in {state_dir}; stop it with: mgpu down")
    return 0


def cluster_down(state_dir_raw: str | None) -> int:
    state_dir = _state_dir(state_dir_raw)
    pidfile = _pidfile(state_dir)
    if not pidfile.exists():
        print("no local cluster is running")
        return 0
    info = json.loads(pidfile.read_text())
    procs = [p for p in info["processes"] if _alive(p["pid"], p["started"])]
    _cancel_everything(state_dir, info["port"])
    # Agents first, so they do not spin reconnecting to a master that is gone.
    for p in sorted(procs, key=lambda p: p["role"] == "master"):
        with contextlib.suppress(OSError):
            os.killpg(p["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p["pid"], p["started"]) for p in procs):
        time.sleep(0.05)
    for p in procs:
        if _alive(p["pid"], p["started"]):
            with contextlib.suppress(OSError):
                os.killpg(p["pid"], signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    print("local cluster stopped")
    return 0


def _client(state_dir: Path, port: int) -> Client:
    """A client acting as the cluster's owner (the admin token of its state dir)."""
    token = (state_dir / "admin-token").read_text().strip()
    return Client(host="127.0.0.1", port=port, connect_timeout=1.0, timeout=10, token=token)


def _cancel_everything(state_dir: Path, port: int) -> None:
    """Jobs outlive their agent by design; stopping the local cluster should not leave them."""
    try:
        with _client(state_dir, port) as client:
            active = [j["id"] for j in client.queue()["jobs"]]
            for job_id in active:
                client.cancel(job_id)
            if active:
                client.wait_all(active, timeout=15)
    except (MgpuError, OSError):
        pass  # the master is already gone: nothing to ask
