"""The nodes the master knows: what each has, its state, which GPU runs which job."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from mgpu.model import NODE_MOVES, NodeEvent, NodeState
from mgpu.protocol import CpuDesc, GpuDesc, GpuTelemetry, batch_frames, encode
from mgpu.scheduler.types import SHARE_UNITS

if TYPE_CHECKING:
    from mgpu.master.runtime.clock import Clock

log = logging.getLogger("mgpu.master")


class Unsendable(ValueError):
    """A message that cannot be encoded for the wire; the message says why in a phrase."""


ACK = '{"type":"forget"'
"""How an encoded `Forget` begins: an acknowledgement, which need not leave at once."""
ACK_WAIT = 0.02
"""Seconds a frame of acknowledgements alone waits for another message to go with."""
HOLD_POLL = 0.05
"""Seconds between two looks, while a link holds its messages, whether the lease is back."""


INPUT_WINDOW = 256 * 1024
"""Bytes of one terminal's typed input that may be on their way to its agent, not yet
acknowledged (`TerminalAck`); the client's next frame waits for room.  Far more than a
person types, and more than the agent's acknowledgement step (TERMINAL_ACK_EVERY) and one
frame (MAX_TERMINAL_INPUT) together, so input always flows."""


class InputWindow:
    """One terminal's typed input in flight to its agent: taken as it is sent, given back
    as the agent acknowledges it; `room` is set while there is room for more."""

    def __init__(self, limit: int = INPUT_WINDOW) -> None:
        self.limit = limit
        self.in_flight = 0
        self.room = asyncio.Event()
        self.room.set()

    def take(self, n: int) -> None:
        self.in_flight += n
        if self.in_flight >= self.limit:
            self.room.clear()

    def give_back(self, n: int) -> None:
        self.in_flight = max(0, self.in_flight - n)
        if self.in_flight < self.limit:
            self.room.set()


class AgentLink:
    """The master's end of one agent's WebSocket: an outbox drained by a writer task.

    Typed input (terminal_input) is held to an `InputWindow` per run: what the master's
    queues and the agent hold of one terminal's input is bounded, and the terminal's
    client waits (master/http/attach.py) rather than the master's memory growing."""

    def __init__(
        self,
        node_id: str,
        ws: Any,
        may_send: Callable[[], bool] | None = None,
        may_hold: Callable[[], bool] | None = None,
    ) -> None:
        self.node_id = node_id
        self.ws = ws
        self.may_send = may_send
        """Several masters (master/ha): whether this one may send anything now (it leads
        and its lease has not run out).  When not, nothing more is sent on this link and
        it is closed: the agent says hello again, to whichever master leads."""
        self.may_hold = may_hold
        """Whether this master is only out of its lease (Leadership.may_hold): then what
        goes to an agent that watches for the leader itself is held until the lease is
        renewed, not dropped with the link.  Such an agent stays through a paused
        database (control/nodes.py); without this, the writes that waited for the
        database would close its link with their messages the moment it answers again."""
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = False
        self.input: dict[str, InputWindow] = {}
        """Run id → its typed input in flight on this link."""
        self.no_signal: str | None = None
        """Why a job's run on this node cannot be signalled (a Kubernetes Node whose
        partition runs no pod agents); None: it can."""

    def send(self, message: BaseModel) -> None:
        """Queue one message, encoded on its own: one that cannot be (a lone surrogate in
        a string, say) raises Unsendable here and never reaches the connection's frames."""
        if self.closed:
            return
        if self.may_send is not None and not self.may_send() and not self._holds():
            self._fenced()
            return
        try:
            text = encode(message)
            text.encode()  # what send_text will do: must not fail later, inside a batch
        except ValueError as e:  # pydantic's serialisation errors and UnicodeError alike
            raise Unsendable(_why_unencodable(e)) from None
        self.outbox.put_nowait(text)

    def input_sent(self, run_id: str, size: int) -> None:
        """`size` bytes of the run's typed input are on their way (in its window)."""
        if not self.closed:
            self.input.setdefault(run_id, InputWindow()).take(size)

    def input_acked(self, run_id: str, size: int) -> None:
        """The agent has passed `size` bytes of the run's input on (or dropped them)."""
        window = self.input.get(run_id)
        if window is not None:
            window.give_back(size)
            if not window.in_flight:
                del self.input[run_id]

    def input_room(self, run_id: str) -> asyncio.Event | None:
        """None when the run may send more input now, else an event set once it may (or
        once the link closes: its window goes with it)."""
        window = self.input.get(run_id)
        if self.closed or window is None or window.room.is_set():
            return None
        return window.room

    async def writer(self) -> None:
        while True:
            item = await self.outbox.get()
            if item is None:
                # Given up on (node declared lost, or replaced by a newer connection): end
                # the connection too, so that an agent cut off by a network partition
                # learns it when the network heals, and says hello again.
                with contextlib.suppress(Exception):
                    await self.ws.close()
                return
            items: list[str | None] = [item]
            while not self.outbox.empty() and items[-1] is not None:
                items.append(self.outbox.get_nowait())
            if all(i is not None and i.startswith(ACK) for i in items):
                # Only acknowledgements: they wait a moment for the next message (a launch,
                # usually), so that one frame and one wake-up of the agent carry both.
                with contextlib.suppress(TimeoutError):
                    items.append(await asyncio.wait_for(self.outbox.get(), ACK_WAIT))
                    while not self.outbox.empty() and items[-1] is not None:
                        items.append(self.outbox.get_nowait())
            closing = items[-1] is None
            encoded = [i for i in items if i is not None]
            if self.may_send is not None and not self.may_send() and not await self._renewed():
                self._fenced()  # not one of them goes out
                with contextlib.suppress(Exception):
                    await self.ws.close(code=1012)
                return
            try:
                for frame in batch_frames(encoded):
                    await self.ws.send_text(frame)
            except Exception:  # the reader side notices and cleans up
                self.closed = True
                self._drop_inputs()
                return
            if closing:
                with contextlib.suppress(Exception):
                    await self.ws.close()
                return

    def _holds(self) -> bool:
        """Whether what this link would send waits for the lease's renewal (`may_hold`)."""
        return self.watches_leader and self.may_hold is not None and self.may_hold()

    async def _renewed(self) -> bool:
        """Wait while the link holds its messages (`_holds`): True once this master may
        send again; False once it may not wait any more (deposed) or the link closed."""
        while self._holds() and not self.closed:
            await asyncio.sleep(HOLD_POLL)
            if self.may_send is None or self.may_send():
                return True
        return False

    def close(self) -> None:
        self.closed = True
        self._drop_inputs()
        with contextlib.suppress(asyncio.QueueFull):
            self.outbox.put_nowait(None)

    watches_leader = False
    """Its agent leaves a master out of its lease once another leads (Hello.watches_leader)."""

    def let_go(self) -> bool:
        """This master does not lead now (master/ha): the link is closed, nothing more goes
        out, and the agent says hello again, to whichever master leads.  True: closed."""
        self._fenced()
        return True

    def _fenced(self) -> None:
        """This master may not send (master/ha): nothing more goes out on this link."""
        self.closed = True
        self._drop_inputs()
        while not self.outbox.empty():
            self.outbox.get_nowait()
        with contextlib.suppress(asyncio.QueueFull):
            self.outbox.put_nowait(None)

    def _drop_inputs(self) -> None:
        for window in self.input.values():
            window.room.set()  # whoever waits for room finds the link gone
        self.input.clear()


def _why_unencodable(error: Exception) -> str:
    if "surrogate" in str(error):
        return "a string in it is not valid Unicode (a lone surrogate)"
    return f"it cannot be encoded ({str(error).splitlines()[0][:200]})"


SHAPE_FIELDS = frozenset({"gpus", "gpu_type", "rack", "features", "cpus", "mem_mb"})
"""What a node is: what decides whether a job could ever run on it."""
VIEW_FIELDS = SHAPE_FIELDS | {"state", "link", "foreign_blocked", "busy"}
"""The fields the scheduler's view of a node reads (master/snapshot.node_views)."""


@dataclass
class NodeRecord:
    node_id: str
    hostname: str = ""
    ip: str = ""
    gpus: list[GpuDesc] = field(default_factory=list)
    gpu_source: str = "unknown"
    state: NodeState = NodeState.OFFLINE
    reason: str | None = None
    drain_requested: bool = False
    gpu_type: str | None = None
    rack: str | None = None
    features: list[str] = field(default_factory=list)
    run_as_user: str | None = None
    containment: str | None = None
    gpu_isolation: str | None = None
    """What the agent said in its hello: how it contains jobs and keeps them to their GPUs."""
    failures: int = 0
    """Consecutive node failures (launch errors, lost jobs); reset by a clean job end."""
    last_seen: float = 0.0
    """When the agent was last heard from, wall-clock seconds (shown and compared with
    other wall times; never a duration's start)."""
    heard: float = 0.0
    """The same moment on the monotonic clock (`Clock.monotonic`): how long a node has
    been silent is measured on it, so a jump of the wall clock declares no node lost."""
    telemetry: dict[int, GpuTelemetry] = field(default_factory=dict)
    foreign_blocked: frozenset[int] = frozenset()
    """GPUs not offered to the scheduler: used outside mgpu beyond the threshold."""
    busy: dict[int, str] = field(default_factory=dict)
    """GPU index -> job id holding it whole."""
    shares: dict[int, dict[str, int]] = field(default_factory=dict)
    """Shared GPUs: index -> {job id: share units} of the fractional jobs on it (never a
    GPU in `busy` too; an entry goes when its last share does)."""
    jobs: set[str] = field(default_factory=set)
    """Jobs with a live slot here (GPU jobs and CPU-only jobs alike)."""
    cpus: list[CpuDesc] = field(default_factory=list)
    """The CPUs it offers to jobs (what its agent said less the config's reserve), by id;
    empty: it does not say (an older agent), and it holds no job that asks for CPUs."""
    mem_mb: int = 0
    """Memory (MiB) it offers to jobs, the reserve taken off; 0: it does not say."""
    cpu_jobs: dict[int, str] = field(default_factory=dict)
    """CPU id -> the job holding it (the ledger, as `busy` for GPUs)."""
    mem_jobs: dict[str, int] = field(default_factory=dict)
    """Job id -> the memory (MiB) it holds here."""
    whole_job: str | None = None
    """The `--exclusive` job holding it whole: no other job starts here while it runs."""
    link: AgentLink | None = None
    partition: str | None = None
    """The Kubernetes-backed partition whose Node this is (mgpu.master.kube); None: a
    node of mgpu's own agent."""
    others: list[dict[str, Any]] = field(default_factory=list)
    """A Kubernetes Node's Pods that are not mgpu's running jobs (other workloads, Pods
    still terminating): what each holds, shown with the node."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in VIEW_FIELDS:
            self.changed(name in SHAPE_FIELDS)

    def heard_now(self, clock: Clock) -> None:
        """The agent was heard from (a message, a hello), or is given a full timeout."""
        self.last_seen, self.heard = clock.time(), clock.monotonic()

    def watch(self, watcher: Callable[[str, bool], None]) -> None:
        """Tell `watcher(node_id, shape)` of every change to what the scheduler's view of
        this node reads (master/state/nodeindex.py)."""
        object.__setattr__(self, "_watcher", watcher)

    def changed(self, shape: bool = False) -> None:
        """The scheduler's view of this node is stale: called by itself when a field in
        `VIEW_FIELDS` is assigned, and by whoever changes `busy` in place (the ledger)."""
        watcher = self.__dict__.get("_watcher")
        if watcher is not None:
            watcher(self.node_id, shape)

    @property
    def connected(self) -> bool:
        return self.link is not None and not self.link.closed

    @property
    def schedulable(self) -> bool:
        return self.connected and self.state == NodeState.ONLINE

    def free_gpus(self) -> frozenset[int]:
        return frozenset(
            g.index for g in self.gpus if g.index not in self.busy and g.index not in self.shares
        )

    def free_cpu_count(self) -> int:
        """Offered CPUs no job holds."""
        return sum(1 for c in self.cpus if c.id not in self.cpu_jobs)

    def free_mem_mb(self) -> int:
        return max(0, self.mem_mb - sum(self.mem_jobs.values()))

    def bare_job_count(self) -> int:
        """Jobs running here that hold none of its GPUs, CPUs or memory (`--gpus 0`, no
        ask): no GPU or CPU shows them, yet the node is not idle for `--exclusive`."""
        if not self.jobs:
            return 0
        holding = {*self.busy.values(), *self.cpu_jobs.values(), *self.mem_jobs}
        holding.update(job_id for tenants in self.shares.values() for job_id in tenants)
        return len(self.jobs - holding)

    def shared_units(self) -> dict[int, int]:
        """Shared GPUs: index -> share units in use (what `NodeView.shared` holds)."""
        return {g: sum(jobs.values()) for g, jobs in self.shares.items()}

    def move(self, event: NodeEvent) -> NodeState:
        """Apply one event of `NODE_MOVES`; a drain request (kept while the node was away,
        `drain_requested` is the node's desired state) is applied again as it joins, and a
        draining node without jobs is drained at once."""
        self.state = NODE_MOVES.get((self.state, event), self.state)
        if event == NodeEvent.JOINED and self.drain_requested:
            self.state = NODE_MOVES[(self.state, NodeEvent.DRAIN)]
        if self.state == NodeState.DRAINING and not self.jobs:
            self.state = NODE_MOVES[(self.state, NodeEvent.EMPTIED)]
        return self.state

    def to_record(self) -> dict[str, Any]:
        """What survives a master restart."""
        return {
            "hostname": self.hostname,
            "ip": self.ip,
            "gpus": [g.model_dump() for g in self.gpus],
            "gpu_source": self.gpu_source,
            "drain_requested": self.drain_requested,
            "reason": self.reason,
            "failures": self.failures,
            "features": self.features,
            "cpus": [c.model_dump() for c in self.cpus],
            "mem_mb": self.mem_mb,
            "up": self.state != NodeState.OFFLINE,
        }

    def from_record(self, rec: dict[str, Any]) -> None:
        """Take a stored record back (`to_record`'s), the node offline until it is heard.
        Unchecked: a record from before hellos were bounded must not stop the master; the
        agent's next hello replaces it with checked values."""
        self.hostname = rec.get("hostname", "")
        self.ip = rec.get("ip", "")
        self.gpus = [GpuDesc.model_construct(**g) for g in rec.get("gpus", [])]
        self.gpu_source = rec.get("gpu_source", "unknown")
        self.drain_requested = bool(rec.get("drain_requested"))
        self.reason = rec.get("reason")
        self.failures = int(rec.get("failures", 0))
        self.features = list(rec.get("features", []))
        self.cpus = [CpuDesc.model_construct(**c) for c in rec.get("cpus", [])]
        self.mem_mb = int(rec.get("mem_mb", 0))
        self.state = NodeState.OFFLINE

    def as_it_was(self) -> None:
        """Loaded by a master that has not heard from its agent yet (a new leader, a master
        restarted), a node that was up is shown as it was: online, or draining/drained as
        its drain request says; not connected until its agent says hello here, and
        declared lost only once silent for its timeout (master/control/nodes.py)."""
        self.state = NodeState.ONLINE
        if self.drain_requested:
            self.move(NodeEvent.DRAIN)

    def to_public(self, job_users: dict[str, str] | None = None) -> dict[str, Any]:
        gpus = []
        for g in self.gpus:
            job = self.busy.get(g.index)
            tel = self.telemetry.get(g.index)
            tenants = self.shares.get(g.index, {})
            gpus.append(
                {
                    "index": g.index,
                    "name": g.name,
                    "memory_mb": g.memory_mb,
                    "busy_job": job,
                    "busy_user": (job_users or {}).get(job) if job else None,
                    "telemetry": tel.model_dump() if tel else None,
                    "foreign_blocked": g.index in self.foreign_blocked,
                    "uuid": g.uuid,
                    "share_used": sum(tenants.values()) / SHARE_UNITS if tenants else None,
                    "shared_jobs": [
                        {
                            "job_id": job_id,
                            "user": (job_users or {}).get(job_id),
                            "share": units / SHARE_UNITS,
                        }
                        for job_id, units in sorted(tenants.items())
                    ],
                }
            )
        return {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "ip": self.ip,
            "state": self.state.value,
            "reason": self.reason,
            "connected": self.connected,
            "gpu_source": self.gpu_source,
            "gpu_type": self.gpu_type,
            "rack": self.rack,
            "features": self.features,
            "run_as_user": self.run_as_user,
            "containment": self.containment,
            "gpu_isolation": self.gpu_isolation,
            "failures": self.failures,
            "last_seen": self.last_seen,
            "jobs": sorted(self.jobs),
            "gpus": gpus,
            # null: the node does not say (an agent from before CPUs were scheduled)
            "cpus": len(self.cpus) if self.cpus else None,
            "cpus_free": self.free_cpu_count() if self.cpus else None,
            "mem_mb": self.mem_mb or None,
            "mem_free_mb": self.free_mem_mb() if self.mem_mb else None,
            **self._kube_public(),
        }

    def _kube_public(self) -> dict[str, Any]:
        if self.partition is None:
            return {}
        return {"partition": self.partition, "kubernetes": True, "pods": list(self.others)}
