"""A node whose agent is not connected (its link dropped, or a new leader has not heard
from it yet) is shown as it is, with Slurm's `*` (not responding), not as down: `mgpu
nodes`, sinfo, scontrol and `mgpu top`.  Down (offline) only once lost (issue 32, item 6)."""

from __future__ import annotations

from typing import Any

from mgpu.client.render import render_nodes
from mgpu.client.top import gpu_state
from mgpu.slurm import fields, scontrol, sinfo, states


def node(name: str, state: str, connected: bool, busy: int = 0) -> dict[str, Any]:
    gpus = [{"index": i, "name": "GPU", "busy_job": "1" if i < busy else None} for i in range(2)]
    return {"node_id": name, "state": state, "connected": connected, "gpus": gpus}


NODES = [
    node("node001", "online", True),
    node("node002", "online", False),  # not heard from yet
    node("node003", "online", False, busy=1),
    node("node004", "drained", False),
    node("node005", "offline", False),  # lost
]


def test_slurm_states_keep_the_state_with_a_star() -> None:
    assert [states.node_state(n) for n in NODES] == [
        "idle",
        "idle*",
        "mixed*",
        "drained*",
        "down",
    ]
    assert "State=IDLE*" in scontrol.node_text(NODES[1])


def test_sinfo_shows_and_filters_not_responding_nodes() -> None:
    parts = [sinfo.Partition("gpu", True, "infinite", [n["node_id"] for n in NODES])]
    items = fields.parse_percent("sinfo", "%D %t %N", sinfo.KNOWN, what="node")
    rows = sinfo.rows(parts, NODES, per_node=False, wanted=None)
    assert fields.render_percent(items, sinfo.KNOWN, rows, True) == [
        "NODES STATE NODELIST",
        "1 idle node001",
        "1 idle* node002",
        "1 mix* node003",
        "1 drain* node004",
        "1 down node005",
    ]
    idle = sinfo.rows(parts, NODES, per_node=True, wanted={"idle"})
    assert [r.nodes[0]["node_id"] for r in idle] == ["node001", "node002"]
    assert [r.nodes[0]["node_id"] for r in sinfo.rows(parts, NODES, True, {"mix"})] == ["node003"]


def test_mgpu_nodes_and_top() -> None:
    lines = render_nodes(NODES).splitlines()
    assert [line.split()[1] for line in lines[1:]] == [
        "online",
        "online*",
        "online*",
        "drained*",
        "offline*",
    ]
    assert [gpu_state(n, n["gpus"][1]) for n in NODES] == [
        "free",
        "reconnecting",
        "reconnecting",
        "reconnecting",
        "offline",
    ]
