"""The dashboard at 1,000 simulated nodes x 8 GPUs (bench/swarm.py's nodes: one process,
the real protocol) in headless Chromium: the first render stays quick and the DOM small,
a search finds a node and details it, filters narrow the heat map and the job list, and
the job list pages.

The bounds are loose (a loaded CI machine); bench/dashboard.py has the strict figures.
Skipped, with the reason, when Playwright or Chromium is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import LocalCluster, wait_for
from mgpu.testing import CHROMIUM_ARGS, page_errors

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from swarm import SwarmProcess  # bench/ is not a package: found through sys.path

CHROMIUM = os.environ.get("MGPU_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
NODES, RUNNING, QUEUED = 1000, 400, 5000
RENDER_BOUND_S = 5.0
DOM_BOUND = 10000

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Python Playwright is not installed (pip install playwright)"
)
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (set MGPU_CHROMIUM)", allow_module_level=True)


@pytest.fixture(scope="module")
def big() -> Iterator[tuple[LocalCluster, dict[str, str]]]:
    """1,000 nodes; RUNNING one-GPU jobs of alice and bob, QUEUED of carol waiting on a
    dependency.  Returns the cluster and the ids of a few jobs."""
    root = Path(tempfile.mkdtemp(prefix="mgpu-dash-scale-"))
    cluster = LocalCluster(root, "networking: {heartbeat_interval: 5}\n")
    swarm: SwarmProcess | None = None
    try:
        cluster.start_master()
        settings = argparse.Namespace(gpus=8, lines=0, run_time=3600.0, join_timeout=120.0)
        swarm = SwarmProcess(cluster, settings, NODES)
        assert swarm.read(150)["joined"] is not None, "the simulated nodes did not all join"
        with cluster.client() as c:
            ids = {}
            for user in ("alice", "bob"):
                job = c.submit(["train"], gpus=1, name=f"train-{user}", user=user, env={},
                               array=f"0-{RUNNING // 2 - 1}")  # fmt: skip
                ids[user] = job.id
            ids["carol"] = c.submit(["sweep"], gpus=1, name="sweep", user="carol", env={},
                                    array=f"0-{QUEUED - 1}",
                                    dependency=f"afterok:{ids['alice']}_0").id  # fmt: skip

            def busy() -> bool:
                return sum(1 for n in c.nodes() for g in n["gpus"] if g["busy_job"]) >= RUNNING

            wait_for(busy, timeout=60, interval=0.5, what=f"{RUNNING} jobs running")
        yield cluster, ids
    finally:
        if swarm is not None:
            swarm.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def page() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as e:  # a broken browser install is a skip, not a failure
            pytest.skip(f"Chromium at {CHROMIUM} does not start: {e}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(20000)
            yield page
        finally:
            browser.close()


def rows(page: Any) -> list[dict[str, str]]:
    return list(
        page.eval_on_selector_all(
            "#queue tr[data-job]", "rs => rs.map(r => ({id: r.dataset.job, user: r.dataset.user}))"
        )
    )


def test_a_thousand_nodes_render_small_and_stay_usable(
    big: tuple[LocalCluster, dict[str, str]], page: Any
) -> None:
    cluster, ids = big

    def queue_range(pattern: str) -> None:
        """Wait for the job list's "1–50 of N" to match."""
        page.locator("#queue-range", has_text=re.compile(pattern)).wait_for()

    errors = page_errors(page)  # uncaught errors and Content-Security-Policy violations
    page.goto(f"http://{cluster.address}/#token={cluster.admin_token}")
    # (Functions, not expressions: the page's policy has no 'unsafe-eval', and Playwright
    # polls a string predicate with eval.)
    page.wait_for_function("() => performance.getEntriesByName('mgpu-ready').length > 0")
    render = page.evaluate("performance.getEntriesByName('mgpu-ready')[0].startTime") / 1000
    assert render < RENDER_BOUND_S, f"first render took {render:.2f} s"
    dom = page.evaluate("document.getElementsByTagName('*').length")
    assert dom < DOM_BOUND, f"{dom} DOM elements"
    heat = page.locator("#heatmap canvas")
    assert heat.get_attribute("data-nodes") == str(NODES)
    assert page.locator("#nodes .node").count() == 0  # details on demand only
    stats = page.inner_text("#stats")
    assert f"{RUNNING}/{NODES * 8:,}" in stats and f"{QUEUED:,}" in stats, stats

    # A search that names one node details it (its 8 GPUs); the others are dimmed.
    page.fill("#node-search", "sim0777")
    page.locator("#nodes .node[data-node='sim0777'] tr[data-gpu='sim0777:7']").wait_for()
    assert "1 of 1,000 nodes match" in page.inner_text("#node-matches")
    assert heat.get_attribute("data-dimmed") == str(NODES - 1)
    page.fill("#node-search", "")
    page.locator("#nodes .node").first.wait_for(state="detached")
    # A state filter narrows the map: the nodes with every GPU busy (the jobs fill nodes).
    page.select_option("#node-filter", "full")
    full = RUNNING // 8
    page.locator(f"#heatmap canvas[data-dimmed='{NODES - full}']").wait_for()
    page.select_option("#node-filter", "")

    # The job list: 50 rows a page, filtered and paged by the master.
    total = RUNNING + QUEUED
    assert page.inner_text("#queue-range") == f"1–50 of {total:,}"
    first = rows(page)
    assert len(first) == 50
    page.click("#queue-next")
    queue_range("^51–100 ")
    second = rows(page)
    assert len(second) == 50 and not {r["id"] for r in first} & {r["id"] for r in second}
    page.click("#queue-prev")
    queue_range("^1–50 ")
    assert rows(page) == first

    page.select_option("#filter-user", "carol")
    queue_range(f" of {QUEUED:,}$")
    assert {r["user"] for r in rows(page)} == {"carol"}
    page.select_option("#filter-state", "running")
    queue_range("^0–0 of 0$")
    assert "No jobs match" in page.inner_text("#queue")
    page.select_option("#filter-user", "")
    queue_range(f" of {RUNNING}$")
    assert {r["user"] for r in rows(page)} <= {"alice", "bob"}

    # A job found by id (a task's id is also the start of longer ones: _77, _770...).
    page.select_option("#filter-state", "active")
    wanted = f"{ids['carol']}_4321"
    page.fill("#job-search", wanted)
    page.wait_for_function(
        "(id) => document.querySelector('#queue tr[data-job]')?.dataset.job === id", arg=wanted
    )
    assert re.fullmatch(r"1–1 of 1", page.inner_text("#queue-range"))
    assert page.evaluate("document.getElementsByTagName('*').length") < DOM_BOUND
    assert errors == []
