"""With several masters, a wait on one of them is watched: a leader that is stopped (SIGSTOP,
a frozen VM) or cut off takes connections and says nothing, and its socket alone cannot
tell that from a slow answer.  So a wait for its bytes is cut in slices (`mgpu.wire`
calls the watch between two), and between two the client asks the other masters'
`/readyz`: once another one leads, this one was deposed (its lease ran out: it can write
nothing more), and the wait is given up for the new leader (`NewLeader`).  While no other
master leads, the wait goes on as long as it would have: a slow answer, a long-poll, a
quiet stream are never cut by the watch.

With one master nothing is watched (nowhere else to go).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Address = tuple[str, int]

ANSWER_QUIET = 1.0
"""Seconds without the first byte of an answer before the other masters are asked: a
leader answers in milliseconds, and asking costs them one small request each."""
STREAM_QUIET = 6.0
"""The same for a followed stream: the master writes a word every 5 s."""
ASK_EVERY = 3.0
"""Seconds between two askings while the wait goes on (no other master leads yet: the
standby takes over once the leader's lease has run out, some 3 s)."""


class NewLeader(TimeoutError):
    """A wait given up: `leader` leads now, and the master waited on said nothing for
    `waited` seconds.  (A TimeoutError: what a wait that was not watched would end in.)"""

    def __init__(self, leader: Address, waited: float) -> None:
        super().__init__(f"another master leads now ({leader[0]}:{leader[1]})")
        self.leader = leader
        self.waited = waited


class LeaderWatch:
    """The watch of one connection to `here` (mgpu.wire.Watch): after `quiet` seconds, and
    every ASK_EVERY seconds after, `leader_elsewhere(here)` says which other master leads,
    if one does."""

    def __init__(
        self,
        here: Address,
        leader_elsewhere: Callable[[Address], Address | None],
        quiet: float = ANSWER_QUIET,
    ) -> None:
        self.here = here
        self.leader_elsewhere = leader_elsewhere
        self.quiet = quiet

    def __call__(self, waited: float) -> float:
        if waited <= 0:
            return self.quiet
        leader = self.leader_elsewhere(self.here)
        if leader is not None:
            raise NewLeader(leader, waited)
        return ASK_EVERY
