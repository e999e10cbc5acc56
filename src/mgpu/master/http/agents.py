"""The agents' WebSocket (`/api/agent`): the hello handshake, then the agent's messages.

Anyone who reaches the port may open one (the join token is in the hello), so the hello is
bounded in time and size before it is parsed, few may wait for theirs at once, and a wrong
join token or node secret is counted and slowed down as a bad user token is (guard.py).
What a hello and each message mean is the controller's (master/control/agents.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from mgpu.master.control.cluster import Cluster
from mgpu.master.http.deps import EdgeState, client_address, cluster, edge, leadership
from mgpu.master.state.registry import AgentLink
from mgpu.protocol import Hello, HelloError, Refused, encode, parse_agent_messages, parse_hello

__all__ = ["HELLO_LIMIT", "HELLO_TIMEOUT", "router"]

log = logging.getLogger("mgpu.master")

HELLO_LIMIT = 4 << 20
"""Characters an agent's hello may have: 10,000 runs and 64 GPUs take about 1 MiB."""
HELLO_TIMEOUT = 10.0
"""Seconds from the connection's upgrade to its hello: an agent sends it at once."""

router = APIRouter()


@router.websocket("/api/agent")
async def agent_channel(ws: WebSocket) -> None:
    cl, state = cluster(ws), edge(ws)
    if state.hellos_awaited >= cl.config.cluster.master.pending_hellos:
        # Closed, not refused: an agent (and bench/swarm.py) tries again after its
        # backoff, and a refused hello would stop it.  An HTTP refusal before the
        # accept would make an agent that guesses TLS switch to it for a try.
        with contextlib.suppress(Exception):
            await ws.accept()
            await ws.close(code=1013, reason="too many agents saying hello: try again")
        return
    state.hellos_awaited += 1  # before the accept: counted by the time the peer may go on
    try:
        await ws.accept()
        first = parse_hello(await _hello_text(ws))
    except (HelloError, WebSocketDisconnect) as e:
        with contextlib.suppress(Exception):
            await ws.send_text(encode(Refused(reason=str(e) or "no hello")))
            await ws.close()
        return
    finally:
        state.hellos_awaited -= 1
    link = await _admit(ws, cl, state, first)
    if link is not None:
        await _serve(ws, cl, first.node_id, link)


async def _admit(ws: WebSocket, cl: Cluster, state: EdgeState, first: Hello) -> AgentLink | None:
    """The agent's link once its hello is accepted and welcomed; None once it is refused."""
    address = client_address(ws)
    refusal = cl.refuse_hello(first)
    if refusal is None and not cl.join_allowed(first.token):
        refusal = "not authorised: " + (
            "no join token given (mgpu node --token, or $MGPU_JOIN_TOKEN)"
            if not first.token
            else "wrong join token"
        )
        await _slow_down(state, address)
    new_secret = None
    if refusal is None:
        # No await from here to agent_hello: a secret issued is a node accepted.
        verdict = cl.verify_node(first)
        refusal, new_secret = verdict.refusal, verdict.new_secret
        if verdict.bad_secret:
            await _slow_down(state, address)
    if refusal is not None:
        state.refused_hellos.failed(address, None, refusal, actor=first.node_id)
        log.warning("refused agent %s from %s: %s", first.node_id, ws.client, refusal)
        await ws.send_text(encode(Refused(reason=refusal)))
        await ws.close()
        return None
    election = leadership(ws)
    if election is not None and not election.may_send():
        # Its lease has run out by its own clock (the database away, or a standby about
        # to take over): it takes no agent until it is renewed.
        with contextlib.suppress(Exception):
            await ws.close(code=1013, reason="this master's lease is not valid now: try again")
        return None
    link = AgentLink(
        first.node_id,
        ws,
        None if election is None else election.may_send,
        None if election is None else election.may_hold,
    )
    link.watches_leader = first.watches_leader
    welcome = cl.agent_hello(first, link, new_secret)
    if election is not None:
        # The agents keep the highest generation they saw and refuse an older leader.
        welcome.generation = election.generation
    await ws.send_text(encode(welcome))
    return link


async def _slow_down(state: EdgeState, address: str) -> None:
    """A wrong secret from `address`: counted, and answered later the more there were."""
    delay = state.throttle.delay(address)
    state.throttle.failed(address)
    if delay:
        await asyncio.sleep(delay)


async def _serve(ws: WebSocket, cl: Cluster, node_id: str, link: AgentLink) -> None:
    """The agent's messages to the controller until it goes (or a newer link replaces it)."""
    writer = asyncio.create_task(link.writer())
    try:
        while True:
            raw = await ws.receive_text()
            if link.closed:
                break  # replaced by a newer connection of this node, or given up on
            errors: list[str] = []
            try:
                messages = parse_agent_messages(raw, errors)
            except ValueError:  # ValidationError included: not JSON, or one bad message
                log.warning("bad message from %s: %.200s", node_id, raw)
                continue
            for error in errors:  # the frame's other messages are handled all the same
                log.warning("bad message from %s skipped: %s", node_id, error)
            for msg in messages:
                try:
                    cl.agent_message(node_id, msg)
                except Exception:  # one message's bug must not cost the connection
                    log.exception("handling a %s message from %s failed", msg.type, node_id)
    except WebSocketDisconnect:
        pass
    finally:
        link.close()
        cl.agent_disconnected(node_id, link)
        writer.cancel()


async def _hello_text(ws: WebSocket) -> str:
    """The first message of an agent's connection, bounded before it is parsed: whoever
    can reach the port may open one (the join token is in the hello), so a peer that
    sends nothing, or something huge, must not hold the connection and its memory."""
    try:
        message = await asyncio.wait_for(ws.receive(), HELLO_TIMEOUT)
    except TimeoutError:
        raise HelloError(f"no hello within {HELLO_TIMEOUT:g} s") from None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        raise HelloError("the first message must be hello (it is not text)")
    if len(text) > HELLO_LIMIT:
        raise HelloError(f"the hello is {len(text)} characters long; at most {HELLO_LIMIT}")
    return str(text)
