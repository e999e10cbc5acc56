"""The node routes: list (anyone), drain, resume and remove (admins; master/control/nodes.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from mgpu.master.http.deps import Asker, Ctl

__all__ = ["router"]

router = APIRouter()


class DrainRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=1000)


@router.get("/api/nodes")
async def nodes(cl: Ctl) -> dict[str, Any]:
    return {"nodes": cl.nodes_public()}


@router.post("/api/nodes/{node_id}/drain")
async def drain(node_id: str, body: DrainRequest, cl: Ctl, actor: Asker) -> dict[str, Any]:
    actor.check_admin("drain")
    node = cl.drain(node_id, body.reason, actor=actor.user, address=actor.address)
    return cl.node_public(node)


@router.delete("/api/nodes/{node_id}")
async def remove_node(node_id: str, cl: Ctl, actor: Asker) -> Any:
    """Forget a node and its secret (`mgpu node remove`); see Cluster.remove_node."""
    actor.check_admin("node remove")
    requeued = cl.remove_node(node_id, actor=actor.user, address=actor.address)
    return {"removed": node_id, "requeued": requeued}


@router.post("/api/nodes/{node_id}/resume")
async def resume(node_id: str, cl: Ctl, actor: Asker) -> dict[str, Any]:
    actor.check_admin("resume")
    node = cl.resume(node_id, actor=actor.user, address=actor.address)
    return cl.node_public(node)
