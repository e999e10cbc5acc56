"""Job output kept by the master: one JSON-lines file per job, plus live followers.

Each record is `{"s": "o"|"e", "d": text, "n": node_id}`, in the order the
master received it, so `mgpu logs` can show stdout and stderr interleaved as
they came and `srun` can split them again.

The file is the only source readers take records from: `logs`, `logs -f`, srun
and steps read it in bounded chunks of whole lines and send those lines as they
are (each is already a JSON record), so a reader holds one chunk, not the file.
A follower is only woken when something was appended; it then reads on from
where it stopped.  Appends happen on the event loop, between a reader's reads,
so the file always ends with a whole line when a reader looks: it reaches the
end, sees the job ended (no await in between) and knows it has every record, so
no line is lost or shown twice between the file and the live feed.  A client
that reconnects passes how many records it has (`since`) and the reader skips
that many lines.

A job's file is capped (`cap`, `limits.max_output_per_job`): the record that would
take it past the cap is cut to fit, followed by one marker record on stderr, and
the job's later output (of every run: the cap bounds the file, which a requeued
job's runs share) is dropped; the job runs on.  The size is counted in memory per
open file, read at open; a restarted master finds a file at the cap full again.

A user's files together are capped too (`user_cap`, `limits.max_output_per_user`): a
record that would take the user past it is dropped, its job's file gets the marker and
drops the rest of its output.  The bytes per user are counted in memory as records are
appended and files deleted (retention); after a restart the files already on disk are
added once (`add_usage`, from `file_sizes` read off the loop by the retention task).

`OutputStore` and `OutputReader` are what the rest of the master uses; `FileOutputStore`
(this module, the default and every SQLite cluster's) and `PgOutputStore`
(store/pgoutputs.py, a cluster on PostgreSQL, whose output any master can read after a
failover) implement them with the same records, order, caps and resume points.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import IO, Any

from mgpu.master.store.spares import Spares

Record = dict[str, Any]

_encode = json.JSONEncoder(separators=(",", ":")).encode
"""A record as one compact line (json.dumps with these separators builds an encoder a call)."""

CHUNK = 64 * 1024
"""Bytes read from an output file per step: a reader's memory, whatever the file's size."""

ALL_SENT = 1 << 62
"""A resume offset past any output: the agent sends nothing more of that run."""

MARKER = "mgpu: output truncated at "
"""How the record that ends a capped job's output begins."""

# The end of a record as `append` writes it: node, run epoch and byte offset, last.
RUN_TAIL = re.compile(rb'"n":("(?:[^"\\]|\\.)*"),"ep":(\d+),"at":(\d+)\}$')


class OutputReader(ABC):
    """Whole records of one job's output from record `start` on, a chunk at a time."""

    @abstractmethod
    def step(self, limit: int = CHUNK) -> bytes | None:
        """Whole records (b"" if none are complete yet), or None at the end of what is
        stored (or of what was there when a one-off read began)."""

    async def chunks(self) -> AsyncIterator[bytes]:
        """Every whole record written so far, in chunks; returns right after finding the
        end, with no await in between (see the module docstring)."""
        while True:
            chunk = self.step()
            if chunk is None:
                return
            if chunk:
                yield chunk
            else:
                await asyncio.sleep(0)  # only skipped or a long line: let others in

    def stored(self) -> int | None:
        """How many records from the first are stored for good, as any master will number
        them, up to where this reader stands; None where every record read is (a file)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Let go of what the reader holds (a file, a page of rows)."""


class FileOutputReader(OutputReader):
    """Whole records of one output file from record `start` on, a chunk at a time."""

    def __init__(self, path: Path, start: int = 0, stop_at_current_end: bool = False) -> None:
        self.path = path
        self._skip = start
        self._partial = b""
        self._f: IO[bytes] | None = None
        self._end: int | None = None
        if stop_at_current_end:
            try:
                self._end = path.stat().st_size
            except FileNotFoundError:
                self._end = 0

    def step(self, limit: int = CHUNK) -> bytes | None:
        """Read at most `limit` bytes: the whole records they complete (b"" if none did),
        or None at the end of what is written (or of what was there when a one-off read
        began)."""
        if self._f is None:
            try:
                self._f = open(self.path, "rb")  # noqa: SIM115 (closed by close())
            except FileNotFoundError:
                return None
        if self._end is not None:
            limit = min(limit, self._end - self._f.tell())
            if limit <= 0:
                return None
        block = self._f.read(limit)
        if not block:
            return None
        if self._skip:
            lines = block.count(b"\n")
            if lines < self._skip:
                self._skip -= lines
                return b""
            pos = -1
            for _ in range(self._skip):
                pos = block.index(b"\n", pos + 1)
            self._skip = 0
            block = block[pos + 1 :]
        data = self._partial + block
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        return data[:cut]

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class OutputStore(ABC):
    """What the master uses of a job output store (see the module docstring): appends on
    the event loop, readers, followers, caps and the runs' resume points."""

    def __init__(self) -> None:
        self.cap: int | None = None
        """Bytes a job's output may hold before the rest is dropped (None: no cap)."""
        self.user_cap: int | None = None
        """Bytes all of one user's output may hold (None: no cap)."""
        self.owner: Callable[[str], str | None] = lambda job_id: None
        """The user of an active job (set by the controller)."""
        self.user_bytes: dict[str, int] = {}
        """Bytes stored per user (see the module docstring)."""
        self._followers: dict[str, set[asyncio.Event]] = {}
        self._have: dict[str, dict[tuple[int, str, str], int]] = {}
        """job -> (epoch, node, stream) -> bytes of that run's stream stored so far."""

    def fresh(self, job_id: str) -> None:  # noqa: B027  (a hint: most stores need none)
        """The job's first run starts here: it has no stored output (a store that looks a
        job's size up at its first record need not)."""

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

    @abstractmethod
    def resume_point(self, job_id: str, epoch: int, node_id: str) -> tuple[int, int]:
        """Bytes of stdout and stderr stored for one run (Welcome.resume: where the agent
        goes on sending); ALL_SENT for a job at its cap."""

    @abstractmethod
    def append(
        self,
        job_id: str,
        stream: str,
        data: str,
        node_id: str,
        epoch: int | None = None,
        end: int | None = None,
    ) -> None:
        """Add one record (on the event loop; readers and followers see it at once)."""

    @abstractmethod
    def close(self, job_id: str) -> None:
        """The job ended: let go of what its appends held and wake followers."""

    @abstractmethod
    def delete(self, job_id: str, user: str) -> int:
        """Delete an ended job's output (retention), its bytes taken off `user`'s count;
        the bytes deleted (0 for a job still open)."""

    @abstractmethod
    def file_sizes(self) -> dict[str, int]:
        """Every job's stored output size by job id (for a worker thread)."""

    @abstractmethod
    def reader(self, job_id: str, start: int = 0, follow: bool = True) -> OutputReader:
        """A reader from record `start`; not following: up to what is written now."""

    @abstractmethod
    def close_all(self) -> None:
        """Shutdown: everything appended stored, files and connections closed."""

    def when_stored(
        self, then: Callable[[], None], ended: bool = False, in_thread: bool = False
    ) -> None:
        """Call `then` once every record appended so far (`ended`: to the jobs closed so
        far) is stored for good: before the master lets an agent forget a run (it would
        not re-send its output), and before an ended job's end is written (a new leader
        drops the output of an ended run).  `then` runs on the event loop that runs here,
        if any; `in_thread`: in whichever thread finds them stored (an Event's `set`)."""
        then()

    def add_usage(self, by_user: Mapping[str, int]) -> None:
        """Add bytes found stored at start to the users' counts."""
        for user, size in by_user.items():
            self.user_bytes[user] = self.user_bytes.get(user, 0) + size

    def read(self, job_id: str, start: int = 0) -> list[Record]:
        """Every record from `start`, parsed: for tests and tools, never for a request."""
        reader = self.reader(job_id, start, follow=False)
        out: list[Record] = []
        try:
            while (chunk := reader.step()) is not None:
                out += [json.loads(line) for line in chunk.splitlines()]
        finally:
            reader.close()
        return out

    def subscribe(self, job_id: str) -> asyncio.Event:
        """An event set whenever the job's output grows or ends (the caller clears it)."""
        wake = asyncio.Event()
        self._followers.setdefault(job_id, set()).add(wake)
        return wake

    def unsubscribe(self, job_id: str, wake: asyncio.Event) -> None:
        subs = self._followers.get(job_id)
        if subs is not None:
            subs.discard(wake)
            if not subs:
                del self._followers[job_id]

    def _wake(self, job_id: str) -> None:
        for wake in self._followers.get(job_id, ()):
            wake.set()

    def _bounded(
        self, used: int, rec: Record, node_id: str, user: str | None
    ) -> tuple[bytes, bool]:
        """The line(s) to store for `rec` in a job holding `used` bytes, and whether the
        job is full after them: cut and marked at the job's cap, only the marker past the
        user's; the user's count grows by what is stored."""
        line = (_encode(rec) + "\n").encode()  # ASCII: ensure_ascii escapes the rest
        full = False
        if self.cap is not None and used + len(line) > self.cap:
            kept = self._cut(rec, line, self.cap - used)
            line = kept + self._marker(node_id, not kept or not rec["d"].endswith("\n"))
            full = True
        if user is not None:
            have = self.user_bytes.get(user, 0)
            if self.user_cap is not None and have + len(line) > self.user_cap:
                line = self._marker(node_id, True, "max_output_per_user", self.user_cap)
                full = True
            self.user_bytes[user] = have + len(line)
        return line, full

    def _cut(self, rec: Record, line: bytes, room: int) -> bytes:
        """The record that reaches the cap, its text cut to fit in `room` bytes (b"" if
        none of it fits)."""
        data: str = rec["d"]
        fixed = len(line) - (len(_encode(data)) - 2)  # the line without the text's escapes
        rec["d"] = _fit(data, room - fixed)
        return (_encode(rec) + "\n").encode() if rec["d"] else b""

    def _marker(
        self, node_id: str, own_line: bool, limit: str = "max_output_per_job", cap: int = 0
    ) -> bytes:
        """The last record of a capped job: on stderr, so `srun` shows it as the job's."""
        cap = cap or self.cap or 0
        text = f"{MARKER}{size_text(cap)} (limits.{limit})\n"
        rec = {"s": "e", "d": "\n" + text if own_line else text, "n": node_id}
        return (_encode(rec) + "\n").encode()

    def _give_back(self, user: str, size: int) -> None:
        """Take a deleted job's bytes off its user's count."""
        left = self.user_bytes.get(user, 0) - size
        if left > 0:
            self.user_bytes[user] = left
        else:
            self.user_bytes.pop(user, None)


class FileOutputStore(OutputStore):
    """One JSON-lines file per job under `root` (the state dir's `output/`); a job's new
    file is a spare made ahead off the event loop (spares.py), not created on it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._root = str(root)
        self._files: dict[str, int] = {}
        """Open files (descriptors, written unbuffered) of jobs that may still append."""
        self._sizes: dict[str, int] = {}
        """Bytes in each open file: checked against the cap without a syscall."""
        self._full: set[str] = set()
        """Open files at the cap: their marker is stored, further records are dropped."""
        self._owners: dict[str, str] = {}
        """The user of each open file."""
        self._repaired: set[str] = set()
        self._spares = Spares(root)

    def path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.jsonl"

    def resume_point(self, job_id: str, epoch: int, node_id: str) -> tuple[int, int]:
        """Bytes of stdout and stderr stored for one run (read back after a master restart).
        A file at the cap wants nothing more: ALL_SENT, so that an agent does not send
        again what would be dropped (gigabytes, maybe, with the run's end waiting behind)."""
        if self._at_cap(job_id):
            return ALL_SENT, ALL_SENT
        runs = self._have.get(job_id)
        if runs is None:
            runs = self._have[job_id] = self._scan_run(job_id, epoch)
        return runs.get((epoch, node_id, "o"), 0), runs.get((epoch, node_id, "e"), 0)

    def _at_cap(self, job_id: str) -> bool:
        if job_id in self._full:
            return True
        if self.cap is None:
            return False
        try:
            return os.stat(self.path(job_id)).st_size >= self.cap
        except FileNotFoundError:
            return False

    def _scan_run(self, job_id: str, epoch: int) -> dict[tuple[int, str, str], int]:
        """Where each node's streams of run `epoch` stand: read backwards from the end of
        the file, a chunk at a time, until an older run's record (runs follow each other
        in the file: an older run's output is refused once a new one starts)."""
        runs: dict[tuple[int, str, str], int] = {}
        path = self.path(job_id)
        self._repair(path)
        try:
            f = open(path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            return runs
        with f:
            pos = f.seek(0, os.SEEK_END)
            tail = b""
            while pos > 0:
                size = min(CHUNK, pos)
                pos -= size
                f.seek(pos)
                data = f.read(size) + tail
                lines = data.split(b"\n")
                tail = lines.pop(0) if pos > 0 else b""  # maybe cut: joined with the next read
                for line in reversed(lines):
                    m = RUN_TAIL.search(line, max(0, len(line) - 512))
                    if m is None or not line.startswith(b'{"s":"'):
                        continue  # a step's or the master's own note: no run offsets
                    ep = int(m.group(2))
                    if ep < epoch:
                        return runs
                    if ep == epoch:
                        key = (ep, json.loads(m.group(1)), chr(line[6]))
                        runs[key] = max(runs.get(key, 0), int(m.group(3)))
        return runs

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
        fd = self._files.get(job_id)
        if fd is None:
            fd = self._open(job_id, node_id)
        if job_id in self._full:
            return
        used = self._sizes[job_id]
        line, full = self._bounded(used, rec, node_id, self._owners.get(job_id))
        if full:
            self._full.add(job_id)
        self._sizes[job_id] = used + len(line)
        while line:  # one write: in the page cache when it returns, as a kill -9 needs
            line = line[os.write(fd, line) :]
        self._wake(job_id)

    def _open(self, job_id: str, node_id: str) -> int:
        """The job's file for appending: one open that creates it or finds what an earlier
        run (or master) wrote, repaired then if it was not yet (see `_repair`), and its
        size (a file at the cap is full; if the cap was lowered, the marker is added)."""
        name = f"{job_id}.jsonl"
        path = os.path.join(self._root, name)
        try:  # an earlier run's (or master's) file; else a spare linked there, else created
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            self._spares.link(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
        size = os.fstat(fd).st_size
        if name not in self._repaired and size and self._repair(self.path(job_id)):
            size = os.fstat(fd).st_size
        self._repaired.add(name)
        self._files[job_id] = fd
        self._sizes[job_id] = size
        user = self.owner(job_id)
        if user is not None:
            self._owners[job_id] = user
        if self.cap is not None and size >= self.cap:
            self._full.add(job_id)
            if not _ends_with_marker(self.path(job_id), size):
                marker = self._marker(node_id, True)
                while marker:
                    marker = marker[os.write(fd, marker) :]
        return fd

    def _repair(self, path: Path) -> bool:
        """Once per file and master run: drop a last line cut short by a crash, so the
        next record starts on a line of its own (the agent re-sends what it held).
        True if something was dropped."""
        if path.name in self._repaired:
            return False
        self._repaired.add(path.name)
        try:
            with open(path, "rb+") as f:
                pos = f.seek(0, os.SEEK_END)
                end = pos
                while pos > 0:
                    size = min(CHUNK, pos)
                    pos -= size
                    f.seek(pos)
                    cut = f.read(size).rfind(b"\n")
                    if cut >= 0:
                        pos += cut + 1
                        break
                if pos < end:
                    f.truncate(pos)
                    return True
        except FileNotFoundError:
            pass
        return False

    def close(self, job_id: str) -> None:
        """The job ended: close its file and wake followers so they can finish."""
        fd = self._files.pop(job_id, None)
        if fd is not None:
            os.close(fd)
        self._sizes.pop(job_id, None)
        self._owners.pop(job_id, None)
        self._full.discard(job_id)
        self._have.pop(job_id, None)
        self._wake(job_id)

    def delete(self, job_id: str, user: str) -> int:
        if job_id in self._files:
            return 0  # still open: the job is not over
        try:
            size = os.stat(self.path(job_id)).st_size
            os.unlink(self.path(job_id))
        except FileNotFoundError:
            return 0
        self._give_back(user, size)
        self._repaired.discard(f"{job_id}.jsonl")
        return size

    def file_sizes(self) -> dict[str, int]:
        """One directory scan."""
        sizes: dict[str, int] = {}
        with os.scandir(self._root) as entries:
            for entry in entries:
                if entry.name.endswith(".jsonl"):
                    try:
                        sizes[entry.name[: -len(".jsonl")]] = entry.stat().st_size
                    except FileNotFoundError:
                        continue
        return sizes

    def reader(self, job_id: str, start: int = 0, follow: bool = True) -> OutputReader:
        path = self.path(job_id)
        self._repair(path)
        return FileOutputReader(path, start, stop_at_current_end=not follow)

    def close_all(self) -> None:
        self._spares.close()
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._sizes.clear()
        self._full.clear()


def _fit(data: str, room: int) -> str:
    """The longest start of `data` whose JSON escapes take at most `room` bytes: blocks
    encoded once each, then a binary search in the block that crosses (a text's bytes
    per character vary from 1 to 12; one crossing record per job pays this)."""
    data = data[: max(room, 0)]  # every character takes at least one byte
    used = 0
    for i in range(0, len(data), 4096):
        block = data[i : i + 4096]
        size = len(_encode(block)) - 2
        if used + size > room:
            lo, hi = 0, len(block)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if used + len(_encode(block[:mid])) - 2 <= room:
                    lo = mid
                else:
                    hi = mid - 1
            return data[: i + lo]
        used += size
    return data


def _ends_with_marker(path: Path, size: int) -> bool:
    """Whether a file's last record is a cap's marker (a master restarted, its file full)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, size - 1024))
            last = f.read(1024).rstrip(b"\n").rpartition(b"\n")[2]
    except FileNotFoundError:
        return False
    return is_marker(last)


def is_marker(line: bytes) -> bool:
    """Whether a stored line (no newline) is a cap's marker record."""
    return (
        line.startswith(b'{"s":"e","d":"')
        and MARKER.encode() in line
        and RUN_TAIL.search(line) is None
    )


def size_text(size: int) -> str:
    """`1 GiB`, `64 KiB`, `1000 bytes`: a size as a person reads it."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"
