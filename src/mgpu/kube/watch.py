"""A watch that never needs restarting by hand: list, then watch from the list's
resourceVersion; when the server says that version is too old (410 Gone, as an HTTP answer
or as an ERROR event) list again; when the connection fails or drops, wait and watch again
from the last version seen.  Bookmarks keep that version fresh on quiet collections."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mgpu.kube.errors import KubeError, KubeGone, KubeUnreachable, from_status

if TYPE_CHECKING:
    from mgpu.kube.api import KubeApi

WATCH_SECONDS = 240  # the server ends each watch after this; we then watch again


@dataclass(frozen=True)
class WatchEvent:
    """`SYNC`: `items` is the whole collection now (first, and after each re-list: replace
    what you knew); `ADDED`, `MODIFIED`, `DELETED`: `object` changed."""

    type: str
    object: dict[str, Any] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)


class Watch:
    """`async for event in watch:` events until the caller stops.  `relists` counts the
    lists made (1 + the 410s met); `last_error` is the last connection failure retried."""

    def __init__(
        self,
        client: KubeApi,
        path: str,
        doing: str,
        params: Mapping[str, str],
        *,
        resource_version: str | None = None,
        watch_seconds: int = WATCH_SECONDS,
        retry_delay: float = 0.5,
        max_retry_delay: float = 10.0,
    ) -> None:
        self.client = client
        self.path = path
        self.doing = doing
        self.params = dict(params)
        self.resource_version = resource_version
        self.watch_seconds = watch_seconds
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.relists = 0
        self.last_error: KubeError | None = None

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        delay = self.retry_delay
        while True:
            try:
                if self.resource_version is None:
                    body = await self.client.request(
                        "GET", self.path, self.doing, params=self.params
                    )
                    self.resource_version = str(body["metadata"]["resourceVersion"])
                    self.relists += 1
                    yield WatchEvent("SYNC", items=list(body.get("items") or []))
                async for event in self._watch_once():
                    delay = self.retry_delay
                    yield event
            except KubeGone:
                self.resource_version = None  # too old: the next turn lists again
            except KubeUnreachable as exc:
                self.last_error = exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_retry_delay)

    async def _watch_once(self) -> AsyncIterator[WatchEvent]:
        params = {
            **self.params,
            "watch": "1",
            "resourceVersion": str(self.resource_version),
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_seconds),
        }
        # No byte for this long: the connection is dead even if no error said so.
        idle = self.watch_seconds + 30.0
        async for raw in self.client.stream_lines(self.path, self.doing, params, idle):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw)
                kind, obj = str(event["type"]), event["object"]
            except (ValueError, KeyError, TypeError):
                what = f"Kubernetes sent a watch event that is not JSON to {self.doing}."
                raise KubeError(what) from None
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                raise from_status(int(code or 500), obj, self.doing)
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = str(version)
            if kind != "BOOKMARK":
                yield WatchEvent(kind, obj)
