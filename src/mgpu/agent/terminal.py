"""A run's pseudo-terminal (`mgpu srun --pty`), made as sshd makes one for `ssh -t`.

The agent opens the pty (`os.openpty`), gives its slave side to the job's user (mode
0620, as login does) at the size of the user's terminal, and starts the shim with the
slave as stdout and stderr.  The shim, a session leader (`setsid`), opens the slave by
its path as its stdin once it is past the cgroup gate: a session leader without a
controlling terminal that opens one gets it as its controlling terminal (Linux), so the
program runs in the pty's foreground process group.  Ctrl-C, Ctrl-Z and Ctrl-\\ travel as
bytes, and the pty's line discipline turns them into SIGINT, SIGTSTP and SIGQUIT for the
foreground process group, as on any terminal; a size change (TIOCSWINSZ) into SIGWINCH.
(`setsid -c`, or TIOCSCTTY in a pre-exec function, would do the same; the shell does it
without running Python code in the forked child of a threaded agent.)

The agent keeps the master side.  What the program writes is read as it comes (an event
loop reader: no polling delay), appended to the run's stdout spool file and sent from
there at once, on the offsets every output uses: so it reaches `mgpu logs` and survives a
lost connection to the master.  Typed bytes and size changes from the master are written
to it; input the program does not read yet waits here (bounded).  What leaves that
buffer (written to the pty, or dropped) is acknowledged to the master (`TerminalAck`, every
TERMINAL_ACK_EVERY bytes), which lets that much more come from the user's client: so a
client that types faster than the program reads is slowed down at its own connection.

A terminal does not outlive its agent: the master side closes with the agent, the kernel
hangs the terminal up (SIGHUP), and a restarted agent kills what is left of the run, as
sshd's sessions end with sshd.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import struct
import termios
import time
from collections.abc import Callable
from pathlib import Path

from mgpu.protocol import TERMINAL_ACK_EVERY

log = logging.getLogger("mgpu.agent")

READ_CHUNK = 64 * 1024
MAX_PENDING_INPUT = 1 << 20
"""Typed bytes kept for a program that does not read them; beyond, input is dropped."""
MAX_DRAIN = 16 << 20
"""Bytes read after the run ended (its last output): a runaway writer cannot hold us."""
TTY_MODE = 0o620
WARN_EVERY = 30.0
"""Seconds between two warnings about dropped input (each says how much since)."""


class DropLog:
    """A warning about dropped input at most every WARN_EVERY seconds, with the count
    since the last one: a flood of input must not flood the node's log too."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.clock = clock
        self.bytes = 0
        self.times = 0
        self._last: float | None = None

    def dropped(self, n: int) -> None:
        self.bytes += n
        self.times += 1
        now = self.clock()
        if self._last is None or now - self._last >= WARN_EVERY:
            log.warning(
                "%s: input not read by its program: %d bytes dropped (%d times) since %s",
                self.what,
                self.bytes,
                self.times,
                "the last warning" if self._last is not None else "it started",
            )
            self._last = now
            self.bytes = self.times = 0


def _winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


class Terminal:
    def __init__(
        self, master: int, path: str, sink: int, keep: Callable[[bytes], object] | None = None
    ) -> None:
        self.master = master
        """The pty's master side (non-blocking), the agent's end."""
        self.path = path
        """The slave's device (/dev/pts/N), which the shim opens as its stdin."""
        self.sink = sink
        """The run's stdout spool file, opened for appending (-1: none, `keep` takes it)."""
        self.keep = keep
        """What takes the program's output when there is no spool file (a pod agent's)."""
        self._pending = bytearray()
        self._reading = False
        self._writing = False
        self._on_data: Callable[[], object] = lambda: None
        self._ack: Callable[[int], object] = lambda n: None
        self._unacked = 0
        """Bytes of input that left `_pending` (written, or dropped) not yet acknowledged."""
        self._drops = DropLog(f"terminal {path}")
        self.closed = False

    @classmethod
    def open(
        cls,
        rows: int,
        cols: int,
        owner: tuple[int, int] | None,
        out: Path | Callable[[bytes], object],
    ) -> tuple[Terminal, int]:
        """A new pty of that size whose slave belongs to `owner` (uid, gid; None: this
        agent's user), its output appended to the file `out` (or given to it, a function);
        returns it and the slave's descriptor (the caller closes it once the shim has
        it)."""
        master, slave = os.openpty()  # non-inheritable; glibc opens the slave O_NOCTTY
        sink = -1
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, _winsize(rows, cols))
            if owner is not None:
                os.fchown(slave, owner[0], -1)  # the group stays the devpts one (tty)
            os.fchmod(slave, TTY_MODE)
            path = os.ttyname(slave)
            if not callable(out):
                sink = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            os.set_blocking(master, False)
        except BaseException:
            for fd in (master, slave, sink):
                if fd >= 0:
                    os.close(fd)
            raise
        return cls(master, path, sink, out if callable(out) else None), slave

    def start(self, on_data: Callable[[], object]) -> None:
        """Read the program's output as it comes; `on_data` after each piece is stored."""
        self._on_data = on_data
        asyncio.get_running_loop().add_reader(self.master, self._readable)
        self._reading = True

    def _readable(self) -> None:
        if self._read_once() is None:
            self._stop_reading()  # every slave descriptor closed: the run is ending
            return
        self._on_data()

    def _read_once(self) -> bytes | None:
        """What the program wrote (b"" if nothing now), stored; None once the pty is done."""
        try:
            data = os.read(self.master, READ_CHUNK)
        except BlockingIOError:
            return b""
        except OSError:  # EIO: no process has the slave open any more
            return None
        if not data:
            return None
        if self.keep is not None:
            self.keep(data)
        else:
            os.write(self.sink, data)
        return data

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self.master)

    def write(self, data: bytes, ack: Callable[[int], object]) -> None:
        """Typed bytes for the program (kept while it does not read them); `ack(n)` is
        called as they leave (written to the pty, or dropped), a few KiB at a time."""
        self._ack = ack
        if self.closed:
            self._consumed(len(data), now=True)
            return
        if len(self._pending) + len(data) > MAX_PENDING_INPUT:
            # Only a master that ignores its window sends this much ahead.
            self._drops.dropped(len(data))
            self._consumed(len(data), now=True)
            return
        self._pending += data
        self._flush()

    def _consumed(self, n: int, now: bool = False) -> None:
        """`n` bytes of input left us: acknowledged once enough have (or `now`)."""
        self._unacked += n
        if self._unacked and (now or self._unacked >= TERMINAL_ACK_EVERY):
            n, self._unacked = self._unacked, 0
            self._ack(n)

    def _flush(self) -> None:
        while self._pending and not self.closed:
            try:
                n = os.write(self.master, self._pending)
            except BlockingIOError:
                break
            except OSError:  # the pty is gone
                n = len(self._pending)
                self._pending.clear()
                self._consumed(n, now=True)
                break
            del self._pending[:n]
            self._consumed(n)
        want = bool(self._pending) and not self.closed
        if want != self._writing:
            loop = asyncio.get_running_loop()
            if want:
                loop.add_writer(self.master, self._flush)
            else:
                loop.remove_writer(self.master)
            self._writing = want

    def resize(self, rows: int, cols: int) -> None:
        """Set the size: the kernel sends SIGWINCH to the foreground process group."""
        if not self.closed:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.master, termios.TIOCSWINSZ, _winsize(rows, cols))

    def drain(self) -> None:
        """The run has ended: store what the program wrote last (never blocks)."""
        if self.closed:
            return
        total = 0
        while total < MAX_DRAIN:
            data = self._read_once()
            if not data:
                break
            total += len(data)

    def close(self) -> None:
        if self.closed:
            return
        self._stop_reading()
        if self._writing:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_writer(self.master)
            self._writing = False
        self.closed = True
        dropped, self._pending = len(self._pending), bytearray()
        self._consumed(dropped, now=True)  # the master's window must not wait for it
        for fd in (self.master, self.sink):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
