"""The agent's heartbeats: one at once on each connection and then every interval (the
master sets it), each with a GPU telemetry sample and the running jobs' peak memory so far;
and on each beat the MPS daemon and limits brought in line with the running jobs, in a
thread the heartbeat does not wait for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from mgpu.agent.gpus import GpuInfo
from mgpu.agent.launcher import Launcher
from mgpu.agent.mps import MpsControl
from mgpu.protocol import Heartbeat, RunMemory

log = logging.getLogger("mgpu.agent")


class Heartbeats:
    def __init__(
        self,
        launcher: Launcher,
        mps: MpsControl,
        send: Callable[[BaseModel], None],
        interval: Callable[[], float],
    ) -> None:
        self.launcher = launcher
        self.mps = mps
        self.send = send
        self.interval = interval
        """Seconds between heartbeats, as the master set it last."""
        self._settling: asyncio.Future[None] | None = None
        """The MPS settle in progress (`_settle_mps`), if any."""

    async def beat(self, gpus: list[GpuInfo], gpu_source: str) -> None:
        """Heartbeats until cancelled (the connection ended)."""
        from mgpu.agent.telemetry import TelemetrySampler

        node_dir = self.launcher.spool.parent
        sampler = TelemetrySampler(gpus, gpu_source, node_dir, self.mps.enforced)
        telemetry: list[Any] = []
        while True:
            pids = [run.rec.pid for run in self.launcher.running.values()]
            as_of = time.monotonic()
            jobs = [run.rec.job_id for run in self.launcher.running.values()]
            try:
                self._settle_mps(jobs, as_of)
                telemetry = await asyncio.wait_for(
                    asyncio.to_thread(sampler.sample, pids), timeout=5.0
                )
            except Exception as e:  # a heartbeat must go out even when sampling fails
                log.warning("GPU telemetry failed: %s", e)
            self.send(Heartbeat(telemetry=telemetry, memory=self._peaks()))
            await asyncio.sleep(self.interval())

    def _peaks(self) -> list[RunMemory]:
        """The running runs' peak memory so far (none, if the counters cannot be read)."""
        try:
            peaks = self.launcher.peaks()
            return [RunMemory(job_id=j, epoch=e, max_rss_mb=mb) for j, e, mb in peaks]
        except Exception as e:
            log.warning("reading the jobs' memory failed: %s", e)
            return []

    def _settle_mps(self, jobs: list[str], as_of: float) -> None:
        """MPS limits and daemon brought in line with the running jobs (stopped when no
        shared job needs it), in a thread: a control command may take seconds.  One at a
        time; a heartbeat that finds one running skips it."""
        if self._settling is not None and not self._settling.done():
            return

        def settle() -> None:
            try:
                self.mps.settle(jobs, as_of)
            except Exception:
                log.exception("settling the MPS daemon failed")

        self._settling = asyncio.get_running_loop().run_in_executor(None, settle)
