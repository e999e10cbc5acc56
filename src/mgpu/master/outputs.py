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

    def path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.jsonl"

    def append(self, job_id: str, stream: str, data: str, node_id: str) -> None:
        rec: Record = {"s": stream, "d": data, "n": node_id}
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
