"""The web dashboard in a real headless Chromium (Python Playwright driving the system's
browser): the page loads, shows a job submitted through the CLI, follows its output
live, and cancels it.

Skipped, with the reason, when Playwright or Chromium is missing.  Set
MGPU_SCREENSHOTS=DIR to also save the pages as DIR/dashboard-*.png
(`scripts/screenshots.py` makes the ones in docs/img).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import LocalCluster, local_cluster, wait_for
from mgpu.master.monitor.observe import PAGE_HEADERS
from mgpu.testing import CHROMIUM_ARGS, CSP_VIOLATION, page_errors

CHROMIUM = os.environ.get("MGPU_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CONFIG = "networking: {heartbeat_interval: 0.3, timeout: 10}\n"
TICKER = 'i=0; while true; do i=$((i+1)); echo "tick $i"; echo "warn $i" >&2; sleep 0.2; done'

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Python Playwright is not installed (pip install playwright)"
)
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (set MGPU_CHROMIUM)", allow_module_level=True)


@pytest.fixture
def browser_page() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as e:  # a broken browser install is a skip, not a failure
            pytest.skip(f"Chromium at {CHROMIUM} does not start: {e}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(15000)
            yield page
        finally:
            browser.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path, agents=1, gpus=2, config=CONFIG) as c:
        yield c


def shoot(page: Any, name: str) -> None:
    out = os.environ.get("MGPU_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / f"dashboard-{name}.png"), full_page=True)


def test_dashboard_shows_follows_and_cancels_a_job(
    cluster: LocalCluster, browser_page: Any
) -> None:
    page = browser_page
    # Its Content-Security-Policy must not stop the page's own work.
    errors = page_errors(page)
    job_id = cluster.cli("submit", "--name", "ticker", "--gpus", "1", TICKER, check=True)
    job_id = job_id.stdout.strip()
    wait_for(lambda: cluster.client().show(job_id)["state"] == "running", what="job running")

    # Without a token the page asks for one.
    answer = page.goto(f"http://{cluster.address}/")
    assert answer.headers["x-frame-options"] == "DENY"
    policy = answer.headers["content-security-policy"]
    assert policy == PAGE_HEADERS["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#login-token", cluster.admin_token)
    page.click("#login-form button[type=submit]")

    # The overview: the job in the queue, on its GPU, with telemetry, live.
    row = page.locator(f"#queue tr[data-job='{job_id}']")
    row.wait_for()
    assert "ticker" in row.inner_text() and "running" in row.inner_text()
    gpu = cluster.client().show(job_id)["allocation"][0]["gpu_ids"][0]
    cell = page.locator(f"#nodes tr[data-gpu='node001:{gpu}']")
    cell.filter(has_text="%").wait_for()  # its utilisation bar
    bar = cell.locator(".bar > i")  # sized from a script: the policy refuses style="..."
    assert bar.get_attribute("style") == f"width: {bar.get_attribute('data-width')}%;"
    assert job_id in cell.inner_text() and "busy" in cell.inner_text()
    assert "simulated" in page.locator("#nodes").inner_text()
    assert re.search(r"CPUs \d+ free of \d+ · memory", page.locator("#nodes").inner_text())
    page.locator("#chart svg").wait_for()
    page.locator("#live.ok").wait_for()
    # A job submitted now appears without a reload.
    late = cluster.cli("submit", "--name", "late", "--gpus", "2", "sleep 30", check=True)
    late_id = late.stdout.strip()
    page.locator(f"#queue tr[data-job='{late_id}']").wait_for()
    page.select_option("#filter-state", "running")
    page.locator(f"#queue tr[data-job='{late_id}']").wait_for(state="detached")
    assert page.locator(f"#queue tr[data-job='{job_id}']").count() == 1
    page.select_option("#filter-state", "active")
    shoot(page, "overview")

    # The job page follows the output as it comes.
    page.click(f"#queue a[href='#/job/{job_id}']")
    page.wait_for_selector("#page-job:not([hidden])")
    # (Its title is filled in once the job's JSON is in: waited for, not read at once.)
    page.locator("#job-title", has_text=job_id).wait_for()
    page.locator("#output", has_text="tick 3").wait_for()
    page.locator("#output", has_text="tick 8").wait_for()
    assert page.locator("#output span.e").count() > 0  # stderr, shown apart
    assert "node001" in page.inner_text("#job-attempts")
    shoot(page, "job")

    # Cancel from the page: two clicks (arm, confirm).
    page.click("#job-cancel")
    assert page.inner_text("#job-cancel") == "Confirm cancel"
    page.click("#job-cancel")
    ended = cluster.client().wait(job_id, timeout=20)
    assert ended["state"] == "cancelled"
    page.locator("#output-status", has_text="ended: cancelled").wait_for()
    page.locator("#job-state", has_text=re.compile(r"^cancelled$")).wait_for()

    # A refused cancel shows the master's sentence: another user may not cancel it.
    other = cluster.client().create_token("someone-else")["token"]
    page.evaluate(f"localStorage.setItem('mgpu-token', {other!r})")
    page.goto(f"http://{cluster.address}/#/job/{late_id}")
    page.locator("#job-title", has_text="late").wait_for()
    page.click("#job-cancel")
    page.click("#job-cancel")
    page.locator("#job-cancel-error:not(:empty)").wait_for()
    assert "not authorised" in page.inner_text("#job-cancel-error")
    assert cluster.client().show(late_id)["state"] in ("queued", "running")  # not cancelled
    cluster.client().cancel(late_id)
    assert errors == []


def test_a_followed_output_goes_on_after_the_master_restarts(
    cluster: LocalCluster, browser_page: Any
) -> None:
    """The job page's stream breaks with its master; it is opened again where it stood once
    the master is back: every line the job printed meanwhile shown, none twice."""
    page = browser_page
    errors = page_errors(page)
    job_id = cluster.cli("submit", "--gpus", "1", TICKER, check=True).stdout.strip()
    wait_for(lambda: cluster.client().show(job_id)["state"] == "running", what="job running")
    page.goto(f"http://{cluster.address}/")
    page.evaluate(f"localStorage.setItem('mgpu-token', {cluster.admin_token!r})")
    page.goto(f"http://{cluster.address}/#/job/{job_id}")
    page.locator("#output", has_text="tick 5").wait_for()
    assert cluster.master is not None
    cluster.master.kill()
    cluster.master.wait(timeout=30)
    page.locator("#output-status", has_text="reconnecting").wait_for(timeout=30000)
    cluster.start_master()
    cluster.wait_node("node001", "online")
    later = len(cluster.client().logs(job_id).splitlines()) // 2 + 5  # printed while down
    page.locator("#output", has_text=f"tick {later}\n").wait_for(timeout=60000)
    text = page.inner_text("#output")
    for stream in ("tick", "warn"):
        seen = [int(n) for n in re.findall(rf"^{stream} (\d+)$", text, re.MULTILINE)]
        assert seen == list(range(1, len(seen) + 1)), f"{stream}: lost or twice"
    assert page.inner_text("#output-status") == "following…"
    cluster.client().cancel(job_id)
    page.locator("#output-status", has_text="ended: cancelled").wait_for()
    assert errors == []


def test_dashboard_shows_shared_gpus_and_estimates(
    cluster: LocalCluster, browser_page: Any
) -> None:
    page = browser_page
    errors = page_errors(page)
    c = cluster.client()
    shares = [
        cluster.cli("submit", "--gpu-share", "0.5", "--time", "10", "sleep 300", check=True)
        for _ in range(2)
    ]
    share_ids = [s.stdout.strip() for s in shares]
    wait_for(lambda: all(c.show(j)["state"] == "running" for j in share_ids), what="shares")
    wide = cluster.cli("submit", "--gpus", "2", "--time", "5", "true", check=True).stdout.strip()
    wait_for(lambda: c.show(wide).get("expected_start"), what="the estimate")
    gpu = c.show(share_ids[0])["allocation"][0]["gpu_ids"][0]

    page.goto(f"http://{cluster.address}/#token={cluster.admin_token}")
    cell = page.locator(f"#nodes tr[data-gpu='node001:{gpu}']")
    cell.wait_for()
    cell.filter(has_text="used by 2 jobs").wait_for()
    text = cell.inner_text()
    assert "shared" in text and all(j in text for j in share_ids) and "(0.5)" in text
    row = page.locator(f"#queue tr[data-job='{wide}']")
    row.wait_for()
    start = re.search(r"\bin (\d+):\d\d\b", row.inner_text())  # the shares end in ~10 min
    assert start is not None and 8 <= int(start.group(1)) <= 10, row.inner_text()
    shoot(page, "shares")

    page.goto(f"http://{cluster.address}/#/job/{wide}")
    page.locator("#job-details", has_text="waits").wait_for()
    details = page.inner_text("#job-details")
    assert "expected start" in details and "2 GPUs held by jobs" in details
    assert all(j in details for j in share_ids)
    for j in [*share_ids, wide]:
        c.cancel(j)
    assert errors == []


HOSTILE = '<img src=x onerror="window.__pwned=1">'


def test_users_text_is_shown_as_text_never_run(cluster: LocalCluster, browser_page: Any) -> None:
    """A job's name, command and output are another user's text on an admin's page: markup
    in them is shown as written and never becomes elements (an `onerror` that ran would act
    with the admin's token)."""
    page = browser_page
    errors = page_errors(page)
    command = f"echo '{HOSTILE}'; sleep 300"
    job_id = cluster.cli("submit", "--name", HOSTILE, "--gpus", "1", command, check=True)
    job_id = job_id.stdout.strip()
    wait_for(lambda: cluster.client().show(job_id)["state"] == "running", what="job running")
    page.goto(f"http://{cluster.address}/")
    page.evaluate(f"localStorage.setItem('mgpu-token', {cluster.admin_token!r})")
    page.goto(f"http://{cluster.address}/")
    row = page.locator(f"#queue tr[data-job='{job_id}']")
    row.wait_for()
    assert HOSTILE in row.inner_text()

    page.goto(f"http://{cluster.address}/#/job/{job_id}")
    page.locator("#job-title", has_text=job_id).wait_for()
    page.locator("#output", has_text="onerror").wait_for()
    assert HOSTILE in page.inner_text("#job-title")
    assert HOSTILE in page.inner_text("#job-details")  # the command
    assert HOSTILE in page.inner_text("#output")
    assert page.locator("img").count() == 0  # no element was made of the text
    assert page.evaluate("window.__pwned") is None
    cluster.client().cancel(job_id)
    assert errors == []


def test_a_missed_escape_still_runs_nothing(tmp_path: Path, browser_page: Any) -> None:
    """Defence in depth behind esc(): were app.js to put another user's text in the page
    as markup, its Content-Security-Policy still refuses the inline handler (and any
    style="..."), and the browser reports it."""
    page = browser_page
    errors = page_errors(page)
    with local_cluster(tmp_path, agents=0) as cluster:
        page.goto(f"http://{cluster.address}/")
        page.locator("#login:not([hidden])").wait_for()  # app.js ran: 'self' scripts do
        markup = HOSTILE + '<b id="styled" style="display:block; width:123px">x</b>'
        # The handler is refused when the image's error fires: that report is the moment
        # it would otherwise have run.
        refused = page.expect_console_message(
            # The handler's report names script-src; the inline style's names style-src
            # (and, in newer Chromium, mentions event handlers too: not the one awaited).
            lambda m: (
                CSP_VIOLATION in m.text
                and "event handler" in m.text
                and "script-src 'self'" in m.text
            )
        )
        with refused as blocked:
            page.evaluate(
                "(html) => { document.getElementById('stats').innerHTML = html; }", markup
            )
        assert "script-src 'self'" in blocked.value.text
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#stats img").count() == 1  # the markup did become elements
        assert page.locator("#styled").bounding_box()["width"] != 123
        assert any("inline style" in e and "style-src 'self'" in e for e in errors), errors


def test_a_token_link_replaces_a_held_token_only_when_the_reader_agrees(
    cluster: LocalCluster, browser_page: Any
) -> None:
    """Issue 25: a `#token=` link silently replaced the token an admin's dashboard held."""
    page = browser_page
    errors = page_errors(page)
    other = cluster.client().create_token("mallory")["token"]
    held = "localStorage.getItem('mgpu-token')"

    page.goto(f"http://{cluster.address}/#token={cluster.admin_token}")  # none held: taken
    page.locator("#live.ok").wait_for()
    assert page.evaluate(held) == cluster.admin_token

    asked: list[str] = []

    def answer(accept: bool) -> Any:
        def on_dialog(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        return on_dialog

    page.goto("about:blank")
    page.once("dialog", answer(False))
    page.goto(f"http://{cluster.address}/#token={other}")
    page.locator("#live.ok").wait_for()
    page.wait_for_function("() => !location.hash.includes('token=')")
    assert page.evaluate(held) == cluster.admin_token  # declined: kept
    assert asked == [
        "This link signs the dashboard in as mallory, in place of "
        f"{cluster.client().whoami()['user']} (admin). Switch?"
    ]

    page.goto("about:blank")
    page.once("dialog", answer(True))
    page.goto(f"http://{cluster.address}/#token={other}")
    page.wait_for_function(f"() => localStorage.getItem('mgpu-token') === {other!r}")
    assert len(asked) == 2
    assert errors == []
