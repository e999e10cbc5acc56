"""Fractional jobs under NVIDIA MPS, where the node runs its control daemon.

A job with a share of a GPU (`--gpu-share F`: its grant gives it `MGPU_GPU_SHARE`,
`MGPU_GPU_MEMORY_LIMIT_MB` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, mgpu.agent.grants) is
run as an MPS client when `nvidia-cuda-mps-control -d` runs on the node: its pipe directory
(the agent's `$CUDA_MPS_PIPE_DIRECTORY` where the site names one, else the agent's own,
`<node dir>/mps/pipe`: mgpu.agent.mpsdirs) holds the daemon's `control` FIFO or socket.
The job then gets the daemon's pipe and log directories and
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=NNNM`, so the MPS server caps the memory it may pin on
its GPU (device 0: the only one its `CUDA_VISIBLE_DEVICES` shows it) at its share.  Without a
daemon a shared job runs as any other, and the share is advisory (its variables say it).

Looked up at every launch (a few stats): the daemon may be started or stopped while the
agent runs.

Where the node has `nvidia-cuda-mps-control` and no daemon runs, the agent starts one
(`MpsControl`) when a shared job is launched, and stops it (`quit`) once the shared jobs
are gone; a daemon it did not start (the site's, also one in MPS's default `/tmp/nvidia-mps`
where that is safe) is left alone.  The node says whether shares are enforced: what the
agent achieved, not what it hopes to (`MpsControl.why_not`: no `nvidia-cuda-mps-control`,
its last start failed, its directory refused; in its GPU telemetry, `mgpu nodes`,
`mgpu node --health`); and so does each shared job (`share_held`: the agent's `Started`
says it, and a job whose share is not held gets a line first in its stderr, `note`).
Without MPS nothing holds a shared job to its half.

Limits held by the MPS server, not by the job (issue 25): the variables above are the job's
own environment, and a job may unset them.  So before a shared job's process starts
(`MpsControl.prepare`, in a thread: never on the agent's event loop) the agent makes sure its
user's MPS server runs (`start_server -uid UID`) and sets that server's limits through the
control pipe: `set_active_thread_percentage PID P` and `set_device_pinned_mem_limit PID DEV
NNNM`.  A client's `CUDA_MPS_*` variables can only lower a server's limits, never raise
them.  MPS runs one server per user (uid), and its limits hold for each of the server's
clients (each CUDA process) alike, so a user's server gets the largest grant among that
user's shared jobs (per GPU for memory): the most restrictive limit that still gives every
one of those jobs what it was granted.  A limit changes only the clients created after it;
when a user's last shared job ends, the agent shuts that user's server down (or quits the
daemon it started).  What this does not hold is in docs/SECURITY.md ("GPU shares").

Both directories must be the daemon's: owned by root (or the agent's account), not
writable by group or others, not a symbolic link, and so every directory above them
(`mpsdirs.chain_unsafe`).  MPS's default pipe directory is in `/tmp`, where any user could
make `/tmp/nvidia-mps` with a `control` of their own before the daemon starts: other users'
shared jobs would talk to that user's "MPS server", or, refused, every share ran without
MPS while the node said "enforced".  So the agent's daemon never lives there, a planted one
is ignored (logged; jobs that are not shared are kept off it too), and a directory the site
named that fails is refused with a log line, the node and its shared jobs saying so.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mgpu.agent.mpsdirs import chain_unsafe, listening, make_own, own_dirs, unreachable, unsafe

__all__ = [
    "CONTROL",
    "DEFAULT_LOG_DIR",
    "DEFAULT_PIPE_DIR",
    "UNHELD",
    "MpsControl",
    "Share",
    "device_name",
    "mps_env",
    "pipe_dir",
    "process_uid",
    "share_of",
    "unsafe",
]

log = logging.getLogger("mgpu.agent")

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT = 10.0
"""Seconds `nvidia-cuda-mps-control -d` has to fork its daemon and open its pipe."""
PREPARING = 600.0
"""Seconds a shared job prepared (`MpsControl.prepare`) but not launched yet keeps its
daemon and server limits: a prolog or an image check may come between; a launch that never
comes (cancelled meanwhile) lets them go after that."""
SERVER_WAIT = 2.0
"""Seconds `start_server -uid` has to show its server; one that does not (another user's
server still has clients: MPS runs one at a time) is waited for at the heartbeats."""
UNHELD = (
    "{node} does not hold GPU shares to their limits ({why}): this job's memory and "
    "compute limits are advisory, and a neighbour may take more than its share"
)
"""What a shared job whose share is not held is told (`MpsControl.note`), after `mgpu: `."""
STARTED_MARK = "mps-started"
"""In the agent's node directory while a daemon it started runs, with the shared jobs it
started it for, one id a line: kept over the agent's restarts, so that the next agent stops
it when those jobs (re-adopted) and its own are gone."""


def pipe_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The running MPS control daemon's pipe directory, or None when there is none (or
    it is not safe to use: see `mpsdirs.chain_unsafe`)."""
    env = os.environ if environ is None else environ
    path = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    live, why = _daemon_in(path)
    if why is not None:
        _refuse(f"MPS pipe directory {why}")
        return None
    return path if live else None


def _daemon_in(path: Path) -> tuple[bool, str | None]:
    """Whether a control daemon listens in the directory `path`, and why it may not be used
    (None: it may)."""
    try:
        mode = (path / "control").stat().st_mode
    except OSError:
        return False, None
    # A FIFO in older drivers' daemons; a Unix socket in driver 580's (seen on an H200),
    # which stays on disk when the daemon quits: a socket counts only if it answers.
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False, None
    why = chain_unsafe(str(path))
    if why is not None:
        return True, why
    return not stat.S_ISSOCK(mode) or listening(path / "control"), None


_refused: set[str] = set()


def _refuse(why: str, then: str = "shared jobs run without MPS") -> None:
    """Log why MPS (or a directory of it) is not used, once per reason (not at every
    launch)."""
    if why not in _refused:
        _refused.add(why)
        log.warning("%s: %s", why, then)


def mps_env(job_env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a shared job's environment gets to run under MPS (empty: not shared, or no
    daemon on this node)."""
    if "MGPU_GPU_SHARE" not in job_env:
        return {}
    env = os.environ if environ is None else environ
    pipes = pipe_dir(env)
    if pipes is None:
        return {}
    logs = env.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR
    why = unsafe(logs)
    if why is not None:
        _refuse(f"MPS log directory {why}")
        return {}
    out = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": logs}
    limit = job_env.get("MGPU_GPU_MEMORY_LIMIT_MB")
    if limit and limit.isdigit():
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    return out


@dataclass(frozen=True, slots=True)
class Share:
    """What a shared job was granted, as its user's MPS server is to hold it."""

    uid: int
    device: str
    """The GPU as MPS names it: its UUID where known (CUDA's device ordinals need not be
    NVML's), else its index."""
    percent: int
    """Its share of the GPU's threads, in whole percent, rounded up (1..100)."""
    memory_mb: int | None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def share_of(job_env: Mapping[str, str], uid: int, device: str) -> Share | None:
    """The share a job's variables (grants.share_variables) grant, or None: not shared."""
    try:
        share = float(job_env["MGPU_GPU_SHARE"])
    except (KeyError, ValueError):
        return None
    percent = min(100, max(1, -int(-share * 100 // 1)))  # ceil: never below the grant
    limit = job_env.get("MGPU_GPU_MEMORY_LIMIT_MB", "")
    return Share(uid, device, percent, int(limit) if limit.isdigit() else None)


def device_name(uuid: str | None, index: int) -> str:
    """How the control daemon's commands name a GPU: its UUID (`GPU-...`, `MIG-...`) where
    the node knows it, else its index."""
    return uuid if uuid and uuid.startswith(("GPU-", "MIG-")) else str(index)


def process_uid(pid: int) -> int | None:
    """The real uid of a process (an MPS server's), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class MpsControl:
    """The node's MPS control daemon, started while shared jobs need it.

    `prepare` (before a shared job's process starts, in a thread) starts the daemon where
    none runs and the node has `nvidia-cuda-mps-control`, and limits the job user's server;
    `job_env` and `launched` (at the launch, on the event loop: no command, no lock) give
    the job its MPS variables and mark it running; `settle` (at each heartbeat, in a thread,
    with the running jobs) updates or releases the servers' limits as shared jobs end and
    stops the daemon this agent started once no shared job runs.  `prepare` and `settle`
    take a lock; a job prepared and not launched yet is kept (`PREPARING`), so a launch
    never meets a daemon stopped under it."""

    def __init__(
        self,
        node_dir: Path,
        environ: Mapping[str, str] | None = None,
        which: Callable[..., str | None] = shutil.which,
        owner: Callable[[int], int | None] = process_uid,
    ) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.owner = owner
        """A server's uid from its pid (/proc; tests give their own)."""
        self.shares: dict[str, Share] = {}
        """The shared jobs this agent set server limits for (job id -> what they hold)."""
        self._applied: dict[int, tuple[int, dict[str, int]]] = {}
        """What was set on each server (pid -> thread percentage, device -> MiB)."""
        self._waiting: set[int] = set()
        """Users whose server could not be had yet (tried again at each `settle`)."""
        self._ordinals: dict[str, str] = {}
        """GPU UUIDs -> their indices: what a memory limit is set by when the UUID is not
        taken (the daemon this agent starts numbers GPUs in PCI order, as NVML does)."""
        self.server_wait = SERVER_WAIT
        """Seconds a server just started has to appear in `get_server_list`."""
        self._default_percent = 100
        self._default_memory: dict[str, int] = {}
        """The daemon's defaults as this agent set them (`_defaults`)."""
        self.binary = which(CONTROL, path=self.environ.get("PATH"))
        self.node_dir = node_dir
        self.mark = node_dir / STARTED_MARK
        self.named = bool(self.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
        """The site named the pipe directory (the agent's `$CUDA_MPS_PIPE_DIRECTORY`): the
        daemon is looked for, or started, there; else in the agent's own (mpsdirs)."""
        own_pipes, own_logs = own_dirs(node_dir)
        if not self.named:
            self.environ["CUDA_MPS_PIPE_DIRECTORY"] = str(own_pipes)
        self._own_logs = str(own_logs)
        self.pipes: Path | None = None
        """The pipe directory of the daemon in use, as last looked up (`_daemon`)."""
        self.failure: str | None = None
        """Why the daemon could not be started or used at the last try (None: it could)."""
        self.unheld: dict[str, str] = {}
        """Shared jobs whose share is not held to its limits here, and why (`share_held`)."""
        self.jobs: dict[str, float] = {}
        """Shared jobs launched (their ids -> when, monotonic), dropped as they end."""
        self._lock = threading.Lock()
        try:  # a predecessor's daemon, and its jobs (re-adopted: they run on)
            self.jobs = dict.fromkeys(self.mark.read_text().split(), 0.0)
            self.environ.setdefault("CUDA_MPS_LOG_DIRECTORY", self._log_dir())
        except OSError:
            pass

    def enforced(self) -> bool:
        """Shares are held to their limits here: a daemon runs, or this agent can start one
        (and its last try did not fail)."""
        return self.why_not() is None

    def why_not(self) -> str | None:
        """Why shares are not held to their limits here now; None when they are."""
        if self._daemon() is not None:
            return None
        if self.binary is None:
            return f"no {CONTROL} on this node"
        if self.failure is not None:
            return self.failure
        pipes = self.environ["CUDA_MPS_PIPE_DIRECTORY"]
        why = chain_unsafe(pipes) if os.path.lexists(pipes) else None
        return None if why is None else f"MPS pipe directory {why}"

    def describe(self) -> str:
        """One line for `mgpu node --health`."""
        pipes = self._daemon()
        if pipes is not None:
            return f"enforced: an MPS control daemon runs (pipe {pipes})"
        why = self.why_not()
        if why is None:
            pipes = Path(self.environ["CUDA_MPS_PIPE_DIRECTORY"])
            return f"enforced: {self.binary} is started when shared jobs need it (pipe {pipes})"
        return f"not enforced: {why}, so --gpu-share jobs' memory and compute limits are advisory"

    def share_held(self, job_id: str) -> bool | None:
        """Whether this shared job's share is held to its limits (what `prepare` and
        `job_env` achieved); None: not a shared job of this agent's."""
        if job_id in self.unheld:
            return False
        return True if job_id in self.jobs else None

    def note(self, job_id: str, node_id: str) -> str | None:
        """The line a shared job whose share is not held gets first in its stderr."""
        why = self.unheld.get(job_id)
        return None if why is None else UNHELD.format(node=node_id, why=why)

    def _daemon(self) -> Path | None:
        """The pipe directory of the control daemon shared jobs use: the agent's own (or the
        one the site named); where none runs there and the site named none, a daemon of the
        site's in MPS's default directory, if that is safe.  One another account could have
        made there is refused (logged) and the agent's own daemon used instead."""
        found = pipe_dir(self.environ)
        if found is None and not self.named:
            live, why = _daemon_in(Path(DEFAULT_PIPE_DIR))
            if why is not None:
                _refuse(f"MPS pipe directory {why}", "not used: the agent runs its own daemon")
            elif live:
                found = Path(DEFAULT_PIPE_DIR)
        return found

    def prepare(
        self,
        job_env: Mapping[str, str],
        job_id: str,
        uid: int,
        device: str,
        ordinal: str | None = None,
    ) -> None:
        """Before a shared job's process starts (blocking: run it in a thread): the daemon
        started where it must be, the job's user's MPS server started, and that server's
        limits set to what the user's shared jobs were granted (`Share`).  `ordinal`: the
        GPU's index, for a daemon that does not take `device` (a UUID) in its commands."""
        share = share_of(job_env, uid, device)
        if share is None:
            return
        with self._lock:
            if ordinal is not None and ordinal != device:
                self._ordinals[device] = ordinal
            # Kept by `settle` until it launches (`launched`), as if launched that much later:
            # a heartbeat in between (during a prolog, say) must not stop its daemon.
            self.jobs[job_id] = time.monotonic() + PREPARING
            self.shares[job_id] = share
            self.unheld.pop(job_id, None)  # an earlier run's
            self.pipes = self._daemon()
            if self.pipes is None and self.binary is not None:
                self._start()
            if self.mark.exists():
                self._write_mark()
            if self.pipes is None:
                self.unheld[job_id] = self.why_not() or "no MPS control daemon runs"
                return
            self.failure = None
            why = unreachable(self.pipes, uid)
            if why is not None:  # its clients would not find the daemon: no MPS for them
                self.unheld[job_id] = f"uid {uid} cannot reach {self.pipes} ({why})"
            if self.binary is not None and not self._limit(uid):
                self.unheld.setdefault(job_id, "the MPS control daemon did not take its limits")

    def job_env(self, job_env: Mapping[str, str], job_id: str) -> dict[str, str]:
        """`mps_env` for a job (the daemon was started by `prepare`: nothing blocks here).

        A job that is not shared is kept off a daemon this agent started in MPS's default
        pipe directory (where the site named that), and off one another account planted
        there: CUDA would find either by itself, and under MPS the job would run with its
        user's server's limits, wait for another user's server to go (MPS runs one user's
        server at a time), or talk to the planted one.  Its pipe directory is one with no
        daemon in it, in the agent's own directory (no user can make a `control` there).
        A shared job without MPS is recorded with why (`share_held`, `note`)."""
        if "MGPU_GPU_SHARE" not in job_env:
            ours = self.mark.exists() and str(self._daemon()) == DEFAULT_PIPE_DIR
            if ours or _daemon_in(Path(DEFAULT_PIPE_DIR))[1] is not None:  # or a planted one
                return {"CUDA_MPS_PIPE_DIRECTORY": str(self.node_dir / "no-mps")}
            return {}
        # No lock here: `prepare` may hold it for seconds, and this runs on the event loop.
        self.jobs.setdefault(job_id, time.monotonic())  # prepared: it is there already
        pipes = self._daemon()
        env = {} if pipes is None else mps_env(job_env, self._env(pipes))
        if not env:
            why = self.why_not() if pipes is None else f"MPS log directory {self._log_unsafe()}"
            self.unheld.setdefault(job_id, why or "no MPS control daemon runs")
        return env

    def launched(self, job_id: str) -> None:
        """A shared job's process started: from now on the running jobs `settle` is given
        keep it.  On the event loop: no lock, no command (a `settle` that swaps `jobs`
        meanwhile keeps the preparing deadline instead: the job is kept a while longer)."""
        if job_id in self.jobs:
            self.jobs[job_id] = time.monotonic()

    def settle(self, running: Iterable[str], as_of: float) -> None:
        """Stop the daemon this agent started when none of the shared jobs runs any more.

        `running`: the ids of the agent's running jobs at `as_of` (monotonic); a job
        launched since may not be among them, and is kept."""
        with self._lock:
            live = set(running)
            kept = {j: t for j, t in self.jobs.items() if j in live or t >= as_of}
            changed = kept.keys() != self.jobs.keys()
            self.jobs = kept
            ended = {s.uid for j, s in self.shares.items() if j not in kept}
            self.shares = {j: s for j, s in self.shares.items() if j in kept}
            for job_id in [j for j in list(self.unheld) if j not in kept]:
                self.unheld.pop(job_id, None)  # in place: `job_env` may add one meanwhile
            self.pipes = self._daemon()
            if self.mark.exists():  # this agent's daemon
                if not kept:
                    if self.pipes is None:  # gone already (stopped, or died)
                        self.mark.unlink(missing_ok=True)
                    else:
                        self._stop()
                    self._applied.clear()
                    self._waiting.clear()
                    self._default_percent, self._default_memory = 100, {}
                    return
                if changed:
                    self._write_mark()
                self._reopen()
            if self.binary is None or self.pipes is None:
                return
            for uid in sorted(ended | self._waiting):
                if any(s.uid == uid for s in self.shares.values()):
                    self._limit(uid, start=False)  # a waiting one starts with its clients
                else:
                    self._release(uid)

    # ---- the servers' limits ----------------------------------------------------------

    def _wanted(self, uid: int) -> tuple[int, dict[str, int]]:
        """A user's server's limits: the largest grant among the user's shared jobs (per
        GPU for memory).  MPS holds each client of the server to them alike; less would
        hold a job below its grant, and a client can only lower what the server allows."""
        shares = [s for s in self.shares.values() if s.uid == uid]
        memory: dict[str, int] = {}
        for s in shares:
            if s.memory_mb is not None:
                memory[s.device] = max(memory.get(s.device, 0), s.memory_mb)
        return max((s.percent for s in shares), default=100), memory

    def _limit(self, uid: int, start: bool = True) -> bool:
        """Start `uid`'s server where none runs and set its limits (`_wanted`); False when
        the daemon did not take them (nor, for a server still to come, its defaults)."""
        pid = self._servers().get(uid)
        if pid is None and start:
            self._control(f"start_server -uid {uid}")
            deadline = time.monotonic() + self.server_wait
            pid = self._servers().get(uid)
            while pid is None and time.monotonic() < deadline:
                time.sleep(0.1)  # the daemon may list its new server a moment later
                pid = self._servers().get(uid)
        if pid is None:
            # MPS runs one user's server at a time: another user's may still have clients.
            # Theirs starts when a client of theirs connects, after that one is gone, with
            # the daemon's defaults: those are set to hold it until the agent sees it.
            if uid not in self._waiting:
                log.warning(
                    "no MPS server for uid %d yet (another user's may still run): the "
                    "daemon's defaults hold its shared jobs until it starts",
                    uid,
                )
                self._waiting.add(uid)
                return self._defaults()
            return True
        if uid in self._waiting:
            self._waiting.discard(uid)
            self._defaults()
        percent, memory = self._wanted(uid)
        done_percent, done_memory = self._applied.get(pid, (0, {}))
        took = True
        if percent != done_percent:
            took = self._set(f"set_active_thread_percentage {pid} {percent}")
        for device, mb in sorted(memory.items()):
            if done_memory.get(device) != mb:
                took = self._set_memory(f"set_device_pinned_mem_limit {pid}", device, mb) and took
        if took:  # else set again next time
            self._applied[pid] = (percent, memory)
        return took

    def _set(self, command: str) -> bool:
        """A `set_...` command: it answers nothing when it took (what it says is logged)."""
        answer = self._control(command)
        if answer is None:
            return False
        said = answer.strip()
        if said and not _is_number(said):  # set_active_thread_percentage echoes its value
            log.warning("MPS control %r answered: %s", command, said[:200])
            return False
        return True

    def _set_memory(self, command: str, device: str, mb: int) -> bool:
        """A memory limit by the GPU's UUID, else (not taken: an older daemon) its index."""
        if self._set(f"{command} {device} {mb}M"):
            return True
        return device in self._ordinals and self._set(f"{command} {self._ordinals[device]} {mb}M")

    def _defaults(self) -> bool:
        """The daemon's defaults (what a server starts with) while users wait for theirs: the
        smallest of the waiting users' limits, so that whichever starts first is held to no
        more than its own grant; back to a whole GPU's threads when none waits.  (A memory
        default cannot be taken back: it stays, as small as it was, until the daemon quits;
        every shared job's server is given its own limits anyway.)"""
        holders = {s.uid for s in self.shares.values()}
        wanted = [self._wanted(uid) for uid in sorted(self._waiting & holders)]
        percent = min((p for p, _ in wanted), default=100)
        memory: dict[str, int] = {}
        for _, devices in wanted:
            for device, mb in devices.items():
                memory[device] = min(memory.get(device, mb), mb)
        took = True
        if percent != self._default_percent:
            took = self._set(f"set_default_active_thread_percentage {percent}")
            self._default_percent = percent
        for device, mb in sorted(memory.items()):
            if self._default_memory.get(device) != mb:
                took = self._set_memory("set_default_device_pinned_mem_limit", device, mb) and took
                self._default_memory[device] = mb
        return took

    def _release(self, uid: int) -> None:
        """A user's last shared job ended: their server goes, and its limits with it (the
        next one starts from the daemon's defaults, and is limited again before a shared
        job of theirs starts)."""
        if uid in self._waiting:
            self._waiting.discard(uid)
            self._defaults()
        pid = self._servers().get(uid)
        if pid is not None:
            self._control(f"shutdown_server {pid}")
            self._applied.pop(pid, None)

    def _servers(self) -> dict[int, int]:
        """The daemon's MPS servers: uid -> pid."""
        out = self._control("get_server_list") or ""
        servers: dict[int, int] = {}
        for word in out.split():
            if word.isdigit():
                uid = self.owner(int(word))
                if uid is not None:
                    servers[uid] = int(word)
        return servers

    def _control(self, command: str, timeout: float = START_TIMEOUT) -> str | None:
        """One command through the daemon's control pipe; its answer, None when it failed."""
        try:
            res = subprocess.run(
                [str(self.binary or CONTROL)],
                env=self._env(self.pipes),
                input=f"{command}\n",
                text=True,
                capture_output=True,
                timeout=timeout,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("MPS control %r failed: %s", command, e)
            return None
        return res.stdout

    def _env(self, pipes: Path | None) -> dict[str, str]:
        """The agent's environment for the daemon whose pipe directory is `pipes`."""
        env = dict(self.environ)
        if pipes is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipes)
        return env

    def _fail(self, why: str) -> None:
        """The daemon could not be started or used: the node says so until it can."""
        self.failure = why
        _refuse(why)

    def _dirs(self) -> tuple[str, str] | None:
        """The pipe and log directories of a daemon to start, made where missing (the
        agent's own: `mpsdirs.make_own`); None, and `failure` says why, when one of them is
        not the agent's alone."""
        named = [self.environ["CUDA_MPS_PIPE_DIRECTORY"]] if self.named else []
        if self.environ.get("CUDA_MPS_LOG_DIRECTORY"):
            named.append(self.environ["CUDA_MPS_LOG_DIRECTORY"])
        try:
            if len(named) < 2:  # its own pipe (already in `environ`) or log directory is used
                make_own(self.node_dir, os.geteuid() == 0 and not self.named)
            for path in named:  # the site's: made as MPS would, checked as the agent's own
                os.makedirs(path, mode=0o755, exist_ok=True)
                why = chain_unsafe(path)
                if why is not None:
                    raise OSError(why)
        except OSError as e:
            self._fail(f"MPS directory {e.strerror or e}")
            return None
        return self.environ["CUDA_MPS_PIPE_DIRECTORY"], self._log_dir()

    def _reopen(self) -> None:
        """While this agent's daemon runs, its directories stay reachable for the job users
        (a restarted agent makes its state dir 0700 again at start)."""
        if not self.named and os.geteuid() == 0:
            try:
                make_own(self.node_dir, traversable=True)
            except OSError as e:
                _refuse(f"MPS directory {e.strerror or e}")

    def _log_unsafe(self) -> str | None:
        """Why the log directory shared jobs are given may not be used (see `mps_env`)."""
        return unsafe(self.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)

    def _start(self) -> None:
        dirs = self._dirs()
        if dirs is None:
            return
        pipes, logs = dirs
        env = dict(self.environ, CUDA_MPS_PIPE_DIRECTORY=pipes, CUDA_MPS_LOG_DIRECTORY=logs)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # its ordinals are NVML's indices
        try:
            # Its output to a file, not a pipe: the daemon it forks could hold a pipe open.
            with open(os.path.join(logs, "mgpu-start.log"), "w") as out:
                subprocess.run(
                    [str(self.binary), "-d"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=START_TIMEOUT,
                    check=True,
                )
        except (OSError, subprocess.SubprocessError) as e:
            self._fail(f"{self.binary} -d failed ({e})")
            return
        self.environ.update(CUDA_MPS_PIPE_DIRECTORY=pipes, CUDA_MPS_LOG_DIRECTORY=logs)
        self._write_mark()
        deadline = time.monotonic() + START_TIMEOUT
        while pipe_dir(self.environ) is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the forked daemon opens its control pipe
        self.pipes = pipe_dir(self.environ)
        if self.pipes is None:
            self._fail(f"the MPS control daemon started did not open {pipes}/control")
            return
        self.failure = None
        log.info("started the MPS control daemon for shared jobs (pipe %s)", pipes)

    def _log_dir(self) -> str:
        """Where a daemon this agent starts logs: the agent's `$CUDA_MPS_LOG_DIRECTORY`, else
        its own directory's `log` (mpsdirs)."""
        return self.environ.get("CUDA_MPS_LOG_DIRECTORY") or self._own_logs

    def _write_mark(self) -> None:
        self.mark.write_text("".join(f"{job_id}\n" for job_id in sorted(list(self.jobs))))

    def _stop(self) -> None:
        if self._control("quit") is None:
            log.warning("could not stop the MPS control daemon")
            return
        self.mark.unlink(missing_ok=True)
        log.info("stopped the MPS control daemon: no shared job runs")
