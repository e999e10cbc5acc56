"""Job output kept by the master: one JSON-lines file per job, plus live followers.

Each record is `{"s": "o"|"e", "d": text, "n": node_id}`, in the order the
master received it, so `mgpu logs` can show stdout and stderr interleaved as
they came and `srun` can split them again.  Followers subscribe before they
read the file and skip records they already read (by record index), so no line
is lost or shown twice between the file and the live feed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import IO, Any

Record = dict[str, Any]


class OutputStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, IO[str]] = {}
        self._counts: dict[str, int] = {}
        self._followers: dict[str, set[asyncio.Queue[tuple[int, Record] | None]]] = {}
        self._have: dict[str, dict[tuple[int, str, str], int]] = {}
        """job -> (epoch, node, stream) -> bytes of that run's stream stored so far."""

    def path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.jsonl"

    def accept(
        self,
        job_id: str,
        epoch: int,
        node_id: str,
        stream: str,
        data: str,
        start: int | None,
        end: int | None,
    ) -> str | None:
        """What of an agent's chunk (bytes [start, end) of a run's stream) is new, or None
        for a chunk already stored or one after a gap (the agent re-sends from the gap)."""
        if start is None or end is None:
            return data
        runs = self._have.setdefault(job_id, {})
        have = runs.get((epoch, node_id, stream), 0)
        if end <= have or start > have:
            return None
        if start < have:
            data = data.encode()[have - start :].decode(errors="replace")
        runs[(epoch, node_id, stream)] = end
        return data

    def resume_point(self, job_id: str, epoch: int, node_id: str) -> tuple[int, int]:
        """Bytes of stdout and stderr stored for one run (read back after a master restart)."""
        runs = self._have.get(job_id)
        if runs is None:
            runs = self._have[job_id] = {}
            for rec in self.read(job_id):
                if "at" in rec:
                    key = (rec["ep"], rec["n"], rec["s"])
                    runs[key] = max(runs.get(key, 0), rec["at"])
        return runs.get((epoch, node_id, "o"), 0), runs.get((epoch, node_id, "e"), 0)

    def append(
        self,
        job_id: str,
        stream: str,
        data: str,
        node_id: str,
        epoch: int | None = None,
        end: int | None = None,
    ) -> None:
        rec: Record = {"s": stream, "d": data, "n": node_id}
        if epoch is not None and end is not None:
            rec["ep"], rec["at"] = epoch, end  # where this run's stream stands, for restarts
        f = self._files.get(job_id)
        if f is None:
            f = self._files[job_id] = open(self.path(job_id), "a", encoding="utf-8")  # noqa: SIM115
            if job_id not in self._counts:
                self._counts[job_id] = self._count_existing(job_id)
        f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        f.flush()
        index = self._counts[job_id]
        self._counts[job_id] = index + 1
        for q in self._followers.get(job_id, ()):
            q.put_nowait((index, rec))

    def _count_existing(self, job_id: str) -> int:
        try:
            with open(self.path(job_id), encoding="utf-8") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def close(self, job_id: str) -> None:
        """The job ended: close its file and wake followers so they can finish."""
        f = self._files.pop(job_id, None)
        if f is not None:
            f.close()
        self._have.pop(job_id, None)
        for q in self._followers.get(job_id, ()):
            q.put_nowait(None)

    def read(self, job_id: str, start: int = 0) -> list[Record]:
        out: list[Record] = []
        try:
            with open(self.path(job_id), encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if i >= start and line.endswith("\n"):
                        out.append(json.loads(line))
        except FileNotFoundError:
            pass
        return out

    def subscribe(self, job_id: str) -> asyncio.Queue[tuple[int, Record] | None]:
        q: asyncio.Queue[tuple[int, Record] | None] = asyncio.Queue()
        self._followers.setdefault(job_id, set()).add(q)
        return q

    def unsubscribe(self, job_id: str, q: asyncio.Queue[tuple[int, Record] | None]) -> None:
        subs = self._followers.get(job_id)
        if subs is not None:
            subs.discard(q)
            if not subs:
                del self._followers[job_id]

    def close_all(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
