"""mgpu on this machine's real NVIDIA GPUs (issue 22): what the H200 run showed to hold,
and the defects it found, kept fixed.  Jobs use the GPU through cuda.py (ctypes on
libcuda); the utilisation and NCCL tests need PyTorch with CUDA and skip without it.

Run with `make gpu-test`; skipped where there is no GPU (conftest.py)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from realgpu import (
    CUDA,
    HEARTBEAT,
    IDLE_MINUTES,
    NODE,
    RealCluster,
    environ_without_mgpu,
    nvml_processes,
    python_job,
)

from helpers import BIN, kill_group, wait_for

SAMPLED = 2 * HEARTBEAT + 0.5
"""Two heartbeats, and the half second a sample may take on a busy GPU."""


def torch_cuda() -> str | None:
    """Why PyTorch cannot use CUDA next to this Python, or None when it can."""
    probe = "import torch; print(torch.cuda.is_available())"
    try:
        res = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return "importing torch took over 2 minutes"
    if res.returncode != 0:
        return "torch is not installed next to this Python"
    return None if res.stdout.strip() == "True" else "torch was built without CUDA"


def idle_gpu(c: RealCluster) -> dict[str, Any]:
    """A GPU no job holds and no process uses, as a heartbeat sent after that was seen
    says it (an earlier test's job or process may have just gone)."""

    def find() -> dict[str, Any] | None:
        for g in c.node()["gpus"]:
            free = not g["busy_job"] and not g["shared_jobs"]
            if free and not nvml_processes(g["index"]):
                return g  # type: ignore[no-any-return]
        return None

    index = wait_for(find, timeout=30, what="a GPU without jobs or processes")["index"]
    since = time.time()

    def sampled() -> dict[str, Any] | None:
        node = c.node()
        g = next(g for g in node["gpus"] if g["index"] == index)
        tel = g["telemetry"] or {}
        fresh = node["last_seen"] >= since + HEARTBEAT and tel.get("foreign_memory_mb") is not None
        return g if fresh else None  # type: ignore[no-any-return]

    return wait_for(sampled, timeout=10 * HEARTBEAT + 5, what=f"a fresh sample of GPU {index}")


def gpu_of(c: RealCluster, job_id: str) -> int:
    (gpu,) = c.client().show(job_id)["allocation"][0]["gpu_ids"]
    return int(gpu)


def ended(c: RealCluster, job_id: str, timeout: float = 120) -> str:
    """The output of a job that must complete."""
    done = c.client().wait(job_id, timeout=timeout)
    out = c.client().logs(job_id)
    assert done["state"] == "completed", f"{done['state']}: {done.get('reason')}\n{out}"
    return out


# ---- detection ---------------------------------------------------------------


def test_detection_through_nvml_and_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    from mgpu.agent.gpus import detect_gpus

    nvml, source = detect_gpus()
    assert source == "nvml" and nvml
    if any(g.mig for g in nvml):
        pytest.skip("MIG instances: nvidia-smi lists their parents, NVML the instances")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML bindings: the fallback
    smi, source = detect_gpus()
    assert source == "nvidia-smi"
    assert [(g.index, g.name, g.uuid) for g in smi] == [(g.index, g.name, g.uuid) for g in nvml]
    assert all(abs(a.memory_mb - b.memory_mb) <= 1 for a, b in zip(smi, nvml, strict=True))
    print(f"\nGPUs: {', '.join(f'{g.index}: {g.name} ({g.memory_mb} MiB)' for g in nvml)}")


def no_mig(c: RealCluster) -> None:
    """Skip on MIG instances: they are named by other UUIDs in nvidia-smi and CUDA."""
    if any((g["uuid"] or "").startswith("MIG-") for g in c.node()["gpus"]):
        pytest.skip("this machine's GPUs are in MIG mode")


def test_the_agent_found_them_through_nvml(gpus: RealCluster) -> None:
    no_mig(gpus)
    node = gpus.node()
    assert node["gpu_source"] == "nvml"
    res = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sorted(g["uuid"] for g in node["gpus"]) == sorted(res.stdout.split())


# ---- isolation -----------------------------------------------------------------


def test_a_job_sees_exactly_its_gpu(gpus: RealCluster) -> None:
    no_mig(gpus)
    job = gpus.submit("--gpus", "1", python_job("uuids"))
    out = ended(gpus, job)
    uuid = gpus.gpu(gpu_of(gpus, job))["uuid"]
    assert f"count=1 uuids={uuid}" in out, out


def test_a_cpu_job_cannot_open_a_gpu(gpus: RealCluster) -> None:
    isolation = gpus.node()["gpu_isolation"]
    if isolation in (None, "none"):
        pytest.skip(f"the agent keeps jobs off GPUs by {isolation!r} here (needs root)")
    job = gpus.submit("--gpus", "0", f"{python_job('open-device')}; {python_job('uuids')}")
    out = ended(gpus, job)
    assert "open errno=1" in out, out  # EPERM: the job's device rules
    assert "count=0 " in out, out


# ---- telemetry -------------------------------------------------------------------


def test_telemetry_within_two_heartbeats_and_a_jobs_use_is_its_own(gpus: RealCluster) -> None:
    index = idle_gpu(gpus)["index"]
    before = gpus.gpu(index)["telemetry"]["memory_used_mb"]
    job = gpus.submit("--node-gpu-ids", f"{NODE}:{index}", python_job("hold", "2048"))
    try:
        gpus.said(job, "holding 2048")
        t0 = time.monotonic()

        def seen() -> dict[str, Any] | None:
            tel: dict[str, Any] = gpus.gpu(index)["telemetry"] or {}
            return tel if (tel.get("memory_used_mb") or 0) >= before + 2048 else None

        tel = wait_for(seen, timeout=10, what="the job's memory in the telemetry")
        assert time.monotonic() - t0 <= SAMPLED
        assert tel["foreign"] == [] and tel["foreign_memory_mb"] is None, tel
        assert not gpus.gpu(index)["foreign_blocked"]
    finally:
        gpus.cancel(job)


BURN = """
import os, time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
(x @ x).sum().item()
os.write(1, b"burning\\n")
end = time.monotonic() + 60
while time.monotonic() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
"""


@pytest.mark.timeout(300)
def test_utilisation_within_two_heartbeats(gpus: RealCluster) -> None:
    why = torch_cuda()
    if why is not None:
        pytest.skip(why)
    script = gpus.root / "burn.py"
    script.write_text(BURN)
    job = gpus.submit("--gpus", "1", f"{sys.executable} {script}")
    try:
        gpus.said(job, "burning")
        t0 = time.monotonic()
        index = gpu_of(gpus, job)

        def busy() -> dict[str, Any] | None:
            tel: dict[str, Any] = gpus.gpu(index)["telemetry"] or {}
            return tel if (tel.get("utilization_pct") or 0) >= 90 else None

        tel = wait_for(busy, timeout=10, what="the GPU's utilisation")
        assert time.monotonic() - t0 <= SAMPLED
        print(f"\nGPU {index}: {tel['utilization_pct']} %, {tel['power_w']} W")
    finally:
        gpus.cancel(job)


# ---- use outside mgpu ------------------------------------------------------------------


def test_the_drivers_reserve_is_not_use_outside_mgpu(gpus: RealCluster) -> None:
    """An idle H200 reports 615 MiB used through NVML's v1 query with no process: with a
    512 MiB threshold it was never allocated again.  Used memory reads as nvidia-smi's."""
    g = idle_gpu(gpus)
    tel = g["telemetry"]
    assert tel["foreign_memory_mb"] == 0, tel
    assert not g["foreign_blocked"]
    res = subprocess.run(
        [
            "nvidia-smi",
            f"--id={g['index']}",
            "--query-gpu=memory.used",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert abs(tel["memory_used_mb"] - int(res.stdout)) <= 16, (tel, res.stdout)


def test_use_outside_mgpu_holds_the_gpu_back_and_is_said(gpus: RealCluster) -> None:
    g = idle_gpu(gpus)
    index = g["index"]
    env = dict(environ_without_mgpu(), CUDA_VISIBLE_DEVICES=g["uuid"])
    holder = subprocess.Popen(
        [sys.executable, str(CUDA), "hold", "3072"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    job = None
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("holding 3072")
        wait_for(lambda: gpus.gpu(index)["foreign_blocked"], timeout=SAMPLED + 5)
        job = gpus.submit("--node-gpu-ids", f"{NODE}:{index}", "true")
        user = re.escape(pwd.getpwuid(os.getuid()).pw_name)  # as /proc says
        who = rf"\(\d+\.\d GiB, pid {holder.pid}, user {user}\)"
        said = rf"{NODE} GPU {index} is used outside mgpu {who}"

        def reason() -> str | None:
            why = gpus.client().show(job)["reason"] or ""
            return why if re.fullmatch(rf"waiting for GPU {index} on {NODE}: {said}", why) else None

        wait_for(reason, timeout=10, what="the waiting job saying why")
        assert re.search(said, gpus.cli("queue", check=True).stdout)
        assert re.search(said.removeprefix(f"{NODE} "), gpus.cli("nodes", check=True).stdout)
        assert gpus.client().show(job)["state"] == "queued"
        holder.kill()
        holder.wait(timeout=10)
        gone = time.time()
        done = gpus.client().wait(job, timeout=30)
        assert done["state"] == "completed"
        assert done["start_time"] - gone <= 5.0  # the H200 run: 1.3 s
    finally:
        kill_group(holder)
        if job is not None:
            gpus.cancel(job)


# ---- cancel --------------------------------------------------------------------------------


def test_cancel_frees_the_memory_of_the_job_and_its_grandchildren(gpus: RealCluster) -> None:
    hold = python_job("hold", "1024")
    job = gpus.submit("--gpus", "1", f"setsid {hold} & {hold}")

    def both_holding() -> str | None:
        out = gpus.client().logs(job)
        return out if out.count("holding 1024") == 2 else None

    out = wait_for(both_holding, timeout=60, what="both holders")
    index = gpu_of(gpus, job)
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    assert pids <= {p for p, _ in nvml_processes(index)}
    t0 = time.monotonic()
    gpus.client().cancel(job)
    wait_for(
        lambda: not pids & {p for p, _ in nvml_processes(index)},
        timeout=10,
        what="the GPU memory freed",
    )
    freed = time.monotonic() - t0
    assert freed <= 1.0, f"{freed:.2f} s"  # the H200 run: 0.4 s
    print(f"\nfreed in {freed:.2f} s")


# ---- shares --------------------------------------------------------------------------------


def test_two_half_shares_run_side_by_side(gpus: RealCluster) -> None:
    """Side by side on one GPU; held to their halves where the node has MPS (the agent
    started its daemon, and stops it when they are gone), told otherwise."""
    mps = shutil.which("nvidia-cuda-mps-control") is not None
    hold = python_job("hold", "1024")
    command = f"{python_job('over-limit')}; {hold}" if mps else hold
    jobs = [gpus.submit("--gpu-share", "0.5", "--policy", "fill_first", command) for _ in range(2)]
    try:
        outs = [gpus.said(j, "holding 1024") for j in jobs]
        shown = [gpus.client().show(j) for j in jobs]
        assert all(s["state"] == "running" for s in shown)
        (gpu,) = {tuple(s["allocation"][0]["gpu_ids"]) for s in shown}
        tel = gpus.gpu(gpu[0])["telemetry"]
        assert tel["shares_enforced"] is mps
        if mps:
            assert gpus.mps_running()  # the agent's daemon
            assert all("over-limit refused" in o for o in outs), outs
        else:
            for j in jobs:
                gpus.said(j, "does not hold GPU shares to their limits", timeout=SAMPLED + 5)
            assert "GPU shares not enforced (no MPS)" in gpus.cli("nodes", check=True).stdout
    finally:
        gpus.cancel(*jobs)
    if mps:
        wait_for(
            lambda: not gpus.mps_running(),
            timeout=SAMPLED + 15,
            what="the MPS daemon stopped after the shares",
        )


def test_a_share_that_unsets_its_limits_is_still_held_by_its_mps_server(
    gpus: RealCluster,
) -> None:
    """Issue 25: a share's limits are not only its own variables.  The job unsets
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, then tries to
    allocate 1 GiB more than its share of the GPU's memory: its user's MPS server, whose
    limits the agent set before the job started, refuses it."""
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("no nvidia-cuda-mps-control on this machine: shares are not enforced")
    unset = "-u CUDA_MPS_ACTIVE_THREAD_PERCENTAGE -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
    command = (
        'echo "unset=${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-yes}"; '
        f'env {unset} sh -c \'echo "inside=${{CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-unset}}"; '
        f"{python_job('over-limit')}'"
    )
    job = gpus.submit("--gpu-share", "0.5", command)
    out = ended(gpus, job)
    said = [line for line in gpus.log(NODE).splitlines() if "MPS" in line]  # the agent's
    assert "inside=unset" in out, out  # the job really ran without its variables
    assert "over-limit refused" in out, f"{out}\nthe agent on MPS:\n" + "\n".join(said)
    assert not [line for line in said if "MPS control" in line and "failed" in line], said
    wait_for(
        lambda: not gpus.mps_running(),
        timeout=SAMPLED + 15,
        what="the MPS daemon stopped after the share",
    )


# ---- idle ------------------------------------------------------------------------------------


def test_a_job_that_leaves_its_gpu_idle_is_flagged(gpus: RealCluster) -> None:
    job = gpus.submit("--gpus", "1", "sleep 300")
    try:
        gpus.running(job)
        t0 = time.monotonic()
        limit = IDLE_MINUTES * 60
        wait_for(lambda: gpus.client().show(job)["idle"], timeout=limit + 10, what="idle")
        assert time.monotonic() - t0 >= limit - SAMPLED
    finally:
        gpus.cancel(job)


# ---- torchrun ------------------------------------------------------------------------------


TRAIN = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (x @ x).sum().item()
    name = torch.cuda.get_device_name()
    os.write(1, f"RESULT rank={rank} world={world} sum={t.item():g} gpu={name}\\n".encode())
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.timeout(420)  # importing torch and NCCL's start take their time
def test_torchrun_with_nccl(gpus: RealCluster) -> None:
    why = torch_cuda()
    torchrun = BIN / "torchrun"
    if why is not None or not torchrun.exists():
        pytest.skip(why or "no torchrun next to this Python")
    n = min(2, len(gpus.node()["gpus"]))
    script = gpus.root / "train.py"
    script.write_text(TRAIN)
    res = gpus.cli(
        "srun", "--gpus", str(n), "--distributed", "--", str(torchrun), str(script), timeout=300
    )
    if res.returncode != 0:
        pytest.fail(f"srun exited {res.returncode}\n{res.stdout}\n--- stderr:\n{res.stderr}")
    results = re.findall(r"RESULT rank=(\d+) world=(\d+) sum=(\S+)", res.stdout)
    assert sorted(int(r) for r, _, _ in results) == list(range(n)), res.stdout
    assert {(w, s) for _, w, s in results} == {(str(n), f"{n * (n + 1) // 2}")}
