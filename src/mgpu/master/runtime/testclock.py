"""A test hook: jump this master's wall clock, and only this process's.

Off unless `$MGPU_TEST_CLOCK_OFFSET_FILE` names a file.  Then `time.time` (and
`time.time_ns`) in this process return the real time plus the seconds written in that
file, re-read every 0.1 s, so a bench (bench/chaos_ha.py) can step one master's clock by
+120 s as NTP or `date -s` would, without touching the machine's clock that every other
process shares.  The monotonic and boot-time clocks are left alone: a real step moves
neither.  The master logs a warning at start when the hook is on; nothing else reads it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

__all__ = ["ENV", "install_from_env"]

ENV = "MGPU_TEST_CLOCK_OFFSET_FILE"

log = logging.getLogger("mgpu.master")


def install_from_env() -> bool:
    """Shift `time.time` by the file's seconds when $MGPU_TEST_CLOCK_OFFSET_FILE is set;
    whether the hook is on."""
    path = os.environ.get(ENV)
    if not path:
        return False
    offset = [_read(Path(path))]
    real_time, real_time_ns = time.time, time.time_ns

    def shifted() -> float:
        return real_time() + offset[0]

    def shifted_ns() -> int:
        return real_time_ns() + int(offset[0] * 1e9)

    def watch() -> None:
        while True:
            time.sleep(0.1)
            seconds = _read(Path(path))
            if seconds != offset[0]:
                offset[0] = seconds
                log.warning("TEST HOOK: this master's wall clock is now %+.1f s off", seconds)

    time.time = shifted
    time.time_ns = shifted_ns
    threading.Thread(target=watch, name="test-clock", daemon=True).start()
    log.warning("TEST HOOK: %s is set: this master's wall clock follows %s", ENV, path)
    return True


def _read(path: Path) -> float:
    try:
        return float(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0.0
