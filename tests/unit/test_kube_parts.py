"""mgpu.kube's parts that need no API server: quantities, Status answers as one-sentence
errors, kubeconfig and service-account loading, and the log follower's no-loss, no-repeat
resumption (against a scripted stream; tests/k8s has the same against a real cluster)."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from mgpu.kube import KubeConfigError, from_kubeconfig, in_cluster, quantity
from mgpu.kube.errors import KubeConflict, KubeForbidden, KubeInvalid, from_status, unreachable
from mgpu.kube.loglines import LogFollower, timestamp_ns
from mgpu.kube.objects import NodeView, PodView, unschedulable_message


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("500m", Decimal("0.5")), ("16Gi", 16 * 2**30), ("1e3", 1000), ("1.5k", 1500),
     ("129936Ki", 129936 * 1024), ("2E", 2 * 10**18)],
)  # fmt: skip
def test_quantities(text: str, value: Decimal | int) -> None:
    assert quantity(text) == value


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity("12 GB")


def test_a_forbidden_status_is_one_sentence() -> None:
    status = {
        "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'pods is forbidden: User "bob" cannot list resource "pods" in API group ""'
                   ' in the namespace "default"',
    }  # fmt: skip
    err = from_status(403, status, "list pods")
    assert isinstance(err, KubeForbidden)
    assert str(err) == (
        'Kubernetes refused to list pods: pods is forbidden: User "bob" cannot list resource'
        ' "pods" in API group "" in the namespace "default".'
    )
    assert "\n" not in str(err)


def test_an_invalid_status_keeps_one_sentence_per_cause() -> None:
    status = {
        "reason": "Invalid", "code": 422,
        "message": 'Pod "x" is invalid: spec.containers: Required value',
        "details": {"causes": [{"field": "spec.containers", "message": "Required value"}]},
    }  # fmt: skip
    err = from_status(422, status, "create a pod")
    assert isinstance(err, KubeInvalid)
    assert err.causes == ("spec.containers: Required value.",)
    assert isinstance(from_status(409, {"reason": "AlreadyExists"}, "x"), KubeConflict)
    other = from_status(500, "not json", "get pod a/b")
    assert (other.code, str(other)) == (500, "Kubernetes refused to get pod a/b: HTTP 500.")


def test_no_answer_is_one_sentence() -> None:
    # As httpx raises it: the refusal is a few causes down.
    refused = ConnectionRefusedError(111, "Connect call failed ('10.0.0.1', 6443)")
    middle = OSError("All connection attempts failed")
    middle.__cause__ = refused
    top = httpx.ConnectError("All connection attempts failed")
    top.__cause__ = middle
    err = unreachable("https://10.0.0.1:6443", "list nodes", top)
    assert str(err) == (
        "Cannot list nodes: the Kubernetes API server at https://10.0.0.1:6443 gave no answer"
        " (connection refused)."
    )


def _kubeconfig(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None
) -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k",
                      "cluster": {"server": "https://k.example:6443", **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "jobs"}}],
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_token_file_is_read_for_each_request(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("first\n")
    creds = from_kubeconfig(_kubeconfig(tmp_path, {"tokenFile": "tok"}))
    assert (creds.server, creds.namespace, creds.bearer()) == (
        "https://k.example:6443", "jobs", "first",
    )  # fmt: skip
    (tmp_path / "tok").write_text("rotated\n")
    assert creds.bearer() == "rotated"
    assert isinstance(creds.verify, ssl.SSLContext)


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ({"exec": {"command": "aws"}}, None, "uses an exec plugin, which mgpu does not run"),
        ({"client-certificate": "c.pem"}, None, "client-certificate needs client-key"),
        ({"token": "t"}, {"certificate-authority": "nowhere.crt"}, "nowhere.crt does not exist"),
        ({"token": "t"}, {"certificate-authority-data": "%%%"},
         "certificate-authority-data is not valid base64"),
        ({"client-certificate-data": base64.b64encode(b"junk").decode(),
          "client-key-data": base64.b64encode(b"junk").decode()},
         None, "cannot load the client data"),
    ],
)  # fmt: skip
def test_a_bad_kubeconfig_is_one_sentence(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(KubeConfigError, match=message) as info:
        from_kubeconfig(_kubeconfig(tmp_path, user, cluster))
    assert str(info.value).startswith(f"kubeconfig {tmp_path}/kubeconfig: ")
    assert "\n" not in str(info.value)


def test_a_missing_or_unparsable_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"Cannot read kubeconfig .*/absent \(No such file"):
        from_kubeconfig(tmp_path / "absent")
    (tmp_path / "k").write_text("current-context: nope\ncontexts: []\n")
    with pytest.raises(KubeConfigError, match="no context named 'nope'"):
        from_kubeconfig(tmp_path / "k")


def test_in_cluster_needs_the_pod_environment(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="not inside a Pod"):
        in_cluster(tmp_path, environ={})
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match="token does not exist"):
        in_cluster(tmp_path, environ=env)


def test_views_of_a_node_and_a_pod() -> None:
    node = NodeView.of({
        "metadata": {"name": "n1", "labels": {"pool": "lab"}},
        "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "3500m", "memory": "1Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "Hostname", "address": "n1"},
                                 {"type": "InternalIP", "address": "10.1.0.2"}]},
    })  # fmt: skip
    assert node.ready and not node.unschedulable and node.address == "10.1.0.2"
    assert node.allocatable == {"nvidia.com/gpu": 4, "cpu": Decimal("3.5"), "memory": 2**30}
    assert node.taints[0].effect == "NoSchedule"
    raw = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "deletionTimestamp": "x"},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"},
                                        "requests": {"cpu": "500m"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Failed", "containerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
            {"name": "b", "state": {"waiting": {"reason": "ErrImagePull"}}}],
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]},
    }  # fmt: skip
    pod = PodView.of(raw)
    assert pod.deleting and pod.node == "n1" and pod.phase == "Failed"
    assert pod.requests == {"nvidia.com/gpu": 2, "cpu": Decimal("1.5")}
    assert [(e.name, e.exit_code, e.reason) for e in pod.ended] == [("a", 137, "OOMKilled")]
    assert pod.waiting == {"b": "ErrImagePull"}
    assert unschedulable_message(raw) == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def test_timestamps_order_whatever_their_fraction() -> None:
    a = timestamp_ns("2024-05-01T10:00:01.5Z")
    b = timestamp_ns("2024-05-01T10:00:01.123456789Z")
    assert a is not None and b is not None and b < a
    assert timestamp_ns("garbage") is None


class _ScriptedLogs:
    """A stand-in for KubeClient's streaming: the server's log (stamped lines), served from
    `sinceTime` (whole seconds), with the first connection dropped after `drop_after` lines."""

    def __init__(self, lines: list[str], drop_after: int) -> None:
        self.lines = lines
        self.drop_after = drop_after
        self.since: list[str | None] = []

    async def stream_lines(
        self, path: str, doing: str, params: dict[str, Any], timeout: float | None
    ) -> AsyncIterator[bytes]:
        since = params.get("sinceTime")
        self.since.append(since)
        first = len(self.since) == 1
        for i, line in enumerate(ln for ln in self.lines if since is None or ln[:19] >= since[:19]):
            if first and i == self.drop_after:
                raise unreachable("https://k", doing, ConnectionResetError("reset"))
            yield line.encode()

    async def get_pod(self, name: str, namespace: str) -> dict[str, Any]:
        return {"status": {"containerStatuses": [{"name": "main", "state": {"terminated": {}}}]}}


@pytest.mark.parametrize("drop_after", [1, 2, 3, 4, 5])
def test_a_followed_log_resumes_without_loss_or_repeat(drop_after: int) -> None:
    # Several lines share one second, and two share one exact timestamp.
    lines = [
        "2024-05-01T10:00:00.9Z zero",
        "2024-05-01T10:00:01.1Z one",
        "2024-05-01T10:00:01.1Z one again",
        "2024-05-01T10:00:01.7Z two",
        "2024-05-01T10:00:02Z three",
        "2024-05-01T10:00:02.5Z four",
    ]
    server = _ScriptedLogs(lines, drop_after)
    follower = LogFollower(server, "p", "ns", "main", retry_delay=0)  # type: ignore[arg-type]

    async def collect() -> list[str]:
        return [line.text async for line in follower.lines()]

    got = asyncio.run(collect())
    assert got == ["zero", "one", "one again", "two", "three", "four"]
    assert len(server.since) == 2 and server.since[1] is not None  # it did reconnect


def test_the_kubelets_own_error_in_a_followed_log_is_not_the_jobs() -> None:
    """A Pod deleted while its log is followed (a cancel): the kubelet ends the stream with
    its own unstamped sentence in the body, which was shown as the job's last line."""
    lines = [
        "2024-05-01T10:00:00.9Z ready",
        "2024-05-01T10:00:01.1Z got-TERM",
        'rpc error: code = NotFound desc = an error occurred when try to find container "d2": '
        "not found",
    ]
    server = _ScriptedLogs(lines, drop_after=99)
    follower = LogFollower(server, "p", "ns", "main", retry_delay=0)  # type: ignore[arg-type]

    async def collect() -> list[str]:
        return [line.text async for line in follower.lines()]

    assert asyncio.run(collect()) == ["ready", "got-TERM"]
