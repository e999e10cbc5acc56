"""An asynchronous client for the few core/v1 calls mgpu makes (Kubernetes 1.20's API, which
has not changed since for these): Nodes list/watch, Pods create (and server-side dry run),
get, list, watch and delete, pods/log (whole or followed), Events list.

Every failure is a :class:`mgpu.kube.errors.KubeError` whose text is one sentence; objects
are the API's JSON (dicts), with typed views in :mod:`mgpu.kube.objects`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from mgpu.kube import credentials as creds_mod
from mgpu.kube.credentials import Credentials
from mgpu.kube.errors import KubeError, KubeUnreachable, from_status, unreachable
from mgpu.kube.loglines import LogFollower, LogLine
from mgpu.kube.watch import Watch

TIMEOUT = 30.0  # seconds for one ordinary call (not for a watch or a followed log)


def _q(name: str) -> str:
    return quote(name, safe="")


class ObjectList:
    """A list answer: its `items` and the `resource_version` to watch from."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.items: list[dict[str, Any]] = list(body.get("items") or [])
        self.resource_version: str = str((body.get("metadata") or {}).get("resourceVersion", ""))


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


class KubeClient:
    """One API server's client; share it among tasks of one event loop.  `aclose()` it."""

    def __init__(self, credentials: Credentials, *, timeout: float = TIMEOUT) -> None:
        self.credentials = credentials
        self.server = credentials.server
        self.namespace = credentials.namespace
        self._http = httpx.AsyncClient(
            base_url=credentials.server,
            verify=credentials.verify,
            timeout=timeout,
            follow_redirects=False,
        )

    @classmethod
    def from_config(cls, kubeconfig: str | Path | None, context: str | None = None) -> KubeClient:
        """A client from a kubeconfig file, or (None) the in-cluster service account."""
        return cls(creds_mod.load(kubeconfig, context))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing

    def _headers(self) -> dict[str, str]:
        token = self.credentials.bearer()
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def request(
        self,
        method: str,
        path: str,
        doing: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        """One call; its decoded JSON answer, or a KubeError saying what `doing` met.
        `content_type`: the body's, when not plain JSON (a merge patch)."""
        headers = self._headers()
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            resp = await self._http.request(method, path, params=params, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise unreachable(self.server, doing, exc) from None
        return self._decode(resp, doing)

    def _decode(self, resp: httpx.Response, doing: str) -> Any:
        try:
            data = resp.json() if resp.content else None
        except ValueError:
            data = None
        if resp.is_success:
            if data is None and resp.content:
                raise KubeError(f"Kubernetes sent an answer that is not JSON to {doing}.")
            return data
        raise from_status(resp.status_code, data, doing)

    async def stream_lines(
        self, path: str, doing: str, params: Mapping[str, str | int], timeout: float | None
    ) -> AsyncIterator[bytes]:
        """The answer's lines as they come (watch events, a followed log); raises KubeError
        when refused, KubeUnreachable when the connection fails or drops."""
        try:
            async with self._http.stream(
                "GET",
                path,
                params=params,
                headers=self._headers(),
                timeout=httpx.Timeout(TIMEOUT, read=timeout),
            ) as resp:
                if not resp.is_success:
                    await resp.aread()
                    raise self._error(resp, doing)
                async for line in resp.aiter_lines():
                    yield line.encode()
        except httpx.HTTPError as exc:
            raise unreachable(self.server, doing, exc) from None

    def _error(self, resp: httpx.Response, doing: str) -> KubeError:
        try:
            data = json.loads(resp.content) if resp.content else None
        except ValueError:
            data = None
        return from_status(resp.status_code, data, doing)

    # -- nodes

    async def list_nodes(self, label_selector: str | None = None) -> ObjectList:
        params = _selectors(label_selector, None)
        return ObjectList(await self.request("GET", "/api/v1/nodes", "list nodes", params=params))

    def watch_nodes(self, label_selector: str | None = None, **kw: Any) -> Watch:
        """Nodes' changes, first a full list (see Watch)."""
        return Watch(self, "/api/v1/nodes", "watch nodes", _selectors(label_selector, None), **kw)

    # -- pods

    def _pods(self, namespace: str | None) -> str:
        return f"/api/v1/namespaces/{_q(namespace)}/pods" if namespace else "/api/v1/pods"

    async def create_pod(
        self, pod: Mapping[str, Any], namespace: str | None = None, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create a Pod (with `dry_run`, only as validated and defaulted by the server)."""
        ns = namespace or self.namespace
        params = {"dryRun": "All"} if dry_run else None
        doing = f"{'dry-run ' if dry_run else ''}create a pod in namespace {ns}"
        result: dict[str, Any] = await self.request(
            "POST", self._pods(ns), doing, params=params, body=dict(pod)
        )
        return result

    async def get_pod(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        ns = namespace or self.namespace
        result: dict[str, Any] = await self.request(
            "GET", f"{self._pods(ns)}/{_q(name)}", f"get pod {ns}/{name}"
        )
        return result

    async def list_pods(
        self,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        ns = None if all_namespaces else namespace or self.namespace
        params = _selectors(label_selector, field_selector)
        body = await self.request("GET", self._pods(ns), "list pods", params=params)
        return ObjectList(body)

    def watch_pods(
        self,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        **kw: Any,
    ) -> Watch:
        ns = None if all_namespaces else namespace or self.namespace
        params = _selectors(label_selector, field_selector)
        return Watch(self, self._pods(ns), "watch pods", params, **kw)

    async def delete_pod(
        self,
        name: str,
        namespace: str | None = None,
        *,
        grace_seconds: int | None = None,
        force: bool = False,
        uid: str | None = None,
    ) -> dict[str, Any] | None:
        """Delete a Pod with `grace_seconds` (None: its own terminationGracePeriodSeconds);
        `force` removes it from the API at once (grace 0), whether or not its node has
        stopped it.  `uid` deletes only that incarnation (a Pod recreated under the same name
        is left alone: KubeConflict).  None when it was already gone."""
        ns = namespace or self.namespace
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if force:
            options["gracePeriodSeconds"] = 0
        elif grace_seconds is not None:
            options["gracePeriodSeconds"] = max(1, int(grace_seconds))  # 0 would mean force
        if uid:
            options["preconditions"] = {"uid": uid}
        doing = f"{'force-' if force else ''}delete pod {ns}/{name}"
        try:
            result: dict[str, Any] = await self.request(
                "DELETE", f"{self._pods(ns)}/{_q(name)}", doing, body=options
            )
        except KubeError as exc:
            if exc.code == 404:
                return None
            raise
        return result

    async def pod_log(
        self,
        name: str,
        namespace: str | None = None,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
        previous: bool = False,
    ) -> str:
        """The log of a Pod's container so far."""
        ns = namespace or self.namespace
        params: dict[str, str | int] = {}
        if container:
            params["container"] = container
        if tail_lines is not None:
            params["tailLines"] = tail_lines
        if previous:
            params["previous"] = "true"
        path = f"{self._pods(ns)}/{_q(name)}/log"
        doing = f"read the log of pod {ns}/{name}"
        try:
            resp = await self._http.get(path, params=params, headers=self._headers())
        except httpx.HTTPError as exc:
            raise unreachable(self.server, doing, exc) from None
        if not resp.is_success:
            raise self._error(resp, doing)
        return resp.text

    def follow_log(
        self, name: str, namespace: str | None = None, *, container: str | None = None, **kw: Any
    ) -> AsyncIterator[LogLine]:
        """A Pod's log line by line, following it until the container ends; the connection
        is made again when it drops, and no line is lost or given twice (LogFollower)."""
        return LogFollower(self, name, namespace or self.namespace, container, **kw).lines()

    # -- secrets

    def _secrets(self, namespace: str | None) -> str:
        return f"/api/v1/namespaces/{_q(namespace or self.namespace)}/secrets"

    async def create_secret(
        self, secret: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        ns = namespace or self.namespace
        result: dict[str, Any] = await self.request(
            "POST", self._secrets(ns), f"create a secret in namespace {ns}", body=dict(secret)
        )
        return result

    async def own_secret(
        self, name: str, owner: Mapping[str, Any], namespace: str | None = None
    ) -> None:
        """Make `owner` (an ownerReference) the Secret's owner: Kubernetes' garbage
        collector deletes the Secret once its owner is gone."""
        ns = namespace or self.namespace
        await self.request(
            "PATCH",
            f"{self._secrets(ns)}/{_q(name)}",
            f"set the owner of secret {ns}/{name}",
            body={"metadata": {"ownerReferences": [dict(owner)]}},
            content_type="application/merge-patch+json",
        )

    async def list_secrets(
        self, namespace: str | None = None, *, label_selector: str | None = None
    ) -> ObjectList:
        ns = namespace or self.namespace
        params = _selectors(label_selector, None)
        body = await self.request("GET", self._secrets(ns), f"list secrets in {ns}", params=params)
        return ObjectList(body)

    async def delete_secret(self, name: str, namespace: str | None = None) -> bool:
        """Delete a Secret; False when it was already gone."""
        ns = namespace or self.namespace
        try:
            await self.request(
                "DELETE", f"{self._secrets(ns)}/{_q(name)}", f"delete secret {ns}/{name}"
            )
        except KubeError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    # -- events

    async def list_events(
        self,
        namespace: str | None = None,
        *,
        involved_name: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """Events of a namespace; `involved_name`: only those about that object."""
        ns = namespace or self.namespace
        selectors = [field_selector] if field_selector else []
        if involved_name:
            selectors.append(f"involvedObject.name={involved_name}")
        params = _selectors(None, ",".join(selectors) or None)
        body = await self.request(
            "GET", f"/api/v1/namespaces/{_q(ns)}/events", f"list events in {ns}", params=params
        )
        return ObjectList(body)


__all__ = ["KubeClient", "KubeUnreachable", "ObjectList"]
