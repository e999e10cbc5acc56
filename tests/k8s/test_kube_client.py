"""mgpu.kube against a real Kubernetes 1.20 (tests/kubecluster.py): each credential kind,
each core/v1 call mgpu makes, and each failure as one sentence."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kubecluster import GPU_RESOURCE, IMAGE_BUSYBOX, KubeCluster, free_port
from mgpu.kube import (
    KubeClient,
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnreachable,
    NodeView,
    PodView,
    from_kubeconfig,
    in_cluster,
)
from mgpu.kube.loglines import LogFollower

T = TypeVar("T")


def run(
    kube: KubeCluster, body: Callable[[KubeClient], Awaitable[T]], config: Path | None = None
) -> T:
    """Run `body(client)` with a client made from `config` (default: the admin kubeconfig)."""

    async def main() -> T:
        async with KubeClient(from_kubeconfig(config or kube.kubeconfig)) as client:
            return await asyncio.wait_for(body(client), 150)

    return asyncio.run(main())


def pod(
    name: str, command: str, *, gpus: int = 0, grace: int = 1, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    limits = {GPU_RESOURCE: gpus} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE_BUSYBOX,
                    "command": ["sh", "-c", command],
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def until(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 120) -> T:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        await asyncio.sleep(0.5)


def test_nodes_through_client_certificate_and_token(kube: KubeCluster) -> None:
    for config in (kube.kubeconfig, kube.token_kubeconfig):
        nodes = run(kube, lambda c: c.list_nodes(), config)
        views = {v.name: v for v in map(NodeView.of, nodes.items)}
        assert set(views) == set(kube.nodes)
        assert all(v.ready and v.allocatable[GPU_RESOURCE] == 2 for v in views.values())
        assert {v.address for v in views.values()} == {n.ip for n in kube.nodes.values()}
        assert nodes.resource_version


def test_in_cluster_service_account(kube: KubeCluster, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(kube.pki.tokens["mgpu-test-token-admin"])
    (tmp_path / "ca.crt").write_bytes(kube.pki.ca_path.read_bytes())
    (tmp_path / "namespace").write_text("kube-system")
    env = {"KUBERNETES_SERVICE_HOST": kube.vc.gateway_ip, "KUBERNETES_SERVICE_PORT": str(kube.port)}
    creds = in_cluster(tmp_path, environ=env)
    assert creds.namespace == "kube-system"

    async def body() -> int:
        async with KubeClient(creds) as client:
            return len((await client.list_nodes()).items)

    assert asyncio.run(body()) == 2


def test_refusals_are_one_sentence(kube: KubeCluster) -> None:
    with pytest.raises(KubeForbidden) as forbidden:
        run(kube, lambda c: c.list_pods(), kube.nobody_kubeconfig)
    assert str(forbidden.value) == (
        'Kubernetes refused to list pods: pods is forbidden: User "mgpu-test-nobody" cannot'
        ' list resource "pods" in API group "" in the namespace "default".'
    )
    absent = r'^Kubernetes refused to get pod default/absent: pods "absent" not found\.$'
    with pytest.raises(KubeNotFound, match=absent):
        run(kube, lambda c: c.get_pod("absent"))

    async def refused(client: KubeClient) -> None:
        client.server = client._http.base_url = f"https://127.0.0.1:{free_port()}"  # type: ignore[assignment]
        await client.list_nodes()

    no_answer = (
        r"^Cannot list nodes: the Kubernetes API server at https://127\.0\.0\.1:\d+ gave no"
        r" answer \(connection refused\)\.$"
    )
    with pytest.raises(KubeUnreachable, match=no_answer):
        run(kube, refused)


def test_dry_run_validates_without_creating(kube: KubeCluster) -> None:
    name = unique("dry")

    async def body(client: KubeClient) -> dict[str, Any]:
        made = await client.create_pod(pod(name, "true"), dry_run=True)
        with pytest.raises(KubeNotFound):
            await client.get_pod(name)
        return made

    made = run(kube, body)
    assert made["metadata"]["name"] == name
    assert made["spec"]["schedulerName"] == "default-scheduler"  # defaulted by the server
    bad = pod(name, "true")
    bad["spec"]["containers"][0]["image"] = ""
    bad["spec"]["restartPolicy"] = "Sometimes"
    with pytest.raises(KubeInvalid) as info:
        run(kube, lambda c: c.create_pod(bad, dry_run=True))
    assert set(info.value.causes) == {
        "spec.containers[0].image: Required value.",
        'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always",'
        ' "OnFailure", "Never".',
    }


def test_pod_life_watched_logged_and_its_events(kube: KubeCluster) -> None:
    name, label = unique("life"), unique("run")
    command = "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done; exit 7"

    async def body(client: KubeClient) -> tuple[list[str], list[str], PodView, list[str]]:
        watch = client.watch_pods(label_selector=f"test={label}")
        events = watch.__aiter__()
        first = await anext(events)
        assert first.type == "SYNC" and first.items == []
        await client.create_pod(pod(name, command, gpus=1, labels={"test": label}))
        with pytest.raises(KubeConflict, match="already exists"):
            await client.create_pod(pod(name, command, labels={"test": label}))
        lines = [line.text async for line in client.follow_log(name)]
        phases = []
        async for event in events:
            view = PodView.of(event.object)
            phases.append(f"{event.type}:{view.phase}")
            if view.phase == "Failed":
                break
        final = PodView.of(await client.get_pod(name))
        reasons = [e["reason"] for e in (await client.list_events(involved_name=name)).items]
        assert await client.pod_log(name) == "".join(f"line {i}\n" for i in range(1, 6))
        await client.delete_pod(name, grace_seconds=1)
        return lines, phases, final, reasons

    lines, phases, final, reasons = run(kube, body)
    assert lines == [f"line {i}" for i in range(1, 6)]
    assert phases[0] == "ADDED:Pending" and phases[-1] == "MODIFIED:Failed"
    assert [(e.name, e.exit_code, e.reason) for e in final.ended] == [("main", 7, "Error")]
    assert final.requests == {GPU_RESOURCE: 1} and final.node in kube.nodes
    assert {"Scheduled", "Started"} <= set(reasons)


def test_followed_log_survives_a_dropped_connection(kube: KubeCluster) -> None:
    """The first connection is cut after 3 lines: the follower connects again from the
    last timestamp and gives every line once, though several share a second."""
    name = unique("follow")
    command = "for i in $(seq 1 12); do echo n$i; sleep 0.1; done; sleep 1; echo last"

    async def body(client: KubeClient) -> tuple[list[str], int]:
        await client.create_pod(pod(name, command))
        real = client.stream_lines
        calls = 0

        async def cut(
            path: str, doing: str, params: Any, timeout: float | None
        ) -> AsyncIterator[bytes]:
            nonlocal calls
            calls += 1
            count = 0
            async for raw in real(path, doing, params, timeout):
                if calls == 1 and count == 3:
                    raise KubeUnreachable("dropped (test).")
                count += 1
                yield raw

        client.stream_lines = cut  # type: ignore[method-assign]
        follower = LogFollower(client, name, client.namespace, None, retry_delay=0.1)
        got = [line.text async for line in follower.lines()]
        client.stream_lines = real  # type: ignore[method-assign]
        await client.delete_pod(name, force=True)
        return got, follower.connections

    got, connections = run(kube, body)
    assert got == [f"n{i}" for i in range(1, 13)] + ["last"]
    assert connections >= 2


def test_watch_relists_after_410_gone(kube: KubeCluster) -> None:
    """A watch from a resourceVersion long compacted away gets 410 Gone from the server,
    lists again and goes on (SYNC with the whole collection)."""

    async def body(client: KubeClient) -> tuple[str, int, int]:
        watch = client.watch_nodes(resource_version="1")
        first = await anext(watch.__aiter__())
        return first.type, len(first.items), watch.relists

    assert run(kube, body) == ("SYNC", 2, 1)


def test_delete_with_grace_then_force(kube: KubeCluster) -> None:
    """A Pod ignoring SIGTERM with 60 s grace stays Terminating; a forced delete removes it
    from the API at once; a uid precondition spares a Pod recreated under the same name."""
    name = unique("stuck")

    async def body(client: KubeClient) -> tuple[PodView, str]:
        stubborn = "trap '' TERM; while true; do sleep 1; done"
        made = await client.create_pod(pod(name, stubborn, grace=60))

        async def running() -> bool:
            return PodView.of(await client.get_pod(name)).phase == "Running"

        await until(running, f"{name} running")
        await client.delete_pod(name)  # its own grace: 60 s
        terminating = PodView.of(await client.get_pod(name))
        with pytest.raises(KubeConflict, match=r"the UID in the precondition .* does not match"):
            await client.delete_pod(name, force=True, uid="not-" + made["metadata"]["uid"])
        assert await client.delete_pod(name, force=True, uid=made["metadata"]["uid"]) is not None
        with pytest.raises(KubeNotFound):
            await client.get_pod(name)
        assert await client.delete_pod(name) is None  # already gone: not an error
        return terminating, terminating.phase

    terminating, phase = run(kube, body)
    assert terminating.deleting and phase == "Running"
