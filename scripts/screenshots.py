#!/usr/bin/env python3
"""Screenshots of the dashboard for the docs: docs/img/dashboard-*.png.

Starts a local cluster (a master and two agents with simulated GPUs, one GPU used outside
mgpu), runs a few jobs through the CLI, and photographs the pages in headless Chromium
(Python Playwright driving the system's browser; no browser download):

    python scripts/screenshots.py [--out docs/img] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
import tempfile
import time
from pathlib import Path

from mgpu.testing import CHROMIUM_ARGS, LocalCluster, page_errors, wait_for

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """
networking: {heartbeat_interval: 0.5, timeout: 15}
scheduling: {idle_after_minutes: 0.05}
"""


def job_users() -> list[str]:
    """Three user names for the demo jobs.  An agent running as root starts each job as
    its user, so then they must be real accounts of this machine."""
    if os.geteuid() != 0:
        return ["alice", "bob", "carol"]
    names = [p.pw_name for p in pwd.getpwall() if p.pw_uid > 0 and p.pw_shell]
    wanted = [n for n in ("alice", "bob", "carol", "daemon", "nobody", "www-data") if n in names]
    return (wanted + names)[:3]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    os.chdir("/")  # the jobs' working directory: readable by every user
    with tempfile.TemporaryDirectory(prefix="mgpu-shots-") as tmp:
        os.chmod(tmp, 0o755)  # jobs run as their users and write their exit files here
        cluster = LocalCluster(Path(tmp), CONFIG)
        try:
            cluster.start_master()
            cluster.start_agent("node001", gpus=4)
            cluster.start_agent("node002", gpus=4, extra=["--fake-foreign", "3:6144"])
            c = cluster.client()
            alice, bob, carol = job_users()
            tokens = {u: c.create_token(u)["token"] for u in (alice, bob, carol)}
            for user, cmd, gpus in [
                (alice, "sleep 1", 2),
                (bob, "sleep 0.5; exit 3", 1),
                (alice, "sleep 1.5", 1),
                (carol, "sleep 0.8", 4),
            ]:
                cluster.cli("--token", tokens[user], "submit", "--gpus", str(gpus), cmd, check=True)
            time.sleep(2.5)
            train = (
                "i=0; while true; do i=$((i+1)); "
                'echo "epoch $i: loss $(awk "BEGIN{print 2.0/$i}")"; sleep 0.3; done'
            )
            job_id = cluster.cli(
                "--token",
                tokens[alice],
                "submit",
                "--gpus",
                "2",
                "--name",
                "train",
                train,
                check=True,
            ).stdout.strip()
            cluster.cli("submit", "--gpus", "1", "--name", "notebook", "sleep 600", check=True)
            cluster.cli("submit", "--gpus", "4", "--name", "sweep", "sleep 600", check=True)
            cluster.cli("submit", "--gpus", "4", "--name", "big-eval", "sleep 600", check=True)
            wait_for(lambda: c.show(job_id)["state"] == "running", what="train running")
            time.sleep(2)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1360, "height": 1100})
                errors = page_errors(page)  # a page the policy broke is no picture for docs
                page.goto(f"http://{cluster.address}/#token={cluster.admin_token}")
                page.wait_for_selector(f"tr[data-job='{job_id}']")
                page.select_option("#util-hours", "1")
                time.sleep(1.0)
                page.screenshot(path=str(out / "dashboard-overview.png"), full_page=True)
                page.goto(f"http://{cluster.address}/#/job/{job_id}")
                page.locator("#output", has_text="epoch 8").wait_for()
                page.screenshot(path=str(out / "dashboard-job.png"), full_page=True)
                page.goto(f"http://{cluster.address}/#/accounting")
                page.wait_for_selector("#report table")
                page.screenshot(path=str(out / "dashboard-accounting.png"), full_page=True)
                browser.close()
        finally:
            cluster.stop()
    for name in ("overview", "job", "accounting"):
        print(out / f"dashboard-{name}.png")
    for error in errors:
        print(f"screenshots: the page reported: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
