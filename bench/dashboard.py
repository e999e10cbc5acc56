"""The web dashboard at scale: first render and interactivity in headless Chromium.

For each node count this script starts a master (as mgpu.testing.LocalCluster does) and
bench/swarm.py's simulated nodes (one process, the real protocol, 8 GPUs each, jobs that
run for hours), fills it with work and opens the dashboard in headless Chromium (Python
Playwright, the system's Chromium, CHROMIUM_ARGS from mgpu.testing):

- running: 9/16 of the GPUs busy with one-GPU jobs (4,500 at 1,000 nodes), as arrays from
  four users;
- queued: --queued jobs (100,000 by default) waiting on a dependency, as four arrays;

and waits until the master is quiet again (/healthz answered within 50 ms 20 times in a
row: the garbage collection and passes that follow a big submit are the master's figure,
recorded apart).

Then it measures, with the machine's load average beside each figure:

- first render, the median of --loads page loads: from navigation start to the page's
  `performance.mark("mgpu-ready")` (set once the heat map and the first page of jobs are
  drawn); a page without that mark (the old dashboard) is timed to the moment its node
  list and queue are in the DOM;
- DOM elements after the first render, and the JS heap;
- the longest main-thread task (PerformanceObserver "longtask") during the load and
  over --watch seconds of idle polling, and the bytes the polls fetched in that window;
- interactions: a node found by name, the job list filtered by user, the next page.

Prints a table and writes bench/results/dashboard.json.  Not a test;
tests/e2e/test_dashboard_scale.py checks the same page at 1,000 nodes with loose bounds.

    python bench/dashboard.py [--nodes 50,1000] [--queued 100000] [--watch 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from swarm import SwarmProcess, load  # bench/ is not a package: found through sys.path

from mgpu.client.api import Client
from mgpu.testing import CHROMIUM_ARGS, LocalCluster, page_errors, wait_for

RESULTS = Path(__file__).resolve().parent / "results"
USERS = ("alice", "bob", "carol", "dave")
BUSY_SHARE = 9 / 16  # 4,500 of 8,000 GPUs at 1,000 nodes

# Collected from the page's first instant: long tasks (the main thread busy > 50 ms).
OBSERVE = """
window.__longtasks = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) window.__longtasks.push([e.startTime, e.duration]);
}).observe({ type: "longtask", buffered: true });
"""

# The old dashboard sets no mark: it is ready when every node and the queue are drawn.
OLD_READY = """(n) => document.querySelectorAll('#nodes .node').length >= n
  && document.querySelector('#queue tr, #queue .empty') !== null"""


def fill(cluster: LocalCluster, nodes: int, gpus: int, queued: int) -> dict[str, Any]:
    """The running and queued work; returns what was submitted and how long it took."""
    running = round(nodes * gpus * BUSY_SHARE)
    out: dict[str, Any] = {"running_wanted": running, "queued_wanted": queued}
    with Client(cluster.address, token=cluster.admin_token, timeout=600) as client:
        t0 = time.monotonic()
        anchor = client.submit(["sleep", "inf"], gpus=1, name="anchor", user=USERS[0], env={})
        left = running - 1
        for k, user in enumerate(USERS):
            share = left // len(USERS) + (k < left % len(USERS))
            if share:
                client.submit(
                    ["train"], gpus=1, name=f"train-{user}", user=user, array=f"0-{share - 1}",
                    env={},
                )  # fmt: skip

        def busy() -> int | None:
            count = sum(1 for n in client.nodes() for g in n["gpus"] if g["busy_job"] is not None)
            return count if count >= running else None

        out["running"] = wait_for(busy, timeout=600, interval=0.5, what="running jobs started")
        out["running_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        for k, user in enumerate(USERS):
            share = queued // len(USERS) + (k < queued % len(USERS))
            if share:
                client.submit(
                    ["sweep"], gpus=1, name=f"sweep-{user}", user=user, array=f"0-{share - 1}",
                    dependency=f"afterok:{anchor.id}", env={},
                )  # fmt: skip
        out["queued_s"] = round(time.monotonic() - t0, 1)
    return out


def settle(cluster: LocalCluster, quiet_ms: float = 50.0, run: int = 20) -> dict[str, Any]:
    """Wait until the master answers /healthz within `quiet_ms` `run` times in a row (0.1 s
    apart): the submissions' aftermath (a full garbage collection of 100k jobs, the
    passes that follow) is the master's figure, not the page's.  Returns how long that took
    and the longest answer seen meanwhile."""
    t0, streak, worst = time.monotonic(), 0, 0.0
    while streak < run and time.monotonic() - t0 < 120:
        t = time.perf_counter()
        with urllib.request.urlopen(f"http://{cluster.address}/healthz", timeout=60) as r:
            r.read()
        took = (time.perf_counter() - t) * 1000
        worst = max(worst, took)
        streak = streak + 1 if took < quiet_ms else 0
        time.sleep(0.1)
    return {"settle_s": round(time.monotonic() - t0, 1), "settle_worst_ms": round(worst)}


def open_pages(
    browser: Any, cluster: LocalCluster, nodes: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The page opened --loads times (a new tab each; the first render of each, and its
    median), the last one measured in full."""
    renders: list[float | None] = []
    for _ in range(args.loads - 1):
        run = open_page(browser, cluster, nodes, args.timeout, 0.0, full=False)
        renders.append(run["first_render_s"])
        if run["first_render_s"] is None:
            return run
    out = open_page(browser, cluster, nodes, args.timeout, args.watch)
    renders.append(out["first_render_s"])
    out["first_render_each_s"] = renders
    if None not in renders:
        out["first_render_s"] = round(statistics.median(r for r in renders if r is not None), 3)
    return out


def open_page(
    browser: Any,
    cluster: LocalCluster,
    nodes: int,
    timeout: float,
    watching: float,
    full: bool = True,
) -> dict[str, Any]:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(timeout * 1000)
    page.add_init_script(OBSERVE)
    errors = page_errors(page)  # uncaught errors and Content-Security-Policy violations
    out: dict[str, Any] = {"load_before": load()}
    t0 = time.monotonic()
    try:
        page.goto(f"http://{cluster.address}/#token={cluster.admin_token}", wait_until="commit")
        page.wait_for_function(
            f"""(n) => performance.getEntriesByName('mgpu-ready').length > 0
                || ({OLD_READY})(n) && (window.__oldReady ??= performance.now())""",
            arg=nodes,
            polling="raf",
        )
    except Exception as e:  # a page that never renders is a figure too
        out.update(first_render_s=None, error=f"not rendered in {timeout:.0f} s: {e}"[:300])
        page.close()
        return out
    out["wall_s"] = round(time.monotonic() - t0, 3)
    mark = page.evaluate(
        """() => { const m = performance.getEntriesByName('mgpu-ready')[0];
                   return m ? [m.startTime, true] : [window.__oldReady, false]; }"""
    )
    out["first_render_s"] = round(mark[0] / 1000, 3)
    out["ready_mark"] = mark[1]
    # What the first render waited for: each request before the mark, in ms (the master's
    # answer time is most of it).
    out["load_requests"] = page.evaluate(
        """(t) => performance.getEntriesByType('resource').filter((e) => e.startTime < t)
              .map((e) => [e.name.replace(location.origin, '').split('?')[0],
                           Math.round(e.startTime), Math.round(e.duration), e.transferSize])""",
        mark[0],
    )
    if not full:
        page.close()
        return out
    out["dom_elements"] = page.evaluate("document.getElementsByTagName('*').length")
    out["js_heap_mb"] = page.evaluate(
        "performance.memory ? Math.round(performance.memory.usedJSHeapSize / 1048576) : null"
    )
    tasks = page.evaluate("window.__longtasks")
    out["longest_task_load_ms"] = round(max((d for _, d in tasks), default=0.0))
    out["load_after_render"] = load()
    shoot(page, f"first-{nodes}")
    return {**out, **watch(page, watching), **interact(page, nodes), "errors": errors[:3]}


def watch(page: Any, seconds: float) -> dict[str, Any]:
    """Idle with the page polling: the longest task, and what the polls fetched."""
    start = page.evaluate("performance.now()")
    page.evaluate("performance.clearResourceTimings()")
    time.sleep(seconds)
    tasks = page.evaluate(f"window.__longtasks.filter(([t]) => t >= {start})")
    fetched = page.evaluate(
        """() => performance.getEntriesByType('resource')
              .filter((e) => e.name.includes('/api/'))
              .map((e) => [e.name, e.transferSize, e.duration])"""
    )
    return {
        "watch_s": seconds,
        "longest_task_idle_ms": round(max((d for _, d in tasks), default=0.0)),
        "busy_idle_ms": round(sum(d for _, d in tasks)),
        "polls": len(fetched),
        "poll_kb": round(sum(size for _, size, _ in fetched) / 1024, 1),
        "poll_kb_max": round(max((size for _, size, _ in fetched), default=0) / 1024, 1),
    }


def shoot(page: Any, name: str) -> None:
    """MGPU_SCREENSHOTS=DIR: the page as DIR/dashboard-NAME.png (as test_dashboard.py)."""
    out = os.environ.get("MGPU_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / f"dashboard-{name}.png"), full_page=True)


def timed(page: Any, action: Any, done: str, arg: Any = None) -> float | None:
    """Milliseconds from the action to `done` holding; None if it did not within 30 s."""
    t0 = time.monotonic()
    action()
    try:
        page.wait_for_function(done, arg=arg, timeout=30000)
    except Exception:  # a figure too: the page did not answer
        return None
    return round((time.monotonic() - t0) * 1000)


def interact(page: Any, nodes: int) -> dict[str, Any]:
    """The three things a user does on a big cluster (the new page only)."""
    if page.locator("#node-search").count() == 0:
        return {}
    out: dict[str, Any] = {}
    last = f"sim{nodes:04d}"
    out["search_ms"] = timed(
        page,
        lambda: page.fill("#node-search", last),
        "(id) => document.querySelector(`#nodes [data-node='${id}']`) !== null",
        last,
    )
    shoot(page, f"search-{nodes}")
    out["filter_user_ms"] = timed(
        page,
        lambda: page.select_option("#filter-user", USERS[1]),
        """(u) => { const rows = [...document.querySelectorAll('#queue tr[data-job]')];
                    return rows.length > 0 && rows.every((r) => r.dataset.user === u); }""",
        USERS[1],
    )
    first = page.evaluate("document.querySelector('#queue tr[data-job]')?.dataset.job")
    out["next_page_ms"] = timed(
        page,
        lambda: page.click("#queue-next"),
        "(id) => document.querySelector('#queue tr[data-job]')?.dataset.job !== id",
        first,
    )
    return out


def measure(args: argparse.Namespace, nodes: int, browser: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "gpus_per_node": args.gpus}
    with tempfile.TemporaryDirectory(prefix="mgpu-dash-") as tmp:
        cluster = LocalCluster(Path(tmp), "networking: {heartbeat_interval: 5}\n")
        swarm: SwarmProcess | None = None
        try:
            cluster.start_master()
            swarm = SwarmProcess(cluster, args, nodes)
            out["join_s"] = swarm.read(args.join_timeout + 60)["joined"]
            out.update(fill(cluster, nodes, args.gpus, args.queued))
            out.update(settle(cluster))
            out.update(open_pages(browser, cluster, nodes, args))
        finally:
            if swarm is not None:
                swarm.stop()
            cluster.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=lambda s: [int(n) for n in s.split(",")], default=[50, 1000])
    p.add_argument("--queued", type=int, default=100000, help="jobs waiting (default 100000)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--loads", type=int, default=3, help="page loads a size (median render)")
    p.add_argument("--watch", type=float, default=10.0, help="seconds of idle polling watched")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds the page may take")
    p.add_argument("--join-timeout", type=float, default=300.0)
    p.add_argument("--label", default="", help="a note kept with the results (e.g. 'before')")
    p.add_argument("--out", default=str(RESULTS / "dashboard.json"))
    args = p.parse_args()
    args.run_time, args.lines = 10 * 86400.0, 0  # swarm settings: jobs run for the whole bench
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stops master and swarm too
    chromium = os.environ.get("MGPU_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    from playwright.sync_api import sync_playwright

    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {
            "queued": args.queued,
            "gpus": args.gpus,
            "watch": args.watch,
            "loads": args.loads,
        },
        "label": args.label,
        "runs": [],
    }
    out_path = Path(args.out)
    head = ("nodes", "running", "queued", "render", "DOM", "longest task", "poll KB", "search")
    print(" ".join(h.rjust(w) for h, w in zip(head, (6, 8, 7, 8, 7, 13, 8, 7), strict=True)))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for nodes in args.nodes:
                run = measure(args, nodes, browser)
                result["runs"].append(run)
                out_path.parent.mkdir(parents=True, exist_ok=True)
                out_path.write_text(json.dumps(result, indent=2) + "\n")
                render = run.get("first_render_s")
                print(
                    f"{nodes:>6} {run.get('running', 0):>8} {run['queued_wanted']:>7} "
                    f"{'-' if render is None else f'{render:.2f} s':>8} "
                    f"{run.get('dom_elements', '-')!s:>7} "
                    f"{run.get('longest_task_load_ms', '-')!s:>6}/"
                    f"{run.get('longest_task_idle_ms', '-')!s:<6} "
                    f"{run.get('poll_kb', '-')!s:>8} {run.get('search_ms', '-')!s:>7}"
                    f"   (load {run['load_before']} before, {run.get('load_after_render')} after;"
                    f" {run.get('error', '')})",
                    flush=True,
                )
        finally:
            browser.close()
    print(f"written to {out_path}")


if __name__ == "__main__":
    main()
