"""The client's errors: each says what happened to a request, so a caller (or the search
for the leading master) knows whether it may have been done and whether to try again."""

from __future__ import annotations

from mgpu.errors import MgpuError


class ConnectError(MgpuError):
    pass


class RequestError(MgpuError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LostConnection(ConnectError):
    """The connection broke after the request was sent: the master may have done it."""


class NoAnswer(MgpuError):
    """The master took the request and said nothing in time (slow, or stopped); `leader`:
    the other master that leads now, when one was found to (the silent one was deposed)."""

    def __init__(self, message: str, leader: tuple[str, int] | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class Standby(RequestError):
    """A standby master's 503: `leader` is where it says the leader is (None: no leader)."""

    def __init__(self, message: str, leader: str | None) -> None:
        super().__init__(503, message)
        self.leader = leader


class Unavailable(RequestError):
    """A leader's 503 with `Retry-After`: its database does not answer now (paused, cut,
    restarting); nothing was done, and `retry_after` seconds from now it may be."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(503, message)
        self.retry_after = retry_after
