"""A Kubernetes Node's link: where the master's messages to "the node's agent" go.

The controller speaks to every node through an `AgentLink` (launch, kill, time limit,
forget); for a Kubernetes Node there is no agent and no WebSocket, only this link, which
hands each message to the partition's driver (mgpu.master.kube.driver), on the event loop,
after the unit of work that sent it is on disk, exactly as an agent's link would send it."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from mgpu.master.state.registry import AgentLink

__all__ = ["KubeLink"]


class KubeLink(AgentLink):
    def __init__(
        self,
        node_id: str,
        deliver: Callable[[str, BaseModel], None],
        no_signal: str | None = None,
    ) -> None:
        super().__init__(node_id, ws=None)
        self._deliver = deliver
        self.no_signal = no_signal

    def send(self, message: BaseModel) -> None:
        if not self.closed:
            self._deliver(self.node_id, message)

    async def writer(self) -> None:  # nothing to write: `send` delivers
        return None

    def let_go(self) -> bool:
        """Kept: no agent behind it to find another master (the partition's driver is this
        master's own, and a deposed master's judges nothing: mgpu.master.kube.driver)."""
        return False
