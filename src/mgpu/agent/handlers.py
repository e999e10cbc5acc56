"""What the agent does with each message from the master: a table from the message's
class to its handler, and the reading of a frame into messages.

A handler gets the agent through `Node` (what handlers may use of it), so this module
never imports `mgpu.agent.agent`.  A message of a class with no handler here (a second
`Welcome`, say) is ignored.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from mgpu.agent.launcher import Launcher
from mgpu.agent.site import SiteHooks
from mgpu.protocol import (
    Forget,
    Kill,
    Launch,
    PortReserved,
    ReservePort,
    SetHeartbeat,
    SetTimeLimit,
    SignalRun,
    TerminalAck,
    TerminalInput,
    TerminalResize,
    parse_master_message,
    parse_master_messages,
)

log = logging.getLogger("mgpu.agent")


class Node(Protocol):
    """What the handlers need of the agent (mgpu.agent.agent.Agent implements it)."""

    launcher: Launcher
    site: SiteHooks
    heartbeat_interval: float

    def send(self, message: BaseModel) -> None:
        """Queue a message for the master, in order."""

    def launch(self, msg: Launch) -> None:
        """Start the job of a launch that is prepared."""

    def forget_exit(self, job_id: str, epoch: int) -> None:
        """The master stored this run's end: it is not sent again."""

    def fail_launch(self, job_id: str, epoch: int, error: str, fatal: bool = True) -> None:
        """Report a run that could not start (its end, with `error`)."""


M = TypeVar("M", bound=BaseModel)
Handler = Callable[[Node, M], None]

HANDLERS: dict[type[BaseModel], Handler[Any]] = {}
"""Each message class the agent acts on, and what it does with one."""


def handles(kind: type[M]) -> Callable[[Handler[M]], Handler[M]]:
    """Register the decorated function as the handler of `kind` (typed to take one)."""

    def register(handler: Handler[M]) -> Handler[M]:
        HANDLERS[kind] = handler
        return handler

    return register


def dispatch(node: Node, msg: BaseModel) -> None:
    """Hand `msg` to its handler; a message of a class with none is ignored."""
    handler = HANDLERS.get(type(msg))
    if handler is not None:
        handler(node, msg)


@handles(Launch)
def _launch(node: Node, msg: Launch) -> None:
    if not node.site.prepare(msg):  # image check and prolog first, if any
        node.launch(msg)


@handles(Kill)
def _kill(node: Node, msg: Kill) -> None:
    run = node.launcher.find(msg.job_id, msg.epoch)
    warning = None if msg.signal is None else (msg.signal, msg.signal_lead, msg.signal_batch)
    if run is not None:
        node.launcher.kill(run, msg.reason, msg.grace, warning)
    else:
        node.site.cancel(msg.job_id, msg.epoch, msg.reason)


@handles(SignalRun)
def _signal(node: Node, msg: SignalRun) -> None:
    """scancel --signal: now, and the run goes on."""
    run = node.launcher.find(msg.job_id, msg.epoch)
    if run is not None and not run.exited.is_set():
        node.launcher.signal(run, msg.signal, msg.top_only)


@handles(SetTimeLimit)
def _set_time_limit(node: Node, msg: SetTimeLimit) -> None:
    run = node.launcher.find(msg.job_id, msg.epoch)
    if run is not None:
        node.launcher.set_time_limit(run, msg.time_limit)


@handles(ReservePort)
def _reserve_port(node: Node, msg: ReservePort) -> None:
    node.send(PortReserved(job_id=msg.job_id, epoch=msg.epoch, port=_free_port()))


@handles(SetHeartbeat)
def _set_heartbeat(node: Node, msg: SetHeartbeat) -> None:
    """The cluster's size changed: heartbeats at this interval from the next one."""
    node.heartbeat_interval = msg.heartbeat_interval


@handles(TerminalInput)
def _typed(node: Node, msg: TerminalInput) -> None:
    """Typed input for a run's pty; every byte of it is acknowledged to the master as
    it leaves (written, or dropped: no such run, or not a terminal), which lets the
    run's client send that much more (master/state/registry.py, InputWindow)."""
    job_id, epoch = msg.job_id, msg.epoch
    data = base64.b64decode(msg.data)

    def ack(n: int) -> None:
        node.send(TerminalAck(job_id=job_id, epoch=epoch, bytes=n))

    run = node.launcher.find(job_id, epoch)
    if run is None or run.terminal is None:
        ack(len(data))  # ended, or not a terminal run: nothing to type into
    else:
        run.terminal.write(data, ack)


@handles(TerminalResize)
def _resize(node: Node, msg: TerminalResize) -> None:
    run = node.launcher.find(msg.job_id, msg.epoch)
    if run is not None and run.terminal is not None:
        run.terminal.resize(msg.size.rows, msg.size.cols)


@handles(Forget)
def _forget(node: Node, msg: Forget) -> None:
    """The master stored the run's end: its files and record may go."""
    node.forget_exit(msg.job_id, msg.epoch)
    node.site.forget(msg.job_id, msg.epoch)
    run = node.launcher.find(msg.job_id, msg.epoch)
    if run is not None and run.exited.is_set():
        node.launcher.finish(run)


def parse_frame(node: Node, raw: str | bytes) -> list[BaseModel]:
    """A frame's messages.  One that does not validate is dropped alone (a launch of it
    reported failed), never with the rest of its frame or the connection."""
    try:
        return list(parse_master_messages(raw))
    except ValueError:
        pass
    try:
        items = json.loads(raw)
    except ValueError as e:
        log.error("unreadable frame from the master dropped: %s", e)
        return []
    messages: list[BaseModel] = []
    for item in items if isinstance(items, list) else [items]:
        try:
            messages.append(parse_master_message(json.dumps(item)))
        except ValueError as e:
            log.error("invalid message from the master dropped: %s", first_line(e))
            _fail_unreadable(node, item, e)
    return messages


def _fail_unreadable(node: Node, item: Any, error: Exception) -> None:
    if not isinstance(item, dict) or item.get("type") != "launch":
        return
    job_id, epoch = item.get("job_id"), item.get("epoch")
    if isinstance(job_id, str) and isinstance(epoch, int):
        node.fail_launch(job_id, epoch, f"the agent cannot read the launch: {error}")


def first_line(error: object) -> str:
    return (str(error).strip().splitlines() or [""])[0][:500]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])
