"""bench/swarm.py, small: 20 simulated nodes against a real master, so the bench cannot rot."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

SWARM = Path(__file__).resolve().parents[2] / "bench" / "swarm.py"


def test_swarm_small(tmp_path: Path) -> None:
    out, png = tmp_path / "swarm.json", tmp_path / "swarm.png"
    argv = [sys.executable, str(SWARM), "--nodes", "20", "--jobs", "300", "--gang-jobs", "3"]
    argv += ["--idle", "1", "--queue-runs", "1", "--out", str(out), "--plot", str(png)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        printed, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # it stops its master and swarm on the way out
        printed, _ = proc.communicate(timeout=60)
        raise AssertionError(f"bench/swarm.py took over 90 s:\n{printed}") from None
    assert proc.returncode == 0, printed
    (run,) = json.loads(out.read_text())["runs"]
    assert run["nodes_online"] == 20 and run["swarm"]["welcomed"] == 20
    assert run["join_s"] is not None and run["join_s"] > 0
    assert run["states"] == {"completed": 300}, run["states"]
    assert run["gang_completed"] == 3
    # Each job launched once (a gang job on two nodes), none killed, none refused.
    swarm = run["swarm"]
    assert swarm["launched"] == swarm["exited"] == 300 + 3 * 2, swarm
    assert swarm["ports"] == 3
    assert not {"killed", "refused", "bad_frames"} & swarm.keys(), swarm
    assert swarm["heartbeats"] >= 20
    assert run["jobs_per_s"] > 0 and run["queue_json_bytes"] > 0 and run["master_rss_mb"] > 0
    assert png.stat().st_size > 0
    assert "20" in printed.splitlines()[1]  # the table's row
