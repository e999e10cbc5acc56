from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import LocalCluster, local_cluster
from netns_fixtures import virtual_cluster  # noqa: F401


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A master and two agents with 4 fake GPUs each, on loopback."""
    with local_cluster(tmp_path, agents=2, gpus=4) as c:
        yield c
