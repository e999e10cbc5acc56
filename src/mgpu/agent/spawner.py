"""A small process that starts the shims of jobs that run as another user.

Python's Popen can only vfork when the child keeps the parent's ids: a uid switch makes it
fork the whole agent (tens of MB of page tables copied, then torn down at exec, and the
agent's pages copied on write afterwards), ~4 ms of CPU a job.  So a root agent starts
this process once: it imports nothing but the standard library (run as a file with
`python -I -S`, not through the mgpu package: ~10 MB), and starts each such shim with
Popen itself (its fork is small; the child sets the session, umask, working directory
`/`, groups, gid and uid in C, then execs).

It runs as root with the agent's base environment (`privileged.base_env`): the job's
environment reaches it as data and becomes the environment of the exec'd shim only,
after the uid switch, as with Popen.  It does nothing the agent did not ask for: the ids,
argv, environment and descriptors come from the agent over a private socket pair; it
opens no file and reads no path.  The cgroup join stays with the agent (the shim waits
at its gate as before).

Protocol (one AF_UNIX SOCK_SEQPACKET pair, one JSON object a message):

    agent -> spawner  {"argv", "env", "uid", "gid", "groups", "umask"} with descriptors
                      (SCM_RIGHTS): the child's stdin, stdout, stderr, then 3, 4, ...
    spawner -> agent  {"pid": N}  or  {"error": "os", "errno", "strerror", "filename"}
                      or  {"error": "value", "message"}       (the reply to each request)
                      {"exit": pid, "code": N}   (any time: a shim ended; N as Popen's
                      returncode: -signal when killed)

The spawner reaps its children and reports their ends; it exits when the agent's end of
the socket closes (the agent died or stopped): its shims live on, reparented, and the next
agent adopts them from their run records like any others.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["Spawned", "Spawner", "SpawnerGone"]

MAX_MESSAGE = 64 * 1024
"""A bigger request (a job's argv and environment can reach megabytes) goes in a memfd
sent with it (the message is then b"@"): a socket's message must fit its buffer."""
MAX_FDS = 8


class SpawnerGone(RuntimeError):
    """The spawner process is not there (died, or could not start)."""


# ---- the spawner process ------------------------------------------------------------------


def _recv(sock: socket.socket, block: bool = True) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, anc, _, _ = sock.recvmsg(
        MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize), 0 if block else socket.MSG_DONTWAIT
    )
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


LOW = 64
"""The spawner keeps its own descriptors at or above this: those below are the staging
place of a request's descriptors (3, 4, ... in the child)."""


def spawn(req: dict[str, Any], fds: list[int], children: dict[int, Any]) -> dict[str, Any]:
    """Start one shim as the request says (stdin, stdout, stderr: the first three of
    `fds`, the rest as 3, 4, ...; `fds` are closed); the reply to send."""
    high = [_high(fd) for fd in fds]
    extra = range(3, 3 + max(0, len(high) - 3))
    try:
        if len(high) < 3:
            raise ValueError("stdin, stdout and stderr are needed")
        for fd, number in zip(high[3:], extra, strict=True):
            os.dup2(fd, number, inheritable=False)  # pass_fds makes it the child's
        popen = subprocess.Popen(
            req["argv"],
            stdin=high[0],
            stdout=high[1],
            stderr=high[2],
            pass_fds=tuple(extra),
            env=req["env"],
            cwd="/",
            start_new_session=True,
            umask=req["umask"],
            user=req["uid"],
            group=req["gid"],
            extra_groups=req["groups"],
        )
    except (ValueError, KeyError, TypeError) as e:
        return {"error": "value", "message": str(e)}
    except OSError as e:
        return {"error": "os", "errno": e.errno, "strerror": e.strerror, "filename": e.filename}
    finally:
        for fd in [*high, *extra]:
            os.close(fd)
    children[popen.pid] = popen
    return {"pid": popen.pid}


def _high(fd: int) -> int:
    """`fd` moved to LOW or above (and closed where it was)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, LOW)
    os.close(fd)
    return new


def serve(sock: socket.socket) -> None:
    """The spawner's loop: requests in, replies and ends out, until the agent is gone."""
    sock = socket.socket(fileno=_high(sock.detach()))
    wake_r, wake_w = (_high(fd) for fd in os.pipe())
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # A terminal's ^C or hang-up is for the agent, which ends the spawner by going away;
    # caught rather than ignored, so that the shims it starts do not inherit an ignore.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, lambda *_: None)
    poll = select.poll()  # not a selector: it would hold a descriptor below LOW
    poll.register(sock, select.POLLIN)
    poll.register(wake_r, select.POLLIN)
    children: dict[int, Any] = {}
    try:
        while True:
            for fd, _ in poll.poll():
                if fd == sock.fileno():
                    data, fds = _recv(sock)
                    if not data:
                        return  # the agent closed its end
                    try:
                        if data == b"@" and fds:
                            memfd = fds.pop(0)
                            with open(memfd, "rb") as f:
                                data = f.read()
                        req = json.loads(data)
                    except ValueError as e:
                        for fd in fds:
                            os.close(fd)
                        reply = {"error": "value", "message": f"unreadable request: {e}"}
                    else:
                        reply = spawn(req, fds, children)  # closes fds
                    sock.send(json.dumps(reply).encode())
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 4096):
                            pass
                    _reap(sock, children)
    except OSError:
        pass  # the agent's end is gone


def _reap(sock: socket.socket, children: dict[int, Any]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        popen = children.pop(pid, None)
        if popen is not None:
            popen.returncode = code  # reaped here, not by Popen
        sock.send(json.dumps({"exit": pid, "code": code}).encode())


# ---- the agent's side ---------------------------------------------------------------------


class Spawned:
    """A shim the spawner started: what the launcher needs of a Popen (pid, wait, poll).
    Its end comes from the spawner's report; None when the spawner died before sending
    it (the caller then reads the shim's exit file, as for an adopted run)."""

    def __init__(self, spawner: Spawner, pid: int) -> None:
        self.spawner = spawner
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.spawner.read_reports()
            self.returncode = self.spawner.exits.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The shim's returncode once the spawner reported its end (the caller saw it end:
        the report is on its way), at most `timeout` seconds (None: 1 s)."""
        deadline = time.monotonic() + (1.0 if timeout is None else timeout)
        while self.poll() is None and self.spawner.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.spawner.read_reports(left)
        return self.returncode


class Spawner:
    """The agent's handle on its spawner process, started on first use and again after it
    died.  Synchronous: a request and its reply take well under a millisecond."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        """The spawner's own environment (privileged.base_env: nothing of any job's)."""
        self.exits: dict[int, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None

    def alive(self) -> bool:
        return self._sock is not None

    def start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=self.env,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine

    def stop(self) -> None:
        """Close our end: the spawner exits (its shims live on)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def _gone(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.poll()  # reap it if it ended

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        ids: tuple[int, int, list[int]],
        fds: list[int],
        umask: int,
    ) -> Spawned:
        """Start `argv` (an absolute path first) as `ids` in a new session, in `/`, with
        `fds` as its stdin, stdout, stderr, 3, 4, ... and nothing else open.  Raises what
        Popen would (OSError, ValueError) for the start itself, SpawnerGone if no spawner
        can be reached."""
        if self._sock is None:
            try:
                self.start()
            except OSError as e:
                raise SpawnerGone(f"cannot start the spawner: {e}") from None
        assert self._sock is not None
        uid, gid, groups = ids
        req = {"argv": argv, "env": env, "uid": uid, "gid": gid, "groups": groups}
        req["umask"] = umask
        data = json.dumps(req).encode()
        memfd = -1
        if len(data) > MAX_MESSAGE:
            memfd = os.memfd_create("mgpu-spawn", os.MFD_CLOEXEC)
            with open(memfd, "wb", closefd=False) as f:
                f.write(data)
            os.lseek(memfd, 0, os.SEEK_SET)
            data, fds = b"@", [memfd, *fds]
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        try:
            try:
                self._sock.sendmsg([data], anc)
            finally:
                if memfd >= 0:
                    os.close(memfd)
            while True:
                reply = self._read(10.0)
                if reply is None:
                    raise OSError("no reply")
                if "exit" not in reply:
                    break
        except OSError as e:
            self._gone()
            raise SpawnerGone(f"the spawner is gone ({e})") from None
        if "pid" in reply:
            return Spawned(self, int(reply["pid"]))
        if reply["error"] == "os":
            raise OSError(reply["errno"], reply["strerror"], reply["filename"])
        raise ValueError(reply["message"])

    def fileno(self) -> int:
        return -1 if self._sock is None else self._sock.fileno()

    def read_reports(self, timeout: float = 0.0) -> None:
        """Take in the ends reported so far (waiting up to `timeout` for one)."""
        try:
            while self._sock is not None and self._read(timeout) is not None:
                timeout = 0.0
        except OSError:
            self._gone()

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """One message (an end is filed in `exits`); None if none came in `timeout`."""
        assert self._sock is not None
        if timeout > 0:
            poll = select.poll()
            poll.register(self._sock, select.POLLIN)
            if not poll.poll(timeout * 1000):
                return None
        try:
            data, fds = _recv(self._sock, block=False)
        except BlockingIOError:
            return None
        for fd in fds:
            os.close(fd)
        if not data:
            raise OSError("the spawner closed its end")
        msg: dict[str, Any] = json.loads(data)
        if "exit" in msg:
            self.exits[int(msg["exit"])] = int(msg["code"])
        return msg


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
