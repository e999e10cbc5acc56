"""`mgpu node --health`: the checks a node agent needs to pass to do its work."""

from __future__ import annotations

import http.client
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from mgpu.agent.options import AgentOptions


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def check_gpus(fake_gpus: int | None, gpu_count: int | None = None) -> Check:
    from mgpu.agent.gpus import GpuCountError, detect_gpus

    try:
        gpus, source = detect_gpus(fake_gpus, count=gpu_count)
    except GpuCountError as e:
        return Check("GPUs visible", False, str(e))
    except Exception as e:  # a broken driver must give a failed check, not a traceback
        return Check("GPUs visible", False, f"GPU detection failed: {e}")
    if source == "fake":
        return Check("GPUs visible", True, f"{len(gpus)} simulated GPU(s) (--fake-gpus)")
    if not gpus:
        return Check("GPUs visible", False, "no GPU found through NVML or nvidia-smi")
    names = sorted({g.name for g in gpus})
    return Check("GPUs visible", True, f"{len(gpus)} GPU(s) via {source}: {', '.join(names)}")


def check_spool(state_dir: Path, node_id: str) -> Check:
    spool = state_dir / f"node-{node_id}" / "spool"
    try:
        spool.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=spool, prefix=".health-")
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            os.unlink(path)
    except OSError as e:
        return Check("spool writable", False, f"{spool}: {e.strerror or e}")
    return Check("spool writable", True, str(spool))


def check_containment(state_dir: Path, node_id: str) -> Check:
    """How this node's agent contains jobs (what `mgpu node` picks at start): a cgroup per
    job, or only the process tree (escaped processes may outlive their job)."""
    from mgpu.agent import cgroups

    spool = state_dir / f"node-{node_id}" / "spool"
    key = cgroups.agent_key(node_id, spool)
    containment = cgroups.choose(key)
    if containment.base is not None:
        cgroups.release(containment.base)  # made by the probe; the agent makes it again
    detail = containment.method
    if containment.method == cgroups.PROCESS_TREE:
        detail += " (no usable cgroup here: processes that leave the job's tree may outlive it)"
    return Check("job containment", True, detail)


def check_gpu_isolation(state_dir: Path, node_id: str, gpu_device_dir: Path) -> Check:
    """How this node's agent keeps jobs off GPUs they were not given (what `mgpu node`
    picks at start, with its containment): device rules per job, or none."""
    from mgpu.agent import cgroups, devices

    key = cgroups.agent_key(node_id, state_dir / f"node-{node_id}" / "spool")
    containment = cgroups.choose(key)
    isolation = devices.choose(key, gpu_device_dir, containment)
    for base in (isolation.base, containment.base):
        if base is not None:
            cgroups.release(base)  # made by the probe; the agent makes it again
    detail = isolation.describe()
    if isolation.method == devices.NONE and isolation.devices:
        detail += ": a job can open every GPU"
    return Check("GPU isolation", True, detail)


def check_gpu_shares(state_dir: Path, node_id: str) -> Check:
    """Whether `--gpu-share` jobs are held to their limits here (MPS), which the agent
    says in its telemetry too; not a failure: without MPS the limits are advisory."""
    from mgpu.agent.mps import MpsControl

    return Check("GPU shares", True, MpsControl(state_dir / f"node-{node_id}").describe())


def _healthz(host: str, port: int, tls: bool, timeout: float) -> str | None:
    """None if an mgpu master answers /healthz there, else why not."""
    conn: http.client.HTTPConnection
    if tls:
        import ssl

        # Reachability only: nothing secret is sent, so the certificate is not checked here.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as e:
        return f"cannot reach it: {e}"
    finally:
        conn.close()
    if resp.status != 200:
        return f"it answered HTTP {resp.status}"
    try:
        status = json.loads(body).get("status")
    except (ValueError, AttributeError):
        status = None
    return None if status == "ok" else "it does not look like an mgpu master"


def check_master(host: str, port: int, timeout: float = 3.0) -> Check:
    from mgpu.credentials import is_loopback

    where = f"{host}:{port}"
    order = (False, True) if is_loopback(host) else (True, False)
    errors = []
    for tls in order:
        why = _healthz(host, port, tls, timeout)
        if why is None:
            return Check("master reachable", True, f"{where} ({'https' if tls else 'http'})")
        errors.append(why)
        if "Connection refused" in why or "timed out" in why:
            break  # nothing listens there: the other scheme will not help
    return Check("master reachable", False, f"{where}: {errors[0]}")


def check_masters(addresses: list[tuple[str, int]], timeout: float = 3.0) -> Check:
    """Several masters (one leads, the others stand by): passes when one answers."""
    if len(addresses) == 1:
        return check_master(*addresses[0], timeout=timeout)
    results = [check_master(host, port, timeout) for host, port in addresses]
    return Check(
        "master reachable", any(r.ok for r in results), "; ".join(r.detail for r in results)
    )


def run_health(options: AgentOptions, out: TextIO | None = None) -> int:
    """Print one line per check; 0 if all pass, else 1."""
    out = out or sys.stdout
    o = options
    checks = [
        check_gpus(o.fake_gpus, o.gpu_count),
        check_spool(o.state_dir, o.node_id),
        check_masters(o.addresses),
        check_containment(o.state_dir, o.node_id),
        check_gpu_isolation(o.state_dir, o.node_id, o.gpu_device_dir),
        check_gpu_shares(o.state_dir, o.node_id),
    ]
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}", file=out)
    failed = [c for c in checks if not c.ok]
    print(
        f"node {o.node_id}: " + ("healthy" if not failed else f"{len(failed)} check(s) failed"),
        file=out,
    )
    return 0 if not failed else 1
