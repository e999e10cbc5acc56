"""Telling people a job ended: a webhook POST (`--notify URL`, or the cluster's
`notify.webhook`), or an e-mail (`--notify mailto:ADDRESS`, `--mail-user`) through the
cluster's `notify.smtp` relay.

The POST carries `{"job_id", "name", "user", "state", "exit_code", "reason", "text"}`;
`text` is one sentence ("Job 1a2b3c4d (train) of alice completed after 1 h 2 min on
node001."), so chat incoming-webhooks (Slack, Mattermost, Rocket.Chat) post it as is.  An
array sends one notification, when its last task ends, counting its tasks' end states.

Deliveries never hold the master's loop: a job's end puts a delivery in a bounded queue
(`MAX_PENDING`; past it a delivery is dropped and logged), and a task sends it with a
timeout, retrying a receiver that is down or answers 5xx after 10 s, 30 s, 90 s and
270 s (5 tries over about 7 minutes).  Deliveries still pending when the master stops
are lost: they are not stored (a job's end is, and is shown by `mgpu show` / `history`).

Where a notification may go (`check_target`, at submit, and again for each delivery with
the addresses its name resolves to then): http or https only, or mailto when an SMTP
relay is configured.  When `notify.allowed_hosts` is set only those hosts (or
`*.domain`s) are allowed.  A target on a loopback, link-local (cloud metadata), private
or otherwise non-public address is refused unless `allowed_hosts` names it, so users
cannot point the master at its own services.  The connection goes to the address that
was checked (the name is kept for the Host header and TLS), so a name that resolves
differently a moment later changes nothing.  The cluster's own `notify.webhook` is the
admin's choice and is not checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlsplit

from mgpu import spec as specs
from mgpu.config import Notify as NotifyConfig
from mgpu.model import Job, JobState

log = logging.getLogger("mgpu.master")

__all__ = [
    "Delivery",
    "Notifier",
    "Target",
    "check_target",
    "describe_end",
    "parse_target",
    "payload",
]

MAX_TARGET_CHARS = 2048
MAX_PENDING = 1000
"""Deliveries waiting or being retried at once; more are dropped (and logged)."""
RETRY_DELAYS = (10.0, 30.0, 90.0, 270.0)
"""Seconds before each retry of a failed delivery: 5 tries over about 7 minutes."""
TIMEOUT = 10.0
"""Seconds one try may take (connect, send, answer)."""
NONE = "none"
"""`--notify none`: no notification, not even to the cluster's webhook."""

_EMAIL_RE = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9.-]{1,253}")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a notification goes: a webhook URL, or an e-mail address."""

    kind: str
    """"webhook" or "mail"."""
    value: str
    """The URL, or the address."""
    host: str = ""
    """The URL's host (lower case, no brackets), for the allowed-hosts and address rules."""
    port: int | None = None


def parse_target(text: str) -> str:
    """`--notify`'s value checked as text: an http(s) URL, `mailto:ADDRESS` or `none`;
    a bare e-mail address (as `--mail-user` takes it) becomes `mailto:ADDRESS`."""
    text = text.strip()
    if not text:
        raise specs.SpecError("--notify is empty; give an http(s) URL or mailto:ADDRESS")
    if len(text) > MAX_TARGET_CHARS:
        raise specs.SpecError(f"--notify is {len(text)} characters; at most {MAX_TARGET_CHARS}")
    if not text.isprintable() or any(c.isspace() for c in text):
        raise specs.SpecError("--notify must not contain spaces or control characters")
    if text.lower() == NONE:
        return NONE
    if "://" not in text and not text.lower().startswith("mailto:") and "@" in text:
        text = "mailto:" + text
    _split(text)
    return text


def _split(text: str) -> Target:
    if text.lower().startswith("mailto:"):
        address = text[len("mailto:") :]
        if _EMAIL_RE.fullmatch(address) is None:
            raise specs.SpecError(
                f"--notify {specs._q(text)}: {specs._q(address)} is not an address"
            )
        return Target("mail", address)
    try:
        url = urlsplit(text)
        port = url.port
    except ValueError as e:
        raise specs.SpecError(f"--notify {specs._q(text)} is not a URL ({e})") from None
    if url.scheme.lower() not in ("http", "https"):
        raise specs.SpecError(
            f"--notify {specs._q(text)}: only http://, https:// or mailto: targets are sent"
        )
    host = (url.hostname or "").lower()
    if not host:
        raise specs.SpecError(f"--notify {specs._q(text)} names no host")
    return Target("webhook", text, host, port)


def _listed(host: str, allowed: Iterable[str]) -> bool:
    for pattern in allowed:
        pattern = pattern.lower().strip()
        if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def check_target(text: str, config: NotifyConfig) -> Target | None:
    """The target of `--notify text` if this cluster sends there (None for `none`), else a
    SpecError with one sentence.  Names are not resolved here (a delivery checks the
    addresses it connects to); an address literal or `localhost` is judged now."""
    text = parse_target(text)
    if text == NONE:
        return None
    target = _split(text)
    if target.kind == "mail":
        if config.smtp is None:
            raise specs.SpecError(
                f"--notify {text}: this cluster sends no e-mail (no notify.smtp in its config); "
                "use an http(s) webhook"
            )
        return target
    listed = _listed(target.host, config.allowed_hosts)
    if config.allowed_hosts and not listed:
        raise specs.SpecError(
            f"--notify: {target.host} is not a host this cluster sends notifications to "
            f"(notify.allowed_hosts: {', '.join(config.allowed_hosts)})"
        )
    literal = _literal(target.host)
    local = target.host == "localhost" or target.host.endswith(".localhost")
    if not listed and (local or (literal is not None and not _public(literal))):
        raise specs.SpecError(
            f"--notify: {target.host} is a loopback, link-local or private address; "
            "notifications go only to public hosts unless notify.allowed_hosts names it"
        )
    return target


# ---- what is sent ------------------------------------------------------------------


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


_VERB = {
    JobState.COMPLETED: "completed",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled",
    JobState.TIMEOUT: "reached its time limit",
}


def describe_end(job: Job) -> str:
    """One sentence: "Job 1a2b3c4d (train) of alice completed after 1 h 2 min on node001."""
    name = f" ({job.name})" if job.name else ""
    verb = _VERB.get(job.state, job.state.value)
    if job.state == JobState.FAILED and job.exit_code not in (None, 0):
        verb += f" with exit code {job.exit_code}"
    elif job.state == JobState.FAILED and job.reason:
        verb += f" ({job.reason})"
    if job.start_time is None:
        when = " before it started"
    else:
        ran = (job.end_time or time.time()) - job.start_time
        nodes = ", ".join(dict.fromkeys(s.node_id for s in job.allocation))
        when = f" after {_duration(ran)}" + (f" on {nodes}" if nodes else "")
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
    """Set for an array's one notification: its body is completed by `Notifier.run` with
    the tasks' end states (read from the store once the last end is written)."""
    tries: int = 0
    errors: list[str] = field(default_factory=list)


class RefusedTarget(Exception):
    """A name that resolved to an address notifications may not go to: never retried."""


Sender = Callable[[Delivery], Any]


class Notifier:
    """Queues a delivery when a job ends (`job_ended`, from the lifecycle's end hooks) and
    sends it from its own tasks (`run`)."""

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
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue(MAX_PENDING)
        self._arrays: dict[str, int] = {}
        self._in_flight: set[asyncio.Task[bool]] = set()
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    def target_of(self, job: Job) -> tuple[Target, bool] | None:
        """Where the end of `job` is told (and whether the address rules apply)."""
        if job.notify == NONE:
            return None
        if job.notify is not None:
            with contextlib.suppress(specs.SpecError):
                return _split(job.notify), True
            return None
        if self.config.webhook:
            return _split(self.config.webhook), False
        return None

    def job_ended(self, job: Job) -> None:
        """A job ended: queue its notification, if it has a target (never blocks)."""
        found = self.target_of(job)
        if found is None:
            return
        target, checked = found
        if job.array_job_id is None:
            self._put(Delivery(target, payload(job), checked))
            return
        aid = job.array_job_id
        left = self._arrays.get(aid)
        left = self.active_tasks(aid) if left is None else left - 1
        if left > 0:
            self._arrays[aid] = left
            return
        self._arrays.pop(aid, None)
        self._put(Delivery(target, array_payload(aid, job, {}), checked, array_id=aid))

    def _put(self, delivery: Delivery) -> None:
        try:
            self.queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning(
                "notification of job %s dropped: %d deliveries are pending already",
                delivery.body.get("job_id"),
                MAX_PENDING,
            )

    async def run(self) -> None:
        """Take deliveries off the queue and send each in a task of its own (a slow or
        failing receiver delays only its own notifications)."""
        while True:
            delivery = await self.queue.get()
            if delivery.array_id is not None:
                delivery.body.update(await self._array_body(delivery))
            while len(self._in_flight) >= MAX_PENDING:
                await asyncio.sleep(0.1)
            task = asyncio.create_task(self.deliver(delivery))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

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
                if delivery.target.kind == "mail":
                    await self._mail(delivery)
                else:
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

    async def _addresses(self, target: Target, checked: bool) -> list[str]:
        """The addresses to try, each allowed (see the module docstring)."""
        port = target.port or (443 if target.value.lower().startswith("https") else 80)
        literal = _literal(target.host)
        if literal is not None:
            found = [literal]
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(
                target.host, port, type=socket.SOCK_STREAM
            )
            found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if checked and not _listed(target.host, self.config.allowed_hosts):
            bad = [a for a in found if not _public(a)]
            if bad:
                raise RefusedTarget(
                    f"{target.host} resolves to {bad[0]}, not a public address: not sent"
                )
        return found

    async def _post(self, delivery: Delivery) -> None:
        import httpx

        target = delivery.target
        addresses = await self._addresses(target, delivery.checked)
        url = httpx.URL(target.value)
        last: Exception | None = None
        async with httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False) as client:
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
        await asyncio.to_thread(_send_mail, smtp.host, smtp.port, smtp.starttls, smtp.timeout, msg)


def _send_mail(host: str, port: int, starttls: bool, timeout: float, msg: EmailMessage) -> None:
    """smtplib in a worker thread: a slow relay never holds the event loop."""
    import smtplib

    with smtplib.SMTP(host, port, timeout=timeout) as server:
        if starttls:
            server.starttls()
        server.send_message(msg)
