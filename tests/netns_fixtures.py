"""Pytest fixtures for multi-host tests on network namespaces (see netns.py).

Import into tests/conftest.py::

    from netns_fixtures import virtual_cluster  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from netns import VirtualCluster, cleanup_stale, netns_available


@pytest.fixture(scope="module")
def virtual_cluster() -> Iterator[VirtualCluster]:
    """A running VirtualCluster with no hosts yet (add them with add_host), shared by
    the tests of one module and torn down, processes included, after its last test.

    Skips when the machine cannot build network namespaces (not root, no iproute2...)."""
    reason = netns_available()
    if reason is not None:
        pytest.skip(f"virtual cluster unavailable: {reason}")
    cleanup_stale()
    with VirtualCluster() as cluster:
        yield cluster
