"""The master's clock test hook (runtime/testclock.py): off without its variable; with it,
`time.time` in that process follows the file, and the monotonic clock does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, time
from mgpu.master.runtime.testclock import install_from_env
wall, mono = time.time(), time.monotonic()
on = install_from_env()
first = time.time() - wall
open(OFFSET, "w").write("-30")
deadline = time.monotonic() + 30
while on and time.time() - wall > -20 and time.monotonic() < deadline:
    time.sleep(0.02)
print(json.dumps({"on": on, "first": first, "then": time.time() - wall,
                  "mono": time.monotonic() - mono}))
"""


def run(tmp_path: Path, env_var: bool) -> dict[str, float]:
    offset = tmp_path / "offset"
    offset.write_text("120\n")
    env = {k: v for k, v in os.environ.items() if k != "MGPU_TEST_CLOCK_OFFSET_FILE"}
    if env_var:
        env["MGPU_TEST_CLOCK_OFFSET_FILE"] = str(offset)
    code = f"OFFSET = {str(offset)!r}\n" + PROBE
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_file_shifts_this_process_wall_clock_only(tmp_path: Path) -> None:
    got = run(tmp_path, env_var=True)
    assert got["on"]
    assert 119 < got["first"] < 125
    assert -31 < got["then"] < -20
    assert 0 <= got["mono"] < 30  # the monotonic clock never jumped


def test_without_the_variable_nothing_changes(tmp_path: Path) -> None:
    got = run(tmp_path, env_var=False)
    assert not got["on"]
    assert -1 < got["first"] < 1
