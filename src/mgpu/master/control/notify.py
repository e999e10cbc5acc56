"""Telling people a job ended: a webhook POST (`--notify URL`, or the cluster's
`notify.webhook`), or an e-mail (`--notify mailto:ADDRESS`, `--mail-user`) through the
cluster's `notify.smtp` relay.

The POST carries `{"job_id", "name", "user", "state", "exit_code", "reason", "text"}`;
`text` is one sentence ("Job 42 (train) of alice completed after 1h 2m on
node001."), so chat incoming-webhooks (Slack, Mattermost, Rocket.Chat) post it as is.  An
array sends one notification, when its last task ends, counting its tasks' end states.

Deliveries never hold the master's loop, and one user's never crowd out another's: a
job's end puts a delivery in its user's queue for its receiver, bounded (per receiver, per
user and in all; past a bound a delivery is dropped, counted and logged, once a minute at
most); the queues take turns, and a task sends each delivery with a timeout, retrying a
receiver that is down or answers 5xx after 10 s, 30 s, 90 s and 270 s (5 tries over about
7 minutes), with a few at once per receiver and per user (`Notifier`).  One HTTP client
serves every delivery; name lookups, its TLS context and SMTP run in worker threads.
Deliveries still pending when the master stops are lost: they are not stored (a job's end
is, and is shown by `mgpu show` / `history`).

Where a notification may go (`check_target`, at submit, and again for each delivery with
the addresses its name resolves to then): http or https only, or mailto when an SMTP
relay is configured.  When `notify.allowed_hosts` is set only those hosts (or
`*.domain`s) are allowed.  A target on a loopback, link-local (cloud metadata), private
or otherwise non-public address is refused unless `allowed_hosts` names it, so users
cannot point the master at its own services; an IPv6 address that embeds an IPv4 one
(`::ffff:127.0.0.1`, NAT64 `64:ff9b::10.0.0.1`, 6to4, Teredo) is judged by that one
too.  The log shows a webhook's scheme and host, never its path (often its secret).  The connection
goes to the address that was checked (the name is kept for the Host header and TLS), so a
name that resolves differently a moment later changes nothing.  The cluster's own
`notify.webhook` is the admin's choice and is not checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, TypeVar

from mgpu import exits
from mgpu import spec as specs
from mgpu.config import Notify as NotifyConfig
from mgpu.durations import format_duration
from mgpu.master.control.notifytargets import (
    NONE,
    Target,
    is_listed,
    is_public,
    literal_address,
    split_target,
)
from mgpu.model import Job, JobState

log = logging.getLogger("mgpu.master")
_T = TypeVar("_T")

__all__ = [
    "Delivery",
    "Notifier",
    "describe_end",
    "payload",
]

MAX_PENDING = 10_000
"""Deliveries waiting, being sent or retried at once, everyone's; more are dropped."""
MAX_PER_USER = 1000
"""... of one user (all their receivers)."""
MAX_PER_RECEIVER = 500
"""... of one user to one receiver (scheme, host and port; or a mail address)."""
ACTIVE_PER_RECEIVER = 4
"""Deliveries of one user to one receiver being sent or waiting for a retry at once."""
ACTIVE_PER_USER = 16
"""... of one user, all receivers."""
SENDING = 64
"""Tries in progress at once (connections open, mails being handed to the relay)."""
THREADS = ACTIVE_PER_USER + 4
"""Worker threads for name lookups and the HTTP client's TLS context: more than one user's
deliveries may use at once, so names that never resolve delay only their own user's."""
SMTP_THREADS = 2
"""Worker threads handing mails to the relay (one relay: more would only queue there)."""
DROP_LOG_INTERVAL = 60
"""Seconds between two warnings about drops of one receiver (or user, or all)."""
RETRY_DELAYS = (10.0, 30.0, 90.0, 270.0)
"""Seconds before each retry of a failed delivery: 5 tries over about 7 minutes."""
TIMEOUT = 10.0
"""Seconds one try may take (connect, send, answer)."""


# ---- what is sent ------------------------------------------------------------------


_VERB = {
    JobState.COMPLETED: "completed",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled",
    JobState.TIMEOUT: "reached its time limit",
}


def describe_end(job: Job) -> str:
    """One sentence: "Job 42 (train) of alice completed after 1h 2m on node001."""
    name = f" ({job.name})" if job.name else ""
    verb = _VERB.get(job.state, job.state.value)
    if job.state == JobState.FAILED and job.exit_code not in (None, 0):
        verb += (
            f" ({exits.describe(job.exit_code)})"
            if job.exit_code < 0
            else f" with exit code {job.exit_code}"
        )
    elif job.state == JobState.FAILED and job.reason:
        verb += f" ({job.reason})"
    if job.start_time is None:
        when = " before it started"
    else:
        ran = (job.end_time or time.time()) - job.start_time
        nodes = ", ".join(dict.fromkeys(s.node_id for s in job.allocation))
        when = f" after {format_duration(ran)}" + (f" on {nodes}" if nodes else "")
    return f"Job {job.id}{name} of {job.user} {verb}{when}."


def payload(job: Job) -> dict[str, Any]:
    """The JSON a webhook receives (the contract's keys)."""
    return {
        "job_id": job.id,
        "name": job.name,
        "user": job.user,
        "state": job.state.value,
        "exit_code": job.exit_code,
        "reason": job.reason,
        "text": describe_end(job),
    }


@dataclass(frozen=True, slots=True)
class _Named:
    name: str | None
    user: str


def array_payload(array_id: str, first: Job | _Named, states: dict[str, int]) -> dict[str, Any]:
    """One notification for a whole array, sent when its last task ended."""
    total = sum(states.values())
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    worst = next(
        (s for s in ("failed", "timeout", "cancelled") if states.get(s)), JobState.COMPLETED.value
    )
    name = f" ({first.name})" if first.name else ""
    return {
        "job_id": array_id,
        "name": first.name,
        "user": first.user,
        "state": worst,
        "exit_code": None,
        "reason": counts,
        "text": f"Array {array_id}{name} of {first.user} ended: {total} tasks, {counts}.",
    }


# ---- delivery ----------------------------------------------------------------------


@dataclass(slots=True)
class Delivery:
    target: Target
    body: dict[str, Any]
    checked: bool = True
    """Whether the address rules apply (False for the cluster's own webhook)."""
    array_id: str | None = None
    """Set for an array's one notification: its body is completed with the tasks' end
    states as it is sent (read from the store once the last end is written)."""
    tries: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def user(self) -> str:
        return str(self.body.get("user") or "")


class RefusedTarget(Exception):
    """A name that resolved to an address notifications may not go to: never retried."""


@dataclass(slots=True, eq=False)
class _Queue:
    """One user's deliveries to one receiver, oldest first."""

    user: str
    receiver: str
    waiting: deque[Delivery] = field(default_factory=deque)
    active: int = 0
    """Deliveries being sent or waiting for a retry."""
    in_turn: bool = False
    """Whether it is in the round (it is while deliveries wait)."""

    @property
    def held(self) -> int:
        return len(self.waiting) + self.active


def _receiver(target: Target) -> str:
    """Who receives: a webhook's scheme, host and port (not its path), or a mail address."""
    if target.kind == "mail":
        return "mailto:" + target.value.lower()
    scheme = target.value.split(":", 1)[0].lower()
    return f"{scheme}://{target.host}:{target.port or (443 if scheme == 'https' else 80)}"


class _DropLog:
    """A warning per scope (a receiver, a user, everyone) at most every DROP_LOG_INTERVAL,
    with how many were dropped since: a flood of drops is not a flood of lines."""

    def __init__(self) -> None:
        self._since: dict[str, tuple[float, int]] = {}

    def dropped(self, scope: str, why: str) -> None:
        now = time.monotonic()
        last, count = self._since.get(scope, (-DROP_LOG_INTERVAL, 0))
        count += 1
        if now - last < DROP_LOG_INTERVAL:
            self._since[scope] = (last, count)
            return
        log.warning(
            "notification dropped: %s already (%d dropped since the last such line; one a "
            "minute at most)",
            why,
            count,
        )
        # Forget scopes quiet for a while (their unlogged counts are small by then).
        self._since = {k: v for k, v in self._since.items() if now - v[0] < DROP_LOG_INTERVAL}
        self._since[scope] = (now, 0)


class _OriginOnly(logging.Filter):
    """httpx logs each request's URL: a webhook's path is often its secret, so its lines
    show the scheme and host (the address connected to) alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_origin(a) for a in record.args)
        return True


def _origin(arg: object) -> object:
    if type(arg).__name__ == "URL" and type(arg).__module__.startswith("httpx"):
        url: Any = arg
        return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"
    return arg


_ORIGIN_ONLY = _OriginOnly()


def _http_client() -> Any:
    """The one HTTP client of all deliveries, made in a worker thread (loading the trusted
    CAs for its TLS context takes tens of milliseconds).  No connection is reused: each
    delivery's connection goes to the address checked for it, verified by its own name."""
    import httpx

    logging.getLogger("httpx").addFilter(_ORIGIN_ONLY)
    return httpx.AsyncClient(
        timeout=TIMEOUT,
        follow_redirects=False,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
    )


class Notifier:
    """Queues a delivery when a job ends (`job_ended`, from the lifecycle's end hooks) and
    sends it from its own tasks (`run`).

    Each user's deliveries to each receiver wait in a queue of their own, and the queues
    take turns (round robin): a receiver that never answers holds up only the deliveries
    queued behind it, at most ACTIVE_PER_RECEIVER of them are being sent or retried at
    once, ACTIVE_PER_USER of one user's, and tries of everyone's SENDING at once.  Queues
    are bounded per receiver, per user and in total (past a bound a delivery is dropped,
    counted in `dropped`, and logged at most once a minute per receiver, user or all).
    What may block (name lookups, the TLS context, SMTP) runs in worker threads of the
    notifier's own, so it never holds the loop nor the master's other threads."""

    def __init__(
        self,
        config: NotifyConfig,
        active_tasks: Callable[[str], int],
        task_rows: Callable[[str, str, int], list[tuple[str, str, str]]],
    ) -> None:
        self.config = config
        self.active_tasks = active_tasks
        """How many tasks of an array are still queued or running (asked once per array)."""
        self.task_rows = task_rows
        """(id, state, user) of jobs by id prefix, a page at a time (Store)."""
        self._arrays: dict[str, int] = {}
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._round: deque[_Queue] = deque()
        self._held_by_user: Counter[str] = Counter()
        self._active_by_user: Counter[str] = Counter()
        self.pending = 0
        """Deliveries waiting, being sent or waiting for a retry."""
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending = asyncio.Semaphore(SENDING)
        self._threads = ThreadPoolExecutor(THREADS, thread_name_prefix="mgpu-notify")
        self._smtp_threads = ThreadPoolExecutor(SMTP_THREADS, thread_name_prefix="mgpu-smtp")
        self._client: Any = None
        self._client_made = asyncio.Lock()
        self._drops = _DropLog()
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    def target_of(self, job: Job) -> tuple[Target, bool] | None:
        """Where the end of `job` is told (and whether the address rules apply)."""
        if job.notify == NONE:
            return None
        if job.notify is not None:
            with contextlib.suppress(specs.SpecError):
                return split_target(job.notify), True
            return None
        if self.config.webhook:
            return split_target(self.config.webhook), False
        return None

    def job_ended(self, job: Job) -> None:
        """A job ended: queue its notification, if it has a target (never blocks)."""
        found = self.target_of(job)
        if found is None:
            return
        target, checked = found
        if job.array_job_id is None:
            self.put(Delivery(target, payload(job), checked))
            return
        aid = job.array_job_id
        left = self._arrays.get(aid)
        left = self.active_tasks(aid) if left is None else left - 1
        if left > 0:
            self._arrays[aid] = left
            return
        self._arrays.pop(aid, None)
        self.put(Delivery(target, array_payload(aid, job, {}), checked, array_id=aid))

    def put(self, delivery: Delivery) -> bool:
        """Queue `delivery` behind its user's others to the same receiver; False if a
        bound dropped it."""
        user, receiver = delivery.user, _receiver(delivery.target)
        queue = self._queues.get((user, receiver)) or _Queue(user, receiver)
        if queue.held >= MAX_PER_RECEIVER:
            why = f"{MAX_PER_RECEIVER} of {user}'s to {receiver} are pending"
            return self._drop(f"{user} {receiver}", why)
        if self._held_by_user[user] >= MAX_PER_USER:
            return self._drop("user " + user, f"{MAX_PER_USER} of {user}'s are pending")
        if self.pending >= MAX_PENDING:
            return self._drop("", f"{MAX_PENDING} are pending")
        self._queues[(user, receiver)] = queue
        queue.waiting.append(delivery)
        self._held_by_user[user] += 1
        self.pending += 1
        if not queue.in_turn:
            queue.in_turn = True
            self._round.append(queue)
        self._wake.set()
        return True

    def waiting(self) -> list[Delivery]:
        """The deliveries not started yet, queue by queue."""
        return [d for queue in self._queues.values() for d in queue.waiting]

    def _drop(self, scope: str, why: str) -> bool:
        self.dropped += 1
        self._drops.dropped(scope, why)
        return False

    async def run(self) -> None:
        """Start deliveries as they come and as earlier ones end, until cancelled (the
        master stops): then what is pending is dropped and the HTTP client closed."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                self._start_turns()
        finally:
            await self.aclose()

    def _start_turns(self) -> None:
        """One delivery from each queue in turn, while their limits allow."""
        passed = 0  # queues at their limits, passed over since one started
        while self._round and passed < len(self._round):
            queue = self._round.popleft()
            if (
                queue.active >= ACTIVE_PER_RECEIVER
                or self._active_by_user[queue.user] >= ACTIVE_PER_USER
            ):
                self._round.append(queue)
                passed += 1
                continue
            passed = 0
            delivery = queue.waiting.popleft()
            if queue.waiting:
                self._round.append(queue)
            else:
                queue.in_turn = False
            queue.active += 1
            self._active_by_user[queue.user] += 1
            task = asyncio.create_task(self._send(queue, delivery))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, queue: _Queue, delivery: Delivery) -> None:
        try:
            if delivery.array_id is not None:
                delivery.body.update(await self._array_body(delivery))
            await self.deliver(delivery)
        finally:
            queue.active -= 1
            self._active_by_user[queue.user] -= 1
            self._held_by_user[queue.user] -= 1
            self.pending -= 1
            for counter in (self._active_by_user, self._held_by_user):
                if counter[queue.user] <= 0:
                    del counter[queue.user]
            if queue.held == 0:
                self._queues.pop((queue.user, queue.receiver), None)
            self._wake.set()

    async def aclose(self) -> None:
        """Stop: pending deliveries are dropped (they are not stored), the client closed."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
        for threads in (self._threads, self._smtp_threads):
            threads.shutdown(wait=False, cancel_futures=True)

    async def _array_body(self, delivery: Delivery) -> dict[str, Any]:
        """Count the end states of the array's tasks, a page at a time (the loop free in
        between): a 100,000-task array is read once, never in one go."""
        aid = delivery.array_id
        assert aid is not None
        states: dict[str, int] = {}
        after = ""
        while rows := self.task_rows(aid + "_", after, 5000):
            for _, state, _ in rows:
                states[state] = states.get(state, 0) + 1
            after = rows[-1][0]
            await asyncio.sleep(0)
        body = delivery.body
        return array_payload(aid, _Named(body["name"], body["user"]), states)

    async def deliver(self, delivery: Delivery, delays: Iterable[float] = RETRY_DELAYS) -> bool:
        """Send with retries; True once a receiver took it."""
        waits = [0.0, *delays]
        for wait in waits:
            if wait:
                await asyncio.sleep(wait)
            delivery.tries += 1
            try:
                async with self._sending:
                    if delivery.target.kind == "mail":
                        await self._mail(delivery)  # smtplib times each step itself
                    else:
                        async with asyncio.timeout(TIMEOUT):  # the whole try, trickles too
                            await self._post(delivery)
            except RefusedTarget as e:
                delivery.errors.append(str(e))
                break
            except Exception as e:  # down, refused, 5xx, timed out: try again later
                delivery.errors.append(str(e) or type(e).__name__)
                continue
            self.sent += 1
            return True
        self.failed += 1
        log.warning(
            "notification of job %s to %s not delivered after %d tries: %s",
            delivery.body.get("job_id"),
            delivery.target.host or delivery.target.value,
            delivery.tries,
            delivery.errors[-1] if delivery.errors else "?",
        )
        return False

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def _addresses(self, target: Target, checked: bool) -> list[str]:
        """The addresses to try, each allowed (see the module docstring)."""
        port = target.port or (443 if target.value.lower().startswith("https") else 80)
        literal = literal_address(target.host)
        if literal is not None:
            found = [literal]
        else:
            infos = await self._in_thread(
                socket.getaddrinfo, target.host, port, 0, socket.SOCK_STREAM
            )
            found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if checked and not is_listed(target.host, self.config.allowed_hosts):
            bad = [a for a in found if not is_public(a)]
            if bad:
                raise RefusedTarget(
                    f"{target.host} resolves to {bad[0]}, not a public address: not sent"
                )
        return found

    async def _http(self) -> Any:
        async with self._client_made:
            if self._client is None:
                self._client = await self._in_thread(_http_client)
        return self._client

    async def _post(self, delivery: Delivery) -> None:
        client = await self._http()  # imports httpx in a thread the first time
        import httpx

        target = delivery.target
        addresses = await self._addresses(target, delivery.checked)
        url = httpx.URL(target.value)
        last: Exception | None = None
        for address in addresses:
            # To the address just checked; the name stays for Host and TLS.
            pinned = url.copy_with(host=address)
            headers = {"Host": url.netloc.decode("ascii")}
            try:
                resp = await client.post(
                    pinned,
                    json=delivery.body,
                    headers=headers,
                    extensions={"sni_hostname": target.host},
                )
            except httpx.HTTPError as e:
                last = e
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                raise RuntimeError(f"{target.host} answered HTTP {resp.status_code}")
            if resp.status_code >= 400:  # the receiver refuses it: trying again won't help
                raise RefusedTarget(f"{target.host} answered HTTP {resp.status_code}")
            return
        raise RuntimeError(f"cannot reach {target.host}: {last}")

    async def _mail(self, delivery: Delivery) -> None:
        smtp = self.config.smtp
        if smtp is None:
            raise RefusedTarget("no notify.smtp in the cluster config")
        body = delivery.body
        msg = EmailMessage()
        msg["From"] = smtp.sender
        msg["To"] = delivery.target.value
        msg["Subject"] = f"mgpu: job {body['job_id']} {body['state']}"
        details = "\n".join(f"{k}: {body[k]}" for k in ("job_id", "name", "user", "state"))
        msg.set_content(f"{body['text']}\n\n{details}\nexit_code: {body['exit_code']}\n")
        await asyncio.get_running_loop().run_in_executor(
            self._smtp_threads, _send_mail, smtp.host, smtp.port, smtp.starttls, smtp.timeout, msg
        )


def _send_mail(host: str, port: int, starttls: bool, timeout: float, msg: EmailMessage) -> None:
    """smtplib in a worker thread: a slow relay never holds the event loop."""
    import smtplib

    with smtplib.SMTP(host, port, timeout=timeout) as server:
        if starttls:
            server.starttls()
        server.send_message(msg)
