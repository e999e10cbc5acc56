"""The node index (master/state/nodeindex.py): the scheduler's node views and free pool kept up
to date per node must equal those rebuilt from every node record, after any sequence of
events."""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness import Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgpu.master.control.nodes import Conflict
from mgpu.master.control.submit import SubmitError
from mgpu.master.state.snapshot import node_views
from mgpu.model import JobState
from mgpu.protocol import GpuTelemetry
from mgpu.scheduler import FreePool
from poolcheck import observed

NODES = ["n1", "n2", "n3"]
OPS = [
    "submit",
    "started",
    "exit",
    "fail",
    "disconnect",
    "hello",
    "lose",
    "drain",
    "resume",
    "foreign",
    "unforeign",
    "remove",
    "cancel",
]


def assert_index_fresh(h: Harness) -> None:
    state = h.cl.state
    rebuilt = node_views(state.sorted_nodes())
    assert state.node_index.views() == rebuilt
    shape = [(v.node_id, v.gpu_indices, v.gpu_type, v.rack, v.features) for v in rebuilt]
    kept = state.node_index.shape()
    assert [(v.node_id, v.gpu_indices, v.gpu_type, v.rack, v.features) for v in kept] == shape
    assert state.node_index.gpu_count() == sum(len(v.gpu_indices) for v in rebuilt)
    assert observed(state.node_index.pool()) == observed(FreePool(rebuilt))


def apply(h: Harness, op: str, k: int) -> None:
    node_id = NODES[k % len(NODES)]
    agent = h.agents.get(node_id)
    running = [j for j in h.cl.jobs.values() if j.state == JobState.RUNNING]
    if op == "submit":
        try:
            h.submit("true", gpus=1 + k % 3)
        except SubmitError:  # no node left that big: refused, as it should be
            return
        h.tick()
    elif op in ("started", "exit", "fail") and running:
        job = running[k % len(running)]
        for slot in job.allocation:
            owner = h.agents.get(slot.node_id)
            if owner is None or not h.cl.nodes[slot.node_id].connected:
                continue
            if op == "started":
                owner.started(job.id)
            else:
                owner.exited(job.id, 0 if op == "exit" else 1)
        h.tick()
    elif op == "disconnect" and agent is not None:
        agent.disconnect()
    elif op == "hello":
        if agent is None:
            h.agent(node_id, gpus=2 + k % 3)
        else:
            agent.hello()
        h.tick()
    elif op == "lose":
        h.advance(h.config.networking.timeout + 1)
        for other in h.agents.values():  # the others stay alive
            record = h.cl.nodes.get(other.node_id)
            if other is not agent and record is not None and record.connected:
                other.heartbeat()
        h.tick()
    elif op == "drain" and node_id in h.cl.nodes:
        h.cl.drain(node_id, "test")
    elif op == "resume" and node_id in h.cl.nodes:
        h.cl.resume(node_id)
        h.tick()
    elif op in ("foreign", "unforeign") and agent is not None and h.cl.nodes.get(node_id):
        if h.cl.nodes[node_id].connected:
            mb = 100_000 if op == "foreign" else 0
            agent.heartbeat([GpuTelemetry(index=0, foreign_memory_mb=mb)])
            h.tick()
    elif op == "remove" and node_id in h.cl.nodes:
        try:
            h.cl.remove_node(node_id)
        except Conflict:
            return
        h.agents.pop(node_id, None)
        h.tick()
    elif op == "cancel" and h.cl.jobs:
        jobs = list(h.cl.jobs.values())
        h.cl.cancel(jobs[k % len(jobs)])
        h.tick()


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 8)), max_size=25))
def test_the_kept_views_equal_views_rebuilt_from_scratch(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp))
        try:
            h.agent("n1", gpus=4)
            h.agent("n2", gpus=2)
            assert_index_fresh(h)
            for op, k in ops:
                apply(h, op, k)
                assert_index_fresh(h)
        finally:
            h.close()


def test_a_freed_gpu_is_seen_by_the_next_pass(h: Harness) -> None:
    """The ledger changes `busy` in place: the view must follow, or the GPU stays busy."""
    a = h.agent("n1", gpus=1)
    first = h.start()
    second = h.submit()
    h.tick()
    assert h.job(second).state == JobState.QUEUED
    a.exited(first, 0)
    h.tick()
    assert h.job(second).state == JobState.RUNNING
    assert_index_fresh(h)


def test_a_node_added_behind_the_index_is_seen(h: Harness) -> None:
    """A record put in the table without ControllerState.node: the index starts again."""
    from mgpu.master.state.registry import NodeRecord

    h.agent("n1", gpus=2)
    assert len(h.cl.state.node_index.views()) == 1
    h.cl.state.nodes["n9"] = NodeRecord("n9")
    assert_index_fresh(h)
