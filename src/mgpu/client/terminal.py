"""`mgpu srun --pty`: the user's terminal joined to a pty on the node, as `ssh -t` does.

One loop (`select`) over the run's attach WebSocket (master/http/attach.py), the terminal
and a self-pipe for signals.  While the job waits in the queue the terminal stays as it
is (Ctrl-C cancels the job, as srun's does, and the wait is shown on one status line);
once its program runs the terminal goes raw: every key travels as bytes (Ctrl-C, Ctrl-Z
and Ctrl-\\ too: the node's pty makes them signals for the program), the program's output
is written as it comes, and a size change (SIGWINCH) is sent on.  The terminal is put back
as it was however this ends: the program's end, an error, a signal, the master gone.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import time
import tty

from mgpu.client import jsonlite as json
from mgpu.client.api import Client, MgpuError, RequestError
from mgpu.client.stream import StatusLine, _exit_code

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RECONNECT_TRIES = 8
"""Attempts to attach again after the connection to the master broke (about 15 s)."""


class _Hangup(Exception):
    """SIGHUP or SIGTERM: the user's terminal or session is going away."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def terminal_size(fd: int) -> list[int] | None:
    """[rows, columns] of the terminal on `fd`, or None."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return [size.lines, size.columns] if size.lines and size.columns else None


class TerminalSession:
    """The loop of one terminal run (a job, or a step of an allocation)."""

    def __init__(self, client: Client, run_id: str, step: bool, verbose: bool = False) -> None:
        self.client = client
        self.run_id = run_id
        self.step = step
        self.fd = sys.stdin.fileno()
        self.out = sys.stdout.buffer
        self.status = StatusLine(sys.stderr.isatty(), verbose)
        self.saved = termios.tcgetattr(self.fd)
        self.raw = False
        self.started = False
        self.seen = 0
        """Output records written so far: a reconnect asks for those after them."""
        self.heartbeat = 5.0

    # ---- the terminal -----------------------------------------------------------

    def _go_raw(self) -> None:
        if not self.raw:
            tty.setraw(self.fd, termios.TCSADRAIN)  # TCSADRAIN: keys typed ahead are kept
            self.raw = True

    def restore(self) -> None:
        if self.raw:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.raw = False

    def _say(self, text: str) -> None:
        """A line of our own on stderr, in raw mode too."""
        sys.stderr.write(("\r\n" if self.raw else "\n") + text + ("\r\n" if self.raw else "\n"))
        sys.stderr.flush()

    # ---- the loop ---------------------------------------------------------------

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        old = {s: signal.getsignal(s) for s in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP)}

        def hangup(signum: int, frame: Any) -> None:
            raise _Hangup(signum)

        signal.signal(signal.SIGWINCH, lambda signum, frame: None)  # the wakeup fd tells
        signal.signal(signal.SIGTERM, hangup)
        signal.signal(signal.SIGHUP, hangup)
        try:
            return self._attached(wake_r)
        except (KeyboardInterrupt, _Hangup) as e:
            self.restore()
            self.status.clear()
            self._cancel()
            return 130 if isinstance(e, KeyboardInterrupt) else 128 + e.signum
        finally:
            self.restore()
            self.status.clear()
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in old.items():
                signal.signal(signum, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _cancel(self) -> None:
        what = "step" if self.step else "job"
        try:
            if self.step:
                self.client.cancel_step(self.run_id)
            else:
                self.client.cancel(self.run_id)
            print(f"mgpu: cancelled {what} {self.run_id}", file=sys.stderr)
        except MgpuError:
            print(f"mgpu: could not cancel {what} {self.run_id}", file=sys.stderr)

    def _attached(self, wake: int) -> int:
        tries = 0
        while True:
            try:
                ws = self.client.attach(self.run_id, since=self.seen)
            except RequestError:
                raise
            except MgpuError as e:
                tries += 1
                if tries > RECONNECT_TRIES:
                    raise MgpuError(f"{e} (the {self._what()} may still be running)") from None
                time.sleep(min(2.0, 0.1 * 2**tries))
                continue
            if tries and self.started:
                # Keys in flight when the link broke may not have reached the program.
                self._say("mgpu: reconnected; keys typed while it was lost: type them again")
            began = time.monotonic()
            try:
                code = self._converse(ws, wake)
            finally:
                ws.close()
            if code is not None:
                return code
            if time.monotonic() - began > 10.0:
                tries = 0  # a session that went on a while: a new failover, a new count
            if tries == 0:
                self._say("mgpu: lost the connection to the master; trying again")
            tries += 1

    def _what(self) -> str:
        return f"{'step' if self.step else 'job'} {self.run_id}"

    def _converse(self, ws: Any, wake: int) -> int | None:
        """Until the run ends (its exit code) or the connection does (None)."""
        try:
            return self._loop(ws, wake)
        except OSError:  # the connection broke (a read or a write on it failed)
            return None

    def _loop(self, ws: Any, wake: int) -> int | None:
        last_sent = time.monotonic()
        if self.started:  # again, after a reconnect: the size may have changed meanwhile
            self._send_size(ws)
        while True:
            watch = [ws, wake] + ([self.fd] if self.started else [])
            wait = max(0.0, last_sent + self.heartbeat / 2 - time.monotonic())
            ready, _, _ = select.select(watch, [], [], 0.0 if ws.buffered() else wait)
            if time.monotonic() - last_sent >= self.heartbeat / 2:
                ws.send_text('{"hb":1}')
                last_sent = time.monotonic()
            if wake in ready:
                signals = os.read(wake, 256)
                if self.started and bytes([signal.SIGWINCH]) in signals:
                    self._send_size(ws)
            if self.fd in ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:  # the terminal is gone (a raw terminal has no end of file)
                    raise _Hangup(signal.SIGHUP)
                ws.send_binary(data)
                last_sent = time.monotonic()
            if ws in ready or ws.buffered():
                for _, payload in ws.feed():
                    for line in payload.split(b"\n"):
                        if line.strip():
                            code = self._record(json.loads(line), ws)
                            if code is not None:
                                return code
                if ws.closed:
                    return None

    def _send_size(self, ws: Any) -> None:
        size = terminal_size(self.fd)
        if size is not None:
            ws.send_text(json.dumps({"resize": size}))

    def _record(self, rec: dict[str, Any], ws: Any) -> int | None:
        if "d" in rec:
            self.seen += 1
            self.status.clear()
            self.out.write(str(rec["d"]).encode("utf-8", "replace"))
            self.out.flush()
        elif "attached" in rec:
            self.heartbeat = float(rec.get("heartbeat") or 5.0)
        elif rec.get("started"):
            if not self.started:
                self.started = True
                self.status.clear()
                self._go_raw()
                self._send_size(ws)
        elif "status" in rec:
            if not self.started:
                self.status.update(self.run_id, rec)
        elif rec.get("end"):
            self.restore()
            self.status.clear()
            if not self.step:
                return _exit_code(rec, self.run_id)
            if rec.get("error"):
                print(f"mgpu: step {self.run_id}: {rec['error']}", file=sys.stderr)
            code = rec.get("exit_code")
            return code if isinstance(code, int) and 0 <= code < 256 else 255
        return None


def run_terminal(client: Client, run_id: str, step: bool = False, verbose: bool = False) -> int:
    """Join this terminal to the run's pty until the run ends; its exit code."""
    return TerminalSession(client, run_id, step, verbose).run()
