"""The master's controller in-process, for tests that run in milliseconds.

The real `Cluster` over an in-memory SQLite store, with a fake clock that also holds the
controller's timers (the group commit, lazy writes), and fake agents: each has a link
that records the messages the master sends it, and helpers that feed the master what a
real agent would say (hello, started, exited, heartbeat).  No uvicorn, no processes, no
event loop: `settle()` runs what the loop would run at the end of a turn (the flush), and
`advance(seconds)` moves the clock and fires the timers that came due.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from mgpu.agent import grants
from mgpu.config import ClusterConfig
from mgpu.master.control.cluster import Cluster
from mgpu.master.control.submit import JobSpec
from mgpu.master.security.auth import TokenStore
from mgpu.master.security.nodeauth import NodeSecrets
from mgpu.master.state.registry import AgentLink
from mgpu.master.store.base import Store
from mgpu.master.store.outputs import FileOutputStore
from mgpu.master.store.sqlite import MEMORY, SqliteStore
from mgpu.model import Job
from mgpu.protocol import (
    CpuDesc,
    Exited,
    GpuDesc,
    GpuTelemetry,
    Heartbeat,
    Hello,
    Kill,
    Launch,
    Output,
    PortReserved,
    ReservePort,
    RunMemory,
    RunningReport,
    Started,
    Welcome,
    parse_master_messages,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def seen_env(launch: Launch) -> dict[str, str]:
    """What a launch's process sees of the master's variables: its `env` with the GPU
    variables an agent makes of its grant (mgpu.agent.grants; a node without MIG)."""
    return grants.apply(launch.env, launch.grant, [])


START = 1_700_000_000.0


class FakeClock:
    """`Clock` and `Timers` at once: time moves only when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self.mono = 0.0
        self._soon: list[Callable[[], None]] = []
        self._later: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def jump(self, seconds: float) -> None:
        """The wall clock alone jumps (an NTP step, an operator's `date -s`): intervals,
        on the monotonic clock, do not move."""
        self.now += seconds

    def call_soon(self, callback: Callable[[], None]) -> None:
        self._soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._later, (self.now + delay, next(self._seq), callback))

    def run_soon(self) -> None:
        while self._soon:
            self._soon.pop(0)()

    def advance(self, seconds: float) -> None:
        """Move on by `seconds`, running each timer at its time, then what they armed."""
        end = self.now + seconds
        while self._later and self._later[0][0] <= end:
            when, _, callback = heapq.heappop(self._later)
            self.mono += max(0.0, when - self.now)
            self.now = max(self.now, when)
            callback()
            self.run_soon()
        self.mono += end - self.now
        self.now = end
        self.run_soon()


class FakeLink(AgentLink):
    """An agent's connection that keeps what the master sends (each message encoded, as
    the real link does, so one that cannot travel is refused the same way)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id, ws=None)
        self.sent: list[BaseModel] = []

    def send(self, message: BaseModel) -> None:
        super().send(message)
        while not self.outbox.empty():
            item = self.outbox.get_nowait()
            if item is not None:
                self.sent += parse_master_messages(item)

    def take(self, kind: type[M] | None = None) -> list[Any]:
        """The messages sent since the last take (of one kind, if given; others stay)."""
        if kind is None:
            out, self.sent = self.sent, []
            return out
        out = [m for m in self.sent if isinstance(m, kind)]
        self.sent = [m for m in self.sent if not isinstance(m, kind)]
        return out


class FakeAgent:
    """One node's agent as the master sees it: its messages go to the controller."""

    def __init__(
        self,
        h: Harness,
        node_id: str,
        gpus: int,
        cpus: int | list[CpuDesc] | None = None,
        mem_mb: int | None = None,
    ) -> None:
        self.h = h
        self.node_id = node_id
        self.gpus = [GpuDesc(index=i, name="Fake GPU", memory_mb=16000) for i in range(gpus)]
        if isinstance(cpus, int):  # as `mgpu node --fake-cpus N`: each its own core
            cpus = [CpuDesc(id=i, core=i, numa=0) for i in range(cpus)]
        self.cpus = cpus
        """What its hello says of its CPUs and memory (None: nothing, an older agent)."""
        self.mem_mb = mem_mb
        self.link = FakeLink(node_id)
        self.welcome: Welcome | None = None

    def hello(self, running: list[RunningReport] | None = None) -> Welcome:
        """Connect (again, after the old connection died): a new link, what this agent runs."""
        if self.welcome is not None:
            self.disconnect()
        self.link = FakeLink(self.node_id)
        hello = Hello(
            node_id=self.node_id,
            hostname=f"host-{self.node_id}",
            ip=f"10.0.{len(self.h.agents) // 256}.{len(self.h.agents) % 256}",
            gpus=self.gpus,
            running=running or [],
            cpus=self.cpus,
            mem_mb=self.mem_mb,
        )
        self.welcome = self.h.cl.agent_hello(hello, self.link)
        self.h.settle()
        return self.welcome

    def send(self, message: BaseModel) -> None:
        self.h.cl.agent_message(self.node_id, message)
        self.h.settle()

    def disconnect(self) -> None:
        self.link.close()
        self.h.cl.agent_disconnected(self.node_id, self.link)

    def epoch(self, job_id: str) -> int:
        return self.h.job(job_id).epoch

    def started(self, job_id: str, epoch: int | None = None, pid: int = 4242) -> None:
        e = self.epoch(job_id) if epoch is None else epoch
        self.send(
            Started(
                job_id=job_id,
                epoch=e,
                pid=pid,
                hostname=f"host-{self.node_id}",
                ip="10.0.0.1",
                time=self.h.clock.now,
            )
        )

    def exited(
        self, job_id: str, code: int | None = 0, epoch: int | None = None, **kw: Any
    ) -> None:
        e = self.epoch(job_id) if epoch is None else epoch
        self.send(Exited(job_id=job_id, epoch=e, exit_code=code, time=self.h.clock.now, **kw))

    def output(self, job_id: str, data: str, epoch: int | None = None) -> None:
        e = self.epoch(job_id) if epoch is None else epoch
        self.send(Output(job_id=job_id, epoch=e, stream="o", data=data))

    def port(self, job_id: str, port: int = 29500) -> None:
        self.send(PortReserved(job_id=job_id, epoch=self.epoch(job_id), port=port))

    def heartbeat(
        self, telemetry: list[GpuTelemetry] | None = None, memory: list[RunMemory] | None = None
    ) -> None:
        self.send(Heartbeat(telemetry=telemetry or [], memory=memory or []))

    def running(self, job_id: str, exited: bool = False) -> RunningReport:
        """This agent's report of a run, for a hello."""
        return RunningReport(
            job_id=job_id, epoch=self.epoch(job_id), pid=None if exited else 4242, exited=exited
        )

    def launches(self) -> list[Launch]:
        return self.link.take(Launch)

    def kills(self) -> list[Kill]:
        return self.link.take(Kill)

    def port_requests(self) -> list[ReservePort]:
        return self.link.take(ReservePort)


class Harness:
    def __init__(
        self, root: Path, config: dict[str, Any] | None = None, store: Store | None = None
    ) -> None:
        self.root = root
        self.config = ClusterConfig.model_validate(config or {})
        self.clock = FakeClock()
        self.store = store or SqliteStore(MEMORY)
        self.outputs = FileOutputStore(root / "output")
        self.agents: dict[str, FakeAgent] = {}
        self.cl = self._controller()

    def _controller(self) -> Cluster:
        tokens = TokenStore(self.store, self.root, "f" * 16)
        secrets = NodeSecrets(self.store)
        return Cluster(
            self.config,
            self.store,
            tokens,
            self.outputs,
            secrets,
            clock=self.clock,
            timers=self.clock,
            owner="owner",
        )

    def crash(self) -> None:
        """The master dies and starts again on the same store: what was not flushed is lost,
        the agents' links with it (they say hello again when a test makes them)."""
        self.clock._soon.clear()
        self.clock._later.clear()
        for agent in self.agents.values():
            agent.link.close()
        self.cl = self._controller()

    def close(self) -> None:
        self.outputs.close_all()
        self.store.close()

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One statement on the store's tables, whichever backend (`?` placeholders)."""
        if isinstance(self.store, SqliteStore):
            return self.store.db.execute(query, params).fetchall()
        conn = self.store.connection()  # type: ignore[attr-defined]  # PostgresStore
        cur = conn.execute(query.replace("?", "%s"), params)
        return list(cur.fetchall()) if cur.description else []

    # ---- driving ----------------------------------------------------------

    def settle(self) -> None:
        """End of an event-loop turn: the flush (write, then send) runs."""
        self.clock.run_soon()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def tick(self) -> None:
        """One round of the scheduling loop (liveness, then a pass), then the flush."""
        self.cl.loop.tick(woken=True)
        self.settle()

    def agent(self, node_id: str, gpus: int = 4, hello: bool = True, **host: Any) -> FakeAgent:
        """A node's agent; `host`: its `cpus` (a count or CpuDescs) and `mem_mb`."""
        agent = self.agents[node_id] = FakeAgent(self, node_id, gpus, **host)
        if hello:
            agent.hello()
        return agent

    def submit(self, command: str = "true", user: str = "alice", **fields: Any) -> str:
        spec = JobSpec.model_validate({"command": command, **fields})
        result = _run(self.cl.submit(spec, user))
        self.settle()
        return result.job_id

    def job(self, job_id: str) -> Job:
        job = self.cl.get_job(job_id)
        assert job is not None, job_id
        return job

    def stored(self, job_id: str) -> Job:
        job = self.store.get_job(job_id)
        assert job is not None, job_id
        return job

    def start(self, command: str = "true", agent: FakeAgent | None = None, **fields: Any) -> str:
        """Submit, schedule, and have the agent(s) report the process started."""
        job_id = self.submit(command, **fields)
        self.tick()
        job = self.job(job_id)
        for slot in job.allocation:
            if slot.phase.value == "sent":
                self.agents[slot.node_id].started(job_id)
        return job_id

    def node(self, node_id: str) -> Any:
        return self.cl.nodes[node_id]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.store.events() if e["kind"] == kind]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits for anything but a turn of the loop
    (`asyncio.sleep(0)`, which yields None): a submit without a site validator."""
    try:
        while coro.send(None) is None:
            pass
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the coroutine waited for something: not in the harness")
