"""Where a followed job's output stands, so that a stream opened again after its connection
broke (the master restarted, another master took over) goes on with no byte lost or shown
twice.

A stream is opened from a count of records (`since`).  That count is only as good as the
records' boundaries: a new leader holds what the old one had stored, and what it had not
stored yet the agent sends again, cut into other records.  So the first records after a
reopening are checked against where each run's stream stood (`ep`, `n`, `s`: epoch, node
and stream; `at`: the byte offset its text ends at in that stream): what was shown already
is dropped or cut off, and a gap (the count went past records the new leader cut
differently) opens the stream again from its first record, once, showing only what is new.
"""

from __future__ import annotations

from typing import Any


class Rewind(Exception):
    """Records were skipped: open the stream again from `Resume.since()` (its start)."""


class Resume:
    def __init__(self) -> None:
        self.seen = 0
        """Output records received on the stream as it is open now (the next `since`)."""
        self._shown: dict[tuple[Any, Any, Any], int] = {}
        """For each run's stream: the offset its shown text ends at."""
        self._check: set[tuple[Any, Any, Any]] | None = None
        """After a reopening: the streams whose first record is still to be checked."""
        self._rewound = False
        self._before = 0
        """After a rewind: the records received before it (those without offsets are
        skipped up to there)."""

    def since(self) -> int:
        return self.seen

    def reopen(self) -> None:
        """The stream broke and is opened again from `since()`."""
        self._check = set(self._shown)

    def from_start(self) -> None:
        """The stream broke and is opened again from its first record (`since()` is 0):
        what was shown is dropped by its offsets, a record without one by its count.  For a
        run whose end may follow its last record at once (a step): a new master may hold
        the unshown rest in fewer records than the count, and no later one shows the gap."""
        self._check = set(self._shown)
        self._rewound, self._before, self.seen = True, self.seen, 0

    def take(self, rec: dict[str, Any]) -> str | None:
        """The text of an output record to show (maybe its end only), or None when it was
        shown already.  Raises Rewind when records were skipped."""
        self.seen += 1
        text: str = rec["d"]
        at = rec.get("at")
        if not isinstance(at, int):
            return None if self.seen <= self._before else text
        key = (rec.get("ep"), rec.get("n"), rec.get("s"))
        last = self._shown.get(key)
        if last is not None and self._check is not None:
            if at <= last:
                return None  # shown before the stream broke
            data = text.encode()
            start = at - len(data)
            if key in self._check:
                self._check.discard(key)
                if start > last and not self._rewound:
                    self._rewound, self._before, self.seen = True, self.seen - 1, 0
                    self._check = set(self._shown)
                    raise Rewind
            if start < last:  # its beginning was shown: the end only
                text = data[last - start :].decode(errors="replace")
        self._shown[key] = at
        return text
