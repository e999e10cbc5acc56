"""A keyed request's answer, written in the transaction of what the request did.

A job-control request or a step's start sent with an `Idempotency-Key` is answered once per
key (control/requestkeys.py): its first answer is stored, and the request sent again after
a lost answer gets it back.  Stored apart from the request's effect, a master killed
between the two writes had done the request without keeping its answer, and the request
sent again to the next leader was run again: a cancel that was done answered "already
ended", a step started twice.  So while a keyed request is answered its user's change
(`UnitOfWork.flush` with an audit event) is not written at once but held here, and written
with the answer once the route has made it, before the answer is sent
(`UnitOfWork.flush_answer`): one transaction, with whatever else the request changed (a
step made, its launch) and the turn's other changes.  Should the route go on after a
pause, the changes made before it may be written by the turn's own flush first (then the
answer follows in the next transaction, as before).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["HELD", "KeyHold"]

Event = tuple[str, str | None, str | None, str]
"""An audit event written with the jobs: (kind, actor, address, target)."""


@dataclass(eq=False)
class KeyHold:
    """The keyed request being answered: the user's change it holds back for its answer."""

    user: str
    key: str
    change: tuple[Event, str | None] | None = None
    """The held change's audit event and its detail (None: none made yet)."""
    open: bool = True
    """False once the answer is written: a change after it (a task the route started) is
    written at once, as any other."""


HELD: ContextVar[KeyHold | None] = ContextVar("mgpu_key_hold", default=None)
"""The keyed request whose route runs in this context (set by RequestKeys.once)."""
