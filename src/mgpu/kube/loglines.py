"""Following a Pod's log across dropped connections, with no line lost or given twice.

The log is asked for with `timestamps=true`: each line starts with the kubelet's RFC 3339
timestamp (nanoseconds).  A new connection asks from the last timestamp seen (`sinceTime`
has whole seconds, so it starts at or before it) and skips what was already given: lines
older than that timestamp, and as many lines stamped exactly with it as were given.  A
line with no timestamp that is the kubelet's own error (`SERVER_SAYS`: the container was
removed while its log was followed) is not the job's and is dropped."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mgpu.kube.errors import KubeError, KubeNotFound, KubeUnreachable

if TYPE_CHECKING:
    from mgpu.kube.api import KubeApi


log = logging.getLogger(__name__)

SERVER_SAYS = (
    "rpc error: code = ",
    "unable to retrieve container logs for ",
    "failed to try resolving symlinks in path ",
)
"""How the kubelet's own words begin when it writes them into a log it streams (unstamped,
in an answer of 200): the container was removed while it was followed (a deleted Pod)."""


@dataclass(frozen=True)
class LogLine:
    timestamp: str  # the kubelet's RFC 3339 time of the line
    text: str  # without its newline


def timestamp_ns(stamp: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 UTC timestamp (`...T10:00:01.5Z`)."""
    if not stamp.endswith("Z") or "T" not in stamp:
        return None
    whole, _, frac = stamp[:-1].partition(".")
    try:
        dt = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
        nanos = int((frac + "000000000")[:9]) if frac else 0
    except ValueError:
        return None
    return int(dt.timestamp()) * 1_000_000_000 + nanos


def _since(ns: int) -> str:
    """`sinceTime` for a timestamp: its whole second (the API takes no fraction)."""
    dt = datetime.datetime.fromtimestamp(ns // 1_000_000_000, tz=datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


class LogFollower:
    """One followed log; `lines()` ends when the container has ended and its log is read,
    or when the Pod is gone."""

    def __init__(
        self,
        client: KubeApi,
        name: str,
        namespace: str,
        container: str | None,
        *,
        retry_delay: float = 0.5,
    ) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.container = container
        self.retry_delay = retry_delay
        self.connections = 0
        self._last_ns = -1
        self._given_at_last = 0  # lines given whose timestamp is exactly _last_ns

    def _params(self) -> dict[str, str | int]:
        params: dict[str, str | int] = {"follow": "true", "timestamps": "true"}
        if self.container:
            params["container"] = self.container
        if self._last_ns >= 0:
            params["sinceTime"] = _since(self._last_ns)
        return params

    async def lines(self) -> AsyncIterator[LogLine]:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/log"
        doing = f"follow the log of pod {self.namespace}/{self.name}"
        while True:
            skip_at_last = self._given_at_last
            self.connections += 1
            finished = False  # the server ended the stream (not a dropped connection)
            try:
                async for raw in self.client.stream_lines(path, doing, self._params(), None):
                    stamp, _, text = raw.decode(errors="replace").partition(" ")
                    ns = timestamp_ns(stamp)
                    if ns is None:  # not a stamped line: give it as it is, unless
                        text = raw.decode(errors="replace")
                        if text.startswith(SERVER_SAYS):  # the server's, not the job's
                            log.debug("pod %s's log: %s", self.name, text)
                            continue
                        yield LogLine("", text)
                        continue
                    if ns < self._last_ns:
                        continue
                    if ns == self._last_ns and skip_at_last > 0:
                        skip_at_last -= 1
                        continue
                    if ns == self._last_ns:
                        self._given_at_last += 1
                    else:
                        self._last_ns, self._given_at_last = ns, 1
                    yield LogLine(stamp, text)
                finished = True
            except KubeNotFound:
                return
            except KubeUnreachable:
                pass  # dropped: connect again
            except KubeError as exc:
                if exc.code != 400:  # 400: the container is not started yet
                    raise
            if finished and await self._ended():
                return
            await asyncio.sleep(self.retry_delay)

    async def _ended(self) -> bool:
        """Whether the container has ended (its whole log was then sent) or the Pod is gone."""
        try:
            pod = await self.client.get_pod(self.name, self.namespace)
        except KubeNotFound:
            return True
        except KubeUnreachable:
            return False
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            if self.container in (None, status.get("name")):
                return "terminated" in (status.get("state") or {})
        return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
