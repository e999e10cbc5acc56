"""The Kubernetes tier: a real Kubernetes 1.20 per test module (tests/kubecluster.py).

scripts/k8s/build.sh builds it once per machine (minutes; `make k8s` runs it first) and
then answers from its cache; where it cannot be built here, every test of the tier skips
with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubecluster import KubeCluster, build

_BUILT: tuple[Path | None, str] | None = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build (or find cached) before any test runs, outside the per-test timeout; each test
    here may take a cluster start (a minute or more on a loaded machine) on top of its own."""
    global _BUILT
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(str(item.fspath)).parents]
    if ours and _BUILT is None:
        _BUILT = build()
    for item in ours:
        item.add_marker(pytest.mark.timeout(420))


def kubernetes_cache() -> Path:
    """The build cache, or skip with why there is none."""
    cache, why = _BUILT if _BUILT is not None else build()
    if cache is None:
        pytest.skip(f"no test Kubernetes here: {why}")
    return cache


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeCluster]:
    """A running 2-node Kubernetes with 2 fake nvidia.com/gpu per node, for one module."""
    with KubeCluster(kubernetes_cache(), nodes=2, gpus_per_node=2) as cluster:
        yield cluster
