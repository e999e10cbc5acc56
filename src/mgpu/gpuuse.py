"""The sentence that says who uses a GPU outside mgpu, from its telemetry's JSON.

One sentence for the master (a waiting job's reason, master/monitor/gpuwatch.py) and the
client (`mgpu nodes`): `gpu01 GPU 0 is used outside mgpu (3.0 GiB, pid 679, user bob)`.
Plain values only: the CLI imports it and must start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["memory_text", "outside_use"]


def memory_text(mb: int | float) -> str:
    """`512 MiB`, `3.0 GiB`."""
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"


def outside_use(node_id: str, index: int, telemetry: Mapping[str, Any] | None) -> str:
    """`node GPU i is used outside mgpu (3.0 GiB, pid 679, user bob, and 2 more
    processes)`; the process that holds the most memory is named (pid 0 stands for
    simulated use: no pid is shown)."""
    tel = telemetry or {}
    parts = []
    mb = tel.get("foreign_memory_mb")
    if mb is not None:
        parts.append(memory_text(mb))
    procs = tel.get("foreign") or [{"pid": p} for p in tel.get("foreign_processes") or ()]
    if procs:
        first = procs[0]
        if first.get("pid"):
            parts.append(f"pid {first['pid']}")
        if first.get("user"):
            parts.append(f"user {first['user']}")
        if len(procs) > 1:
            more = len(procs) - 1
            parts.append(f"and {more} more process{'' if more == 1 else 'es'}")
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"{node_id} GPU {index} is used outside mgpu{detail}"
