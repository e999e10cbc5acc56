"""`mgpu top`: a live terminal view of nodes, GPUs and the queue (Rich)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mgpu.client.api import Client, MgpuError
from mgpu.client.render import start_in
from mgpu.client.render import where as render_where
from mgpu.durations import format_duration
from mgpu.safetext import escape_controls

if TYPE_CHECKING:
    from rich.console import RenderableType


def _bar(pct: float | None, width: int = 10) -> str:
    if pct is None:
        return "-"
    filled = round(max(0.0, min(100.0, pct)) / 100 * width)
    colour = "green" if pct < 50 else "yellow" if pct < 85 else "red"
    return f"[{colour}]{'█' * filled}[/][dim]{'·' * (width - filled)}[/] {pct:3.0f}%"


def _mem(tel: dict[str, Any] | None) -> str:
    if not tel or tel.get("memory_used_mb") is None:
        return "-"
    used = tel["memory_used_mb"] / 1024
    total = (tel.get("memory_total_mb") or 0) / 1024
    return f"{used:.1f}/{total:.0f}G" if total else f"{used:.1f}G"


def gpu_state(node: dict[str, Any], gpu: dict[str, Any]) -> str:
    if node["state"] == "offline":
        return "offline"
    if not node.get("connected", True):  # up, but its agent not connected (yet)
        return "reconnecting"
    if gpu.get("busy_job"):
        return "busy"
    if gpu.get("shared_jobs"):
        return f"shared {gpu.get('share_used') or 0:g}"
    if gpu.get("foreign_blocked"):
        return "foreign"
    return "free" if node["state"] == "online" else node["state"]


_STATE_STYLE = {
    "busy": "cyan",
    "shared": "blue",
    "free": "green",
    "foreign": "magenta",
    "offline": "red",
}


def frame(data: dict[str, Any], address: str, error: str | None = None) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def plain(value: str) -> Text:
        """Other users' text as it is: never read as rich markup (`[link=...]` would
        become a terminal hyperlink), its control characters escaped."""
        return Text(escape_controls(value))

    nodes = data.get("nodes", [])
    jobs = data.get("jobs", [])
    total = sum(len(n.get("gpus") or []) for n in nodes)
    busy = sum(
        1 for n in nodes for g in n.get("gpus") or [] if g.get("busy_job") or g.get("shared_jobs")
    )
    online = sum(1 for n in nodes if n["state"] == "online" and n.get("connected", True))
    running = sum(1 for j in jobs if j["state"] == "running")
    queued = sum(1 for j in jobs if j["state"] == "queued")
    head = Text.from_markup(
        f"[bold]mgpu top[/]  {address}  {time.strftime('%H:%M:%S')}   "
        f"nodes [bold]{online}[/]/{len(nodes)} online   GPUs [bold]{busy}[/]/{total} busy   "
        f"jobs [bold]{running}[/] running, [bold]{queued}[/] queued"
    )
    parts: list[RenderableType] = [head]
    if error:
        parts.append(Text(f"! {escape_controls(error)}", style="bold red"))

    gt = Table(title="Nodes and GPUs", title_justify="left", expand=False, pad_edge=False)
    for col in ("NODE", "GPU", "STATE", "JOB", "USER", "UTIL", "MEM", "TEMP"):
        gt.add_column(col, no_wrap=True)
    for n in nodes:
        gpus = n.get("gpus") or []
        if not gpus:
            gt.add_row(plain(n["node_id"]), "-", plain(n["state"]), "", "", "", "", "")
        for i, g in enumerate(gpus):
            tel = g.get("telemetry") or {}
            state = gpu_state(n, g)
            if state == "foreign":
                state = f"foreign {tel.get('foreign_memory_mb') or 0}M"
            temp = tel.get("temperature_c")
            style = _STATE_STYLE.get(state.split()[0], "yellow")
            tenants = g.get("shared_jobs") or []
            gt.add_row(
                plain(n["node_id"] if i == 0 else ""),
                str(g["index"]),
                Text(state, style=style),
                plain(
                    g.get("busy_job") or " ".join(f"{t['job_id']}({t['share']:g})" for t in tenants)
                ),
                plain(
                    g.get("busy_user") or ",".join(sorted({t.get("user") or "?" for t in tenants}))
                ),
                _bar(tel.get("utilization_pct")),
                _mem(tel),
                "-" if temp is None else f"{temp:.0f}°C",
            )
    parts.append(gt)

    qt = Table(title="Queue", title_justify="left", expand=False, pad_edge=False)
    for col in ("JOBID", "NAME", "USER", "STATE", "GPUS", "TIME", "START", "NODES (REASON)"):
        qt.add_column(col, no_wrap=True)
    now = time.time()
    order = {"running": 0, "queued": 1}
    for j in sorted(jobs, key=lambda j: (order.get(j["state"], 2), j.get("submit_time") or 0)):
        start = j.get("start_time")
        alloc = j.get("allocation") or []
        if j["state"] == "running" and alloc:
            where = render_where(j)
        else:
            where = f"({j.get('reason') or j['state']})"
        shown = plain(j["state"])
        if j.get("idle"):
            shown.append(" idle", style="bold magenta")
        qt.add_row(
            plain(j["id"]),
            plain((j.get("name") or "")[:20]),
            plain(j["user"]),
            shown,
            f"{j['gpu_share']:g}" if j.get("gpu_share") else str(j["gpus"]),
            format_duration(now - start, "clock") if start else "-",
            start_in(j.get("expected_start"), now) if j["state"] == "queued" else "",
            plain(where),
        )
    if not jobs:
        qt.add_row("(no jobs)", "", "", "", "", "", "", "")
    parts.append(qt)
    return Group(*parts)


def run_top(client: Client, once: bool = False, interval: float = 1.0) -> int:
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        raise MgpuError("mgpu top needs the rich package (pip install rich)") from None

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    if once:
        console.print(frame(client.queue(), client.address))
        return 0
    data: dict[str, Any] = {"jobs": [], "nodes": []}
    with Live(console=console, auto_refresh=False, screen=False) as live:
        try:
            while True:
                error = None
                try:
                    data = client.queue()
                except MgpuError as e:
                    error = str(e)
                live.update(frame(data, client.address, error), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
    return 0
