"""The requests that carry an idempotency key besides a submit: job control and steps.

A client whose request's answer was cut (the master was killed, another took over) cannot
know whether it was done.  These requests change something once, and telling it twice
would say two things (a cancel sent again: "already ended"; a step started again: a second
step running).  So the client sends each with an `Idempotency-Key` header of its own (a
random token per request) and may send it again after a lost answer; the master answers a
key it has seen with the first answer, stored (master/control/requestkeys.py).  Shared by
both sides: the client (mgpu.client.session) and the master's edge (master/http/requestkeys.py).
"""

from __future__ import annotations

__all__ = ["KEYED", "keyed"]

KEYED = {
    "jobs": ("cancel", "hold", "release", "requeue", "update", "signal", "srun", "steps"),
    "sruns": ("cancel",),
    "steps": ("cancel",),
    "allocations": ("steps", "end"),
}
"""`POST /api/{KIND}/{id}/{VERB}`: the requests answered once per key (no `re`: the CLI's
start-up budget, tests/unit/test_cli_startup.py)."""


def keyed(method: str, path: str) -> bool:
    """Whether a request to `path` takes an idempotency key (and may be sent again)."""
    parts = path.partition("?")[0].split("/")
    if method != "POST" or len(parts) != 5 or parts[:2] != ["", "api"] or not parts[3]:
        return False
    return parts[4] in KEYED.get(parts[2], ())
