"""What the GPU tier's tests share: a master and agent on this machine's real GPUs, and
how to tell whether there are any."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import BIN, LocalCluster, wait_for
from mgpu.agent.mps import pipe_dir

HERE = Path(__file__).resolve().parent
CUDA = HERE / "cuda.py"
"""The jobs' CUDA calls (ctypes on libcuda: no PyTorch needed)."""
HEARTBEAT = 0.5
IDLE_MINUTES = 0.1
THRESHOLD_MB = 512
"""The threshold an idle H200's 615 MiB driver reserve once crossed (issue 22)."""
CONFIG = f"""
networking: {{heartbeat_interval: {HEARTBEAT}, timeout: 10}}
scheduling:
  idle_after_minutes: {IDLE_MINUTES}
  idle_action: none
  foreign_memory_threshold_mb: {THRESHOLD_MB}
"""
NODE = "gpu01"


@functools.cache
def why_no_gpu() -> str | None:
    """Why this machine cannot run the GPU tier, or None when it can."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on this machine"
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi -L failed: {e}"
    if res.returncode != 0 or "GPU " not in res.stdout:
        return f"nvidia-smi -L found no GPU: {(res.stdout or res.stderr).strip()[:200]}"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as e:  # ImportError, NVMLError: either way no NVML here
        return f"NVML does not start: {e}"
    return None


class RealCluster(LocalCluster):
    """A master and one agent on this machine's real GPUs."""

    def start_real_agent(self, node_id: str = NODE) -> dict[str, Any]:
        argv = [str(BIN / "mgpu"), "node", "--node-id", node_id]
        argv += ["--master-port", str(self.port), "--state-dir", str(self.root / "agent")]
        # The agent's own MPS directories: a daemon it starts stays out of the site's.
        env = dict(self.env)
        self.env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.root / "mps")
        self.env["CUDA_MPS_LOG_DIRECTORY"] = str(self.root / "mps-log")
        try:
            self.agents[node_id] = self._spawn(argv, self.root / f"{node_id}.log")
        finally:
            self.env = env
        return self.wait_node(node_id, "online", timeout=60)

    def node(self) -> dict[str, Any]:
        (node,) = self.client().nodes()
        return node  # type: ignore[no-any-return]

    def gpu(self, index: int) -> dict[str, Any]:
        return next(g for g in self.node()["gpus"] if g["index"] == index)  # type: ignore[no-any-return]

    def cancel(self, *job_ids: str) -> None:
        """Cancel jobs that may have ended already (then there is nothing to do)."""
        self.cli("cancel", *job_ids)

    def stop(self) -> None:
        """Stop the cluster, and an MPS daemon its agent left running (a failed test)."""
        super().stop()
        pipes = self.root / "mps"
        if self.mps_running() and shutil.which("nvidia-cuda-mps-control"):
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipes))
            subprocess.run(
                ["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=30
            )

    def mps_running(self) -> bool:
        """Whether the MPS daemon the agent starts (in this cluster's pipe directory) runs:
        driver 580's leaves its control socket on disk when it quits, so ask it."""
        return pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(self.root / "mps")}) is not None

    def submit(self, *args: str) -> str:
        return self.cli("submit", *args, check=True).stdout.strip()

    def running(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            shown = self.client().show(job_id)
            if shown["state"] not in ("queued", "running"):
                raise AssertionError(f"job {job_id} ended: {shown}\n{self.client().logs(job_id)}")
            return shown if shown["state"] == "running" else None

        return wait_for(check, timeout=timeout, what=f"job {job_id} running")

    def said(self, job_id: str, text: str, timeout: float = 60) -> str:
        """The job's output once it holds `text`."""

        def check() -> str | None:
            out = self.client().logs(job_id)
            return out if text in out else None

        return wait_for(check, timeout=timeout, what=f"{text!r} in job {job_id}'s output")


def python_job(*args: str) -> str:
    """A job command running cuda.py with this Python."""
    return " ".join([sys.executable, str(CUDA), *args])


@functools.cache
def _nvml() -> Any:
    """pynvml, initialised once for the test process (an init per look costs tens of ms,
    more than the cancel test's measure can spare)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def nvml_processes(index: int) -> list[tuple[int, int]]:
    """(pid, MiB) of the compute processes on GPU `index`, read now through NVML."""
    nvml = _nvml()
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index))
    return [(int(p.pid), int(p.usedGpuMemory or 0) // (1 << 20)) for p in procs]


def environ_without_mgpu() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MGPU_")}
