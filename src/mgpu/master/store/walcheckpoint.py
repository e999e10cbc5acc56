"""WAL checkpoints in a thread of their own, off the event loop.

SQLite in WAL mode appends every commit to the write-ahead log and, by default, the commit
that takes the log past 1,000 pages copies it back into the database and syncs it: a
checkpoint, run inside that commit.  The master commits on its event loop, so a burst of
writes (cancelling a 100,000-task array writes 100,000 rows) held the loop 100-300 ms at
every few commits.  The store turns automatic checkpoints off and this thread runs a
PASSIVE checkpoint every second on a connection of its own: it copies what no reader
still needs, never waits for the writer, and SQLite releases the GIL while it works.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

__all__ = ["Checkpointer"]

log = logging.getLogger("mgpu.master")

INTERVAL = 1.0
"""Seconds between two checkpoints."""


class Checkpointer:
    def __init__(self, path: Path | str, interval: float = INTERVAL) -> None:
        self.path = path
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mgpu-wal-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(self.interval):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as e:  # busy or gone: the next round tries again
                    log.debug("WAL checkpoint skipped: %s", e)
        finally:
            db.close()
