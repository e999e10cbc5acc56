"""How long a PostgreSQL store's write is tried again while the database is unreachable:
the store's threads (postgres.py) and its submit lane (pgsubmits.py) keep one rule.

The first lost connection is logged once with what the store will do; the write is tried
again after a pause that doubles from 50 ms up to 1 s; past `retry_for` seconds from that
first loss it fails with StoreUnavailable, naming the database and the last error.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from mgpu.master.store.base import StoreUnavailable

__all__ = ["Unreachable", "first_line", "lost"]

log = logging.getLogger("mgpu.master")


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def lost(conn: Any, e: psycopg.Error) -> bool:
    """Whether the error means the connection to the database is gone (then try again)."""
    if conn is None or conn.closed or conn.broken:
        return True
    state = e.sqlstate or ""
    return isinstance(e, psycopg.OperationalError) and state[:2] in ("08", "57")


class Unreachable:
    """One write's tries while the database is unreachable (module docstring)."""

    def __init__(self, where: str, retry_for: float) -> None:
        self.where, self.retry_for = where, retry_for
        self._deadline: float | None = None
        self._pause = 0.05

    def pause(self, error: psycopg.Error) -> float:
        """The connection was lost with `error`: seconds to wait before the next try, or
        StoreUnavailable once `retry_for` has passed since the first loss."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.retry_for
            log.warning(
                "the database %s is unreachable (%s): trying again for up to %.0f s",
                self.where,
                first_line(error),
                self.retry_for,
            )
        if now >= self._deadline:
            raise StoreUnavailable(
                f"the database {self.where} has been unreachable for "
                f"{self.retry_for:.0f} s: {first_line(error)}"
            ) from None
        pause, self._pause = self._pause, min(self._pause * 2, 1.0)
        return min(pause, self._deadline - now)
