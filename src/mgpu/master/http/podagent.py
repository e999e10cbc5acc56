"""The pod agents' WebSocket (`/api/kube/pod`): mgpu's agent in a job's Pod on a
Kubernetes partition (mgpu.podagent), which runs that job's steps.

The edge's Guard has authenticated the connection before the upgrade (the job's own
credential, as `srun` in the job uses it); which Pod it speaks for is the `X-Mgpu-Pod`
header, and the controller's side (mgpu.master.kube.podagents) admits it only for a Pod
of that very job's running run."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from mgpu.master.http.deps import cluster
from mgpu.master.kube.podagents import PodAgent, PodAgents
from mgpu.protocol import Refused, encode, parse_agent_messages

__all__ = ["POD_AGENT_PATH", "POD_HEADER", "router"]

log = logging.getLogger("mgpu.master")

POD_AGENT_PATH = "/api/kube/pod"
POD_HEADER = "x-mgpu-pod"

router = APIRouter()


@router.websocket(POD_AGENT_PATH)
async def pod_agent_channel(ws: WebSocket) -> None:
    cl = cluster(ws)
    ident = ws.scope.get("state", {}).get("identity")
    pod = ws.headers.get(POD_HEADER, "")
    agents: PodAgents | None = cl.pod_agents
    await ws.accept()
    if agents is None:
        admitted: object = "this master has no Kubernetes partition"
    else:
        admitted = agents.admit(pod, ident.token_id if ident is not None else "")
    if isinstance(admitted, str) or agents is None:
        log.warning("refused the pod agent of %r from %s: %s", pod, ws.client, admitted)
        with contextlib.suppress(Exception):
            await ws.send_text(encode(Refused(reason=str(admitted))))
            await ws.close(code=1008)
        return
    assert isinstance(admitted, PodAgent)
    agent = admitted
    agents.attach(agent)

    async def write() -> None:
        while not agent.closed:
            text = await agent.outbox.get()
            if agent.closed:
                break
            await ws.send_text(text)
        with contextlib.suppress(Exception):
            await ws.close(code=1000)

    writer = asyncio.create_task(write())
    try:
        while not agent.closed:
            raw = await ws.receive_text()
            errors: list[str] = []
            try:
                messages = parse_agent_messages(raw, errors)
            except ValueError:
                log.warning("bad message from the pod agent of %s: %.200s", pod, raw)
                continue
            for msg in messages:
                try:
                    agents.received(agent, msg)
                except Exception:  # one message's bug must not cost the connection
                    log.exception("a %s message of the pod agent of %s failed", msg.type, pod)
    except (WebSocketDisconnect, RuntimeError):
        pass  # gone (RuntimeError: closed by our writer while this read)
    finally:
        agents.detach(agent)
        writer.cancel()
