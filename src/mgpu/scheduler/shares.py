"""Fractional GPUs (`--gpu-share F`): exact share units, and how a request's size is counted.

A share is kept as whole thousandths of one GPU (`SHARE_UNITS` = 1000 is a whole GPU), so
shares add up exactly: ten jobs of 0.1 fill a GPU, four of 0.25 too, with no rounding
residue deciding whether one more fits.  A GPU is either free, whole-allocated, or shared
(its fractional jobs' units add up to at most 1000); a whole-GPU job never runs beside
shares.  Where a fractional job goes is decided in `placement.py` (`FreePool` keeps the
shared GPUs and their room).
"""

from __future__ import annotations

import math

from .types import SHARE_UNITS, JobRequest

__all__ = ["SHARE_UNITS", "format_share", "gpu_units", "share_units"]


def share_units(fraction: float) -> int:
    """`--gpu-share F` as share units (0.25 -> 250); ValueError with one sentence if F is not
    a fraction of one GPU strictly between 0 and 1, in steps of at least 0.001."""
    if not isinstance(fraction, int | float) or not math.isfinite(fraction):
        raise ValueError("--gpu-share must be a number between 0 and 1, such as 0.25")
    if not 0 < fraction < 1:
        raise ValueError(
            f"--gpu-share must be between 0 and 1 (a fraction of one GPU), got {fraction:g}"
        )
    units = round(fraction * SHARE_UNITS)
    if units < 1 or units >= SHARE_UNITS:
        raise ValueError(
            f"--gpu-share {fraction:g} is finer than the smallest share of "
            f"1/{SHARE_UNITS} of a GPU; use 0.001 to 0.999"
        )
    return units


def format_share(units: int) -> str:
    """Share units as the fraction a user typed: 250 -> `0.25`, 1000 -> `1`."""
    text = f"{units / SHARE_UNITS:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def gpu_units(req: JobRequest, whole_gpus: int) -> int:
    """What `req` occupies in share units (its share, or `whole_gpus` x 1000): what per-user
    GPU limits count."""
    return req.gpu_share if req.gpu_share else whole_gpus * SHARE_UNITS
