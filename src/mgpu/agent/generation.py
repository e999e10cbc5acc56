"""The highest leader generation this agent was welcomed with, kept in its node dir.

A leader's `Welcome` carries its lease generation (several masters on one database): a
master that welcomes us with a lower one than already seen is a deposed leader that woke
up, and is left before anything it says is acted on.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("mgpu.agent")

GENERATION_FILE = "master-generation"
"""In the node dir: the highest leader generation this agent was welcomed with."""


class DeposedMaster(ConnectionError):
    """A master welcomed us with a lower generation than one already seen."""


class LeaderGeneration:
    def __init__(self, node_dir: Path) -> None:
        self.path = node_dir / GENERATION_FILE
        self.value: int | None = None
        """The highest generation seen (None: none yet, or a single master)."""

    def load(self) -> None:
        try:
            self.value = int(self.path.read_text().strip())
        except (OSError, ValueError):
            self.value = None

    def check(self, generation: int | None, master: str) -> None:
        """Refuse a Welcome of `generation` from the master at `master` if it is older
        than one seen; keep it if it is newer."""
        if generation is None:  # a single master: nothing to compare
            return
        if self.value is not None and generation < self.value:
            raise DeposedMaster(
                f"the master at {master} leads with generation {generation}, older "
                f"than {self.value} seen: a deposed leader, left"
            )
        if self.value is None or generation > self.value:
            self._keep(generation)

    def _keep(self, generation: int) -> None:
        self.value = generation
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = self.path.with_name(f".{GENERATION_FILE}.new")
            fresh.write_text(f"{generation}\n")
            fresh.replace(self.path)
        except OSError as e:  # kept in memory still: refused until the agent restarts
            log.warning("cannot keep the leader's generation in %s: %s", self.path, e)
