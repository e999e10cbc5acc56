"""Node administration and health: drain, resume, remove, failures, and liveness.

A node's state moves by the table in `mgpu.model.NODE_MOVES`; this module makes the moves
that admins ask for (`drain`, `resume`, `remove`), the drain the master decides itself
(too many consecutive failures: `charge_failure`; an epilog error), and the loss of a
node that has gone silent (`check_heartbeats`, Nomad's heartbeat.go: liveness only).  The
node's agent joining is master/control/agents.py's.

Silence is measured on the monotonic clock (`NodeRecord.heard`), never the wall clock: a
jump of the master's clock says nothing about its agents.  And only while this master
holds the leader's lease (`holds_lease`, master/ha): a master whose lease ran out refuses
its agents, so their silence is its own doing; when it holds the lease again the agents
get the takeover grace anew to find it.  Once out for LET_GO_AFTER it also lets the agents
still linked to it go (their links closed), to say hello to whichever master leads: a
standby that took over hears nothing from an agent that stays with the old leader, and
would lose its node after the timeout and run its jobs a second time.  An agent that
watches for the leader itself (it asks the other masters, `Hello.watches_leader`) is
kept: it leaves once another master leads, and stays, shown connected, through a paused
database, when none does; what this master sends it meanwhile waits for the lease's
renewal (state/registry.py's `AgentLink.may_hold`), not closing its link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mgpu.config import ClusterConfig
from mgpu.master.control.heartbeats import HeartbeatPace
from mgpu.master.control.lifecycle import Lifecycle
from mgpu.master.security.nodeauth import NodeSecrets
from mgpu.master.state.memory import ControllerState
from mgpu.master.state.registry import NodeRecord
from mgpu.master.store.base import Store
from mgpu.model import EndReason, JobState, NodeEvent, NodeState

log = logging.getLogger("mgpu.master")

LET_GO_AFTER = 3.0
"""Seconds this master's lease has been out before it lets its agents go: a standby that
reaches the database has taken over by then, and a leader that only missed a renewal or
two (a loaded machine) keeps them."""

__all__ = ["Conflict", "NodeAdmin", "NotFound"]


class NotFound(KeyError):
    pass


class Conflict(ValueError):
    """A request that cannot be done in the current state; the message says why."""


class NodeAdmin:
    def __init__(
        self,
        state: ControllerState,
        life: Lifecycle,
        store: Store,
        node_secrets: NodeSecrets,
        config: ClusterConfig,
    ) -> None:
        self.state = state
        self.life = life
        self.store = store
        self.node_secrets = node_secrets
        self.config = config
        self.pace = HeartbeatPace(config.networking)
        """The heartbeat interval for the cluster's size, and each node's timeout."""
        self.grace_until = 0.0
        """No node is declared lost before this time, monotonic seconds (`grace`)."""
        self.grace_seconds = config.networking.timeout
        """The last grace given: given again when the lease is held again."""
        self.holds_lease: Callable[[], bool] = lambda: True
        """Whether this master holds the leader's lease now (master/ha sets it; one
        master alone always does)."""
        self._lapsed_at: float | None = None
        """When this master's lease was last found out (None: it holds it)."""

    def _let_agents_go(self) -> None:
        """Close the links of the agents still linked to this master (without the lease):
        each says hello again, to whichever master leads (this one refuses it meanwhile)."""
        gone = 0
        for node in self.state.nodes.values():
            link = node.link
            if link is None or link.closed or getattr(link, "watches_leader", False):
                continue  # it goes by itself once another master leads: a paused
            if link.let_go():  # database keeps it here, shown connected
                gone += 1
        if gone:
            log.warning("the lease is still not held: %d agent(s) let go to find the leader", gone)

    def grace(self, seconds: float) -> None:
        """A new leader took over (master/ha): for `seconds` no node is declared lost and
        no job requeued for it, while the agents find this master and report what they
        run (their hello's reconcile settles each job)."""
        self.grace_seconds = seconds
        self.grace_until = self.state.clock.monotonic() + seconds

    def drain(
        self,
        node_id: str,
        reason: str | None,
        actor: str | None = None,
        address: str | None = None,
    ) -> NodeRecord:
        node = self.state.nodes.get(node_id)
        if node is None:
            raise NotFound(node_id)
        node.drain_requested = True
        node.reason = reason or "drained by admin"
        node.move(NodeEvent.DRAIN)
        self.store.save_node(node_id, node.to_record())
        self.store.record_event(
            "drain", actor=actor, address=address, target=node_id, detail=node.reason
        )
        return node

    def resume(
        self, node_id: str, actor: str | None = None, address: str | None = None
    ) -> NodeRecord:
        node = self.state.nodes.get(node_id)
        if node is None:
            raise NotFound(node_id)
        node.drain_requested = False
        node.reason = None
        node.failures = 0
        node.move(NodeEvent.RESUME)
        self.store.save_node(node_id, node.to_record())
        self.store.record_event("resume", actor=actor, address=address, target=node_id)
        self.state.wake()
        return node

    def charge_failure(self, node: NodeRecord, why: str) -> None:
        """One more consecutive failure (a launch error, jobs lost in a restart); at
        `scheduling.node_failure_threshold` the node drains."""
        node.failures += 1
        threshold = self.config.scheduling.node_failure_threshold
        if node.failures >= threshold and not node.drain_requested:
            node.drain_requested = True
            node.reason = f"{node.failures} consecutive failures, last: {why}"
            node.move(NodeEvent.DRAIN)
            log.warning("draining %s: %s", node.node_id, node.reason)
        self.store.save_node(node.node_id, node.to_record())

    def remove(
        self, node_id: str, actor: str | None = None, address: str | None = None
    ) -> list[str]:
        """Forget a node, its record and its secret, so that an agent can join under its
        id afresh (one that lost its state dir, or a new machine).  Refused while its agent
        is connected and runs jobs; the jobs of a node that is not connected are requeued
        as for a lost node.  Returns the ids of the requeued jobs."""
        node = self.state.nodes.get(node_id)
        if node is None and not self.node_secrets.known(node_id):
            raise NotFound(node_id)
        requeued: list[str] = []
        if node is not None:
            running = self.state.running_jobs_on(node)
            if node.connected and running:
                ids = [j.id for j in running]
                raise Conflict(
                    f"node {node_id} is connected and runs {len(ids)} job(s) "
                    f"({', '.join(ids[:5])}): drain it and let them end, or stop its "
                    "agent first"
                )
            for job in running:
                self.life.slot_lost(job, EndReason.NODE_LOST, f"node {node_id} removed")
                if job.state == JobState.QUEUED:
                    requeued.append(job.id)
            if node.link is not None:
                node.link.close()  # an idle agent still running joins again as a new node
            self.state.remove_node(node_id)
        # The secret first: should the master die in between, the node is forgotten anyway.
        self.node_secrets.forget(node_id)
        self.pace.forget(node_id)
        self.store.delete_node(node_id)
        detail = f"requeued {', '.join(requeued)}" if requeued else None
        self.store.record_event(
            "node_remove", actor=actor, address=address, target=node_id, detail=detail
        )
        if self.config.node(node_id) is not None:
            self.state.node(node_id)  # listed in the config: shown as at a fresh start
        self.life.uow.flush()
        self.state.wake()
        return requeued

    def check_heartbeats(self) -> None:
        """Declare nodes silent for longer than their timeout (`networking.timeout`, more
        in a big cluster: master/control/heartbeats.py) lost: offline, their connection dropped,
        their jobs requeued (a retry spent) or, if being cancelled, ended.  Counts the
        connected nodes for the heartbeat interval on the way.  None while this master
        does not hold the lease; the grace starts again once it does."""
        pace, connected = self.pace, 0
        now = self.state.clock.monotonic()
        if not self.holds_lease():
            if self._lapsed_at is None:
                log.warning("the lease is not held: no node is judged until it is again")
                self._lapsed_at = now
            if now - self._lapsed_at >= LET_GO_AFTER:
                self._let_agents_go()
        elif self._lapsed_at is not None:
            self._lapsed_at = None
            self.grace(self.grace_seconds)
            log.info("the lease is held again: no node is lost for %.0f s", self.grace_seconds)
        if self._lapsed_at is not None or now < self.grace_until:
            pace.count(sum(node.connected for node in self.state.nodes.values()))
            return
        least = pace.timeout  # no node's is shorter: most are judged without a lookup
        for node in self.state.nodes.values():
            silent = now - node.heard
            # An offline node may still hold jobs: loaded as running after a master restart.
            if (
                silent <= least
                or (node.state == NodeState.OFFLINE and not node.jobs)
                or silent <= pace.timeout_of(node.node_id)
            ):
                connected += node.connected
                continue
            if node.link is not None:
                node.link.close()
                node.link = None
            node.move(NodeEvent.LOST)
            self.store.save_node(node.node_id, node.to_record())  # the next leader: down
            log.warning("node %s lost: silent for %.0f s", node.node_id, silent)
            for job in self.state.running_jobs_on(node):
                self.life.slot_lost(job, EndReason.NODE_LOST, f"node {node.node_id} lost")
            node.busy.clear()
            node.shares.clear()
            node.changed()
            node.jobs.clear()
        pace.count(connected)
