"""The master with 100,000 jobs in its tables: memory, submit and scheduling-pass cost.

Starts a real master and one agent with 8 fake GPUs held by a long job, submits
100,000 one-GPU jobs as arrays (so they all stay queued), then reads the master's
resident memory (psutil), the last scheduling pass duration (/metrics) and how
long `queue --json` takes.  Prints the figures and writes bench/results/master_scale.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from mgpu.testing import LocalCluster, wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "master_scale.json"
JOBS = int(os.environ.get("BENCH_MASTER_JOBS", 100_000))
CHUNK = 10_000


def pass_seconds(address: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(r"^mgpu_scheduler_pass_seconds(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mgpu-scale-") as tmp:
        cluster = LocalCluster(Path(tmp))
        try:
            cluster.start_master()
            cluster.start_agent("node001", gpus=8)
            assert cluster.master is not None
            master = psutil.Process(cluster.master.pid)
            rss_idle = master.memory_info().rss
            with cluster.client() as c:
                blocker = c.submit("sleep 3600", gpus=8)
                wait_for(lambda: c.show(blocker.id)["state"] == "running", what="blocker")
                t0 = time.perf_counter()
                for start in range(0, JOBS, CHUNK):
                    n = min(CHUNK, JOBS - start)
                    c.submit(["true"], gpus=1, array=f"0-{n - 1}", env={})
                submit_s = time.perf_counter() - t0
                passes = []
                for _ in range(5):
                    time.sleep(1.2)  # the loop passes at least once a second
                    passes.append(pass_seconds(cluster.address))
                t1 = time.perf_counter()
                queue = c.queue()
                queue_s = time.perf_counter() - t1
                assert len(queue["jobs"]) == JOBS + 1
                rss = master.memory_info().rss
                c.cancel(blocker.id)
        finally:
            cluster.stop()
    result = {
        "jobs": JOBS,
        "master_rss_mb_idle": round(rss_idle / 2**20, 1),
        "master_rss_mb_with_jobs": round(rss / 2**20, 1),
        "submit_seconds": round(submit_s, 2),
        "submit_jobs_per_s": round(JOBS / submit_s),
        "scheduling_pass_ms_median": round(statistics.median(passes) * 1000, 1),
        "queue_json_seconds": round(queue_s, 2),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"master RSS with {JOBS} queued jobs: {result['master_rss_mb_with_jobs']} MB "
        f"(idle {result['master_rss_mb_idle']} MB)"
    )
    print(
        f"submitted in {result['submit_seconds']} s ({result['submit_jobs_per_s']} jobs/s, "
        f"arrays of {CHUNK})"
    )
    print(
        f"scheduling pass with all of them pending: {result['scheduling_pass_ms_median']} ms "
        "(median of 5)"
    )
    print(f"`queue` of every job: {result['queue_json_seconds']} s")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
