"""The store's errors, and how long the master waits for its database: apart from the
Store interface (base.py), which re-exports them, so that the store's thread (dbthread.py)
needs no more of it."""

from __future__ import annotations

from mgpu.errors import MgpuError

__all__ = [
    "ANSWER_WITHIN",
    "RETRY_AFTER_S",
    "STALLED",
    "KeyTaken",
    "StoreError",
    "StoreStalled",
    "StoreUnavailable",
]


class StoreError(MgpuError):
    """The store cannot be opened or used: one sentence for the operator."""


class StoreUnavailable(StoreError):
    """The database could not be reached (for longer than the store waits for it)."""


class KeyTaken(StoreError):
    """A submit's idempotency key is stored already (with an earlier submit's job): the
    transaction that carried it was rolled back whole (control/submitkeys.py)."""


STALLED = "the database does not answer (paused or cut): try again"

RETRY_AFTER_S = 2
"""What a 503 for a database that does not answer says to wait (`Retry-After`)."""

ANSWER_WITHIN = 2.0
"""Seconds the master, once it serves, waits for its database on the event loop at most
(`Store.answer_within`): a paused or cut database costs users a quick 503, not a hang."""


class StoreStalled(StoreUnavailable):
    """The database has not answered within the store's `answer_within` (paused, cut, or
    far behind): a read is refused at once, a write waits its turn in the store's thread
    (store/dbthread.py).  HTTP answers it 503 with Retry-After."""

    def __init__(self, detail: str = STALLED) -> None:
        super().__init__(detail)
