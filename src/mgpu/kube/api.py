"""What a watch and a followed log need of the API client (`mgpu.kube.client.KubeClient`
is one): the calls they make, typed here so that they need not import the client that
builds them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

__all__ = ["KubeApi"]


class KubeApi(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        doing: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
    ) -> Any: ...

    def stream_lines(
        self, path: str, doing: str, params: Mapping[str, str | int], timeout: float | None
    ) -> AsyncIterator[bytes]: ...

    async def get_pod(self, name: str, namespace: str | None = None) -> dict[str, Any]: ...
