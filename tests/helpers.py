"""Test helpers: the local-cluster harness lives in the package (benchmarks use it too)."""

from mgpu.testing import BIN, LocalCluster, free_port, kill_group, local_cluster, wait_for

__all__ = ["BIN", "LocalCluster", "free_port", "kill_group", "local_cluster", "wait_for"]
