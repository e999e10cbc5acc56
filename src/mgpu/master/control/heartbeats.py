"""How often agents heartbeat, scaled with the cluster's size, and when a silent node is lost.

Every connected agent heartbeats every `networking.heartbeat_interval` seconds, so the
master's heartbeat load grows with the cluster: 200 a second at 1,000 nodes and 5 s.  As
Nomad does (nomad/heartbeat.go, helper.RateScaledInterval), the interval is stretched so
that the whole cluster sends at most `networking.max_heartbeats_per_second`:
interval = max(heartbeat_interval, connected nodes / rate); the default rate (50) leaves
clusters of up to 250 nodes at the configured interval.

A node is lost after `networking.timeout` seconds of silence plus whatever its interval
adds to the configured one (Nomad: the TTL it was given plus a fixed grace), judged by the
interval that node was told: an agent learns it in its Welcome and, when the cluster has
grown or shrunk by more than a tenth since, in a `SetHeartbeat` answering its next
heartbeat (Nomad answers every heartbeat with the TTL).  An agent told a new interval is
still asleep on its old one, so until its next heartbeat it is judged by the longer.
"""

from __future__ import annotations

from mgpu.config import Networking
from mgpu.protocol import SetHeartbeat

__all__ = ["HeartbeatPace", "scaled_interval"]

BAND = 0.1
"""An agent is told a new interval when it moved by more than this fraction from the one
it was told (a cluster whose size wobbles does not send a message per heartbeat)."""


def scaled_interval(base: float, rate: float, nodes: int) -> float:
    """The heartbeat interval for `nodes` connected nodes (rate 0: never stretched)."""
    if rate <= 0:
        return base
    return max(base, nodes / rate)


class HeartbeatPace:
    def __init__(self, networking: Networking) -> None:
        self.base = networking.heartbeat_interval
        self.rate = networking.max_heartbeats_per_second
        self.timeout = networking.timeout
        self.interval = self.base
        """What a node joining now is told (`count` keeps it up to date)."""
        self._told: dict[str, float] = {}
        self._judged: dict[str, float] = {}

    def count(self, connected: int) -> None:
        """The number of connected nodes now (the liveness check counts them)."""
        self.interval = scaled_interval(self.base, self.rate, connected)

    def welcome(self, node_id: str) -> float:
        """The interval a joining node is told (it heartbeats at once, then at that)."""
        self._told[node_id] = self._judged[node_id] = self.interval
        return self.interval

    def heartbeat(self, node_id: str) -> SetHeartbeat | None:
        """A heartbeat came: the interval to tell the node, if it is to change."""
        told = self._told.get(node_id, self.base)
        self._judged[node_id] = told
        now = self.interval
        if abs(now - told) <= BAND * told:
            return None
        self._told[node_id] = now
        self._judged[node_id] = max(told, now)
        return SetHeartbeat(heartbeat_interval=now)

    def timeout_of(self, node_id: str) -> float:
        """Seconds of silence after which the node is lost."""
        return self.timeout + max(0.0, self._judged.get(node_id, self.base) - self.base)

    def forget(self, node_id: str) -> None:
        """The node was removed."""
        self._told.pop(node_id, None)
        self._judged.pop(node_id, None)
