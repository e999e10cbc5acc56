"""A job's fraction of a GPU in the scheduler's share units (apart from state.py, which
the node index and the snapshot it builds from must not import)."""

from __future__ import annotations

from mgpu.model import Job
from mgpu.scheduler.shares import share_units

__all__ = ["job_share_units"]


def job_share_units(job: Job) -> int:
    """The share units each GPU of a fractional job holds (`--gpu-share`); 0 = whole GPUs."""
    return share_units(job.gpu_share) if job.gpu_share else 0
