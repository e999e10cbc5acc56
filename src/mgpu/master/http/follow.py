"""Following a run's output: one skeleton for `logs` (`/api/jobs/{id}/output`), a step's
output (`/api/steps/{id}/output`), an srun step's tasks (`/api/sruns/{id}/output`) and a
terminal or allocation (`/api/jobs/{id}/attach`).

`follow` yields JSON lines: the output records as the run's output file has them (read a
chunk at a time as they are written, so memory per reader is one chunk, whatever the
file's size), and between them what `news` says (the run's state, its end).  It wakes on
each append to the output, on the events `news.changed()` gives (a job's own changes, a new
count of queue positions), and every `news.tick` seconds (`ping`, when given, is sent then,
so a client sees the connection is alive).  A job's changes all set its event, so its
followers tick every `TICK` seconds only: one of a job that does not change costs nothing
between, however long the queue it waits in (issue 25 item 7).  A step's end sets its
`finished` event; its followers also look every `STEP_TICK`.  `follow_tails` is the same
loop over the outputs of several runs at once (an srun step's tasks: `Tail.mark` marks
each record with its task).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mgpu.master.control.cluster import Cluster
from mgpu.master.state.steps import Step, TaskStep
from mgpu.master.store.outputs import OutputReader
from mgpu.model import Job, JobState

__all__ = [
    "JobNews",
    "News",
    "SrunNews",
    "StepNews",
    "Tail",
    "follow",
    "follow_line",
    "follow_tails",
    "line",
]

TICK = 5.0
"""Seconds a job's follower waits for news before it looks again (and pings)."""
STEP_TICK = 1.0
"""Seconds a step's follower waits before it looks for the step's end again."""


def line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()


class News(Protocol):
    """What a follower is told besides output."""

    tick: float
    """Seconds to wait for an event before looking (and pinging) anyway."""

    def changed(self) -> list[asyncio.Event]:
        """Events set when there may be news (none: output and the tick only).  Asked
        before each read of the output: what it looks at then, `now` may say after that
        output (an end that must come after the last output)."""

    def now(self) -> tuple[list[dict[str, Any]], bool]:
        """The lines to send now, and whether that is the end."""


def follow_line(cl: Cluster, job: Job) -> dict[str, Any]:
    """What a follower of `job` is told now: its end once it has ended, else its state and
    reason (and place in the queue while queued, as last counted: control/positions.py)."""
    if job.terminal:
        return {
            "end": True,
            "state": job.state.value,
            "exit_code": job.exit_code,
            "reason": job.reason,
        }
    status: dict[str, Any] = {"status": job.state.value, "reason": job.reason}
    if job.state == JobState.QUEUED:
        position = cl.queue_position(job.id)
        if position is not None:
            status["position"] = position
    return status


@dataclass
class JobNews:
    """A job's state when it changes (woken by its changes, and while it is queued by a new
    count of positions), its end; `attach`: told `{"started": true, "allocation": ...}`
    once it runs."""

    cl: Cluster
    job_id: str
    attach: bool = False
    tick: float = TICK
    _last: dict[str, Any] | None = None
    _started: bool = False

    def changed(self) -> list[asyncio.Event]:
        events = [self.cl.job_event(self.job_id)]
        job = self.cl.active_job(self.job_id)
        if job is not None and job.state == JobState.QUEUED:
            events.append(self.cl.queue_positions.moved)
        return events

    def now(self) -> tuple[list[dict[str, Any]], bool]:
        job = self.cl.get_job(self.job_id)
        if job is None:
            return [], True
        status = follow_line(self.cl, job)
        if "end" in status:  # and its output has been read to the end just now
            return [status], True
        lines = []
        if status != self._last:
            self._last = status
            lines.append(status)
        running = job.state == JobState.RUNNING and job.start_time is not None
        if self.attach and not self._started and running:
            self._started = True
            slots = [{"node_id": s.node_id, "gpu_ids": s.gpu_ids} for s in job.allocation]
            lines.append({"started": True, "allocation": slots})
        return lines, False


@dataclass
class StepNews:
    """A step's end, with its exit code, once its output has been read: the end is looked
    at before the output is read (as SrunNews's), so output stored while the reader read
    comes before the end, never after it (where the client would not see it)."""

    step: Step
    tick: float = STEP_TICK
    _done: bool = False

    def changed(self) -> list[asyncio.Event]:
        self._done = self.step.done
        return [self.step.finished]

    def now(self) -> tuple[list[dict[str, Any]], bool]:
        step = self.step
        if not self._done:
            return [], False
        return [{"end": True, "exit_code": step.exit_code, "error": step.error}], True


@dataclass
class SrunNews:
    """An srun step's end, with each task's, once its tasks' output has been read: the end
    is looked at before the output is read (each task's output comes before its end, and a
    reader may wait, a yield or a page from the database, while others append)."""

    group: TaskStep
    tick: float = TICK
    _done: bool = False

    def changed(self) -> list[asyncio.Event]:
        self._done = self.group.done
        return [self.group.finished]

    def now(self) -> tuple[list[dict[str, Any]], bool]:
        if not self._done:
            return [], False
        group = self.group
        tasks = [
            {
                "task": t.task,
                "host": t.host,
                "exit_code": t.exit_code,
                "error": t.error,
                "out_of_memory": t.out_of_memory,
            }
            for t in group.tasks
        ]
        end = {"end": True, "exit_code": group.exit_code, "error": group.error}
        return [{**end, "tasks": tasks}], True


@dataclass(frozen=True)
class Tail:
    """The output of one run a follower reads, from byte `since`; `mark`: each chunk of
    whole records rewritten on its way (an srun task's: marked with its task)."""

    run_id: str
    since: int = 0
    mark: Callable[[bytes], bytes] | None = None
    stored: bool = False
    """Say how far the records are stored for good (`{"stored": N}`, client/resume.py)."""


def follow(
    cl: Cluster,
    run_id: str,
    news: News | None,
    since: int = 0,
    output: bool = True,
    ping: bytes | None = None,
    periodic: bool = True,
    stored: bool = False,
) -> AsyncIterator[bytes]:
    """The run's output from byte `since` (`output` False: none) and its news, until the
    news says it has ended; `news` None: the output there is now, and no more.  `periodic`
    False: no look but on an event (an attach: idle, it costs nothing).  `stored`: with
    marks of how far the records are stored (`Tail.stored`)."""
    if news is None:
        return _once(cl, run_id, since, stored)
    # Without its output, nothing but news is sent: an append wakes no one.
    tails = [Tail(run_id, since, stored=stored)] if output else []
    return follow_tails(cl, tails, news, ping, periodic)


async def _once(cl: Cluster, run_id: str, since: int, stored: bool) -> AsyncIterator[bytes]:
    once = cl.output_reader(run_id, since, follow=False)
    teller = _Stored(once) if stored else None
    try:
        if teller is not None and (first := teller.news()):
            yield first
        async for chunk in once.chunks():
            yield chunk
            if teller is not None and (mark := teller.news()):
                yield mark
    finally:
        once.close()


class _Stored:
    """A reader's `{"stored": N}` lines: one first, then one each time N grows (none for a
    reader whose every record is stored: a file)."""

    def __init__(self, reader: OutputReader) -> None:
        self.reader = reader
        self.sent: int | None = None

    def news(self) -> bytes | None:
        stored = self.reader.stored()
        if stored is None or stored == self.sent:
            return None
        self.sent = stored
        return b'{"stored":%d}\n' % stored


async def follow_tails(
    cl: Cluster,
    tails: Sequence[Tail],
    news: News,
    ping: bytes | None = None,
    periodic: bool = True,
) -> AsyncIterator[bytes]:
    """The output of each of `tails` (in their order, at each wake) and the news, until
    the news says the run has ended (see `follow`)."""
    wakes = [cl.watch_output(t.run_id) for t in tails]
    readers = [cl.output_reader(t.run_id, t.since) for t in tails]
    tellers = [_Stored(r) if t.stored else None for t, r in zip(tails, readers, strict=True)]
    try:
        for teller in tellers:
            if teller is not None and (first := teller.news()):
                yield first  # before any record: the client knows marks will come
        while True:
            for wake in wakes:
                wake.clear()  # before reading: an append from here on wakes us again
            changed = news.changed()
            for tail, reader, teller in zip(tails, readers, tellers, strict=True):
                async for chunk in reader.chunks():
                    yield chunk if tail.mark is None else tail.mark(chunk)
                if teller is not None and (stored := teller.news()):
                    yield stored
            lines, ended = news.now()
            for record in lines:
                yield line(record)
            if ended:
                return
            timeout = news.tick if periodic else None
            quiet = not await _any([*wakes, *changed], timeout)
            # Out of its lease, the master is quiet: a client then asks the other masters
            # whether one leads now (mgpu.client.leaderwatch); none does while the
            # database is paused, and the stream goes on here.
            if quiet and ping is not None and cl.node_admin.holds_lease():
                yield ping
    finally:
        for tail, reader, wake in zip(tails, readers, wakes, strict=True):
            reader.close()
            cl.unwatch_output(tail.run_id, wake)


async def _any(events: list[asyncio.Event], timeout: float | None) -> bool:
    """Wait for one of `events` to be set, `timeout` seconds at most (None: no limit);
    whether one was."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return bool(done)
