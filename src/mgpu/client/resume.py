"""Where a followed job's output stands, so that a stream opened again after its connection
broke (the master restarted, another master took over) goes on with no byte lost or shown
twice.

A stream is opened from a count of records (`since`).  That count is only as good as the
records' boundaries: a new leader holds what the old one had stored, and what it had not
stored yet the agent sends again, cut into other records.  A leader on PostgreSQL serves
records from its memory before they are stored, so a follower may have counted records no
other leader will ever number the same way.  Asked for them (`marks`), such a leader says
how far its records are stored for good (`{"stored": N}`: first, then after what it sent);
a reopening starts there (`durable`), and the records after it are checked against where
each run's stream stood (`ep`, `n`, `s`: epoch, node and stream; `at`: the byte offset
its text ends at in that stream): what was shown already is dropped or cut off.  Without
marks (a master with its output in files, whose records never change) a reopening starts
from every record received.  A gap (the count went past records the new leader cut
differently) opens the stream again from its first record, once per reopening, showing
only what is new.
"""

from __future__ import annotations

from typing import Any


class Rewind(Exception):
    """Records were skipped: open the stream again from `Resume.since()` (its start)."""


class Resume:
    def __init__(self) -> None:
        self.seen = 0
        """The position after the last output record received (from this open's since)."""
        self.durable = 0
        """Records stored for good, whichever master leads next: the next `since`."""
        self._marked = False
        """Whether this open's master says how far its records are stored (`mark`)."""
        self._shown: dict[tuple[Any, Any, Any], int] = {}
        """For each run's stream: the offset its shown text ends at."""
        self._check: set[tuple[Any, Any, Any]] | None = None
        """After a reopening: the streams whose first record is still to be checked."""
        self._rewound = False
        """Whether this open is a rewind to the start already (no second one)."""
        self._before = 0
        """The furthest position received before a reopening: records without offsets
        are skipped up to there."""

    def since(self) -> int:
        return self.durable

    def mark(self, stored: Any) -> None:
        """The master's `{"stored": N}`: its first N records are stored for good."""
        if not isinstance(stored, int):
            return
        self._marked = True
        self.durable = max(0, min(stored, self.seen))  # never past what was received

    def reopen(self) -> None:
        """The stream broke and is opened again from `since()`."""
        self._restart(self.durable)
        self._rewound = False

    def from_start(self) -> None:
        """The stream broke and is opened again from its first record (`since()` is 0):
        what was shown is dropped by its offsets, a record without one by its count.  For a
        run whose end may follow its last record at once (a step): a new master may hold
        the unshown rest in fewer records than the count, and no later one shows the gap."""
        self._restart(0)
        self._rewound = True

    def _restart(self, at: int) -> None:
        self._check = set(self._shown)
        self._before = max(self._before, self.seen)
        self.seen = self.durable = at
        self._marked = False

    def take(self, rec: dict[str, Any]) -> str | None:
        """The text of an output record to show (maybe its end only), or None when it was
        shown already.  Raises Rewind when records were skipped."""
        self.seen += 1
        if not self._marked:
            self.durable = self.seen
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
                    self.seen -= 1  # this record is not shown: received again after
                    self._restart(0)
                    self._rewound = True
                    raise Rewind
            if start < last:  # its beginning was shown: the end only
                text = data[last - start :].decode(errors="replace")
        self._shown[key] = at
        return text
