"""Starting, watching and stopping job processes on one node (a run is started by the
steps of mgpu.agent.launchsteps; its record is mgpu.agent.runrecord's).

Each job runs under a tiny `/bin/sh` shim in its own session (process group):

    sh -c 'umask 0022; trap : TERM INT HUP; read -r _; exec </dev/null; cd -- "$1" || ...;
           shift; "$@"; c=$?; echo $c 1<>/proc/self/fd/$0; exit $c' EXIT_FD WORKDIR ARGV...

stdout and stderr go to spool files, not pipes, and the shim writes the exit
status to a file.  So the job neither depends on nor notices the agent: if the
agent is killed and restarted it re-adopts the shim (checked by pid *and*
start time, so a reused pid is never mistaken), keeps tailing the files and
still learns the real exit code.  Exit is noticed through a pidfd, which works
for adopted processes that are not the agent's children too.

Where the machine allows it each run has its own cgroup (mgpu.agent.cgroups), and one
that denies it the GPUs it was not given (mgpu.agent.devices).  The shim's stdin is then
a pipe, the *gate*: the shim waits on it while the agent (as root) moves the shim's pid
into the cgroups, and only then closes it; the shim swaps stdin for /dev/null and runs
the job, so nothing the job starts is ever outside.  (The agent writes the pid itself
rather than handing the job's user a descriptor of a root cgroup file: no user process
ever holds one, and it works on every kernel.)  The shim sets umask 0022, not the
agent's private 0077.  A shim with the agent's own ids is started by posix_spawn
(`spawn.spawn_own`: a vfork without Popen's Python); another user's, by the spawner.

The shim enters the job's working directory itself, as the job's user: a root agent
that did the `chdir` (as Popen's `cwd=` does, before it switches uid) would let a job
start inside a directory its user cannot reach.  One it cannot enter fails the job
(exit code 126, the reason on its stderr).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from mgpu import exits
from mgpu.agent import cgroups, devices, jobsignal, launchsteps, privileged, recycle, runlimits
from mgpu.agent.launchsteps import LaunchRequest
from mgpu.agent.runrecord import RunRecord, RunRecords, same_process
from mgpu.agent.spawn import (
    READ_CHUNK,
    JobError,
    LaunchError,
    OwnShim,
    process_start_time,
    read_exit,
)
from mgpu.agent.spawner import Spawned, Spawner
from mgpu.agent.terminal import Terminal

__all__ = [
    "JobError",
    "LaunchError",
    "LaunchRequest",
    "Launcher",
    "RunRecord",
    "Running",
    "process_start_time",
    "same_process",
]

log = logging.getLogger("mgpu.agent")


@dataclass
class Running:
    rec: RunRecord
    popen: subprocess.Popen[bytes] | Spawned | OwnShim | None = None
    pidfd: int | None = None
    decoders: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    kill_reason: str | None = None
    kill_task: asyncio.Task[None] | None = None
    poll_task: asyncio.Task[None] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    """The time limit's and the warning signal's (re-armed when the limit changes)."""
    terminal: Terminal | None = None
    out_of_memory: bool = False
    """The kernel killed a process of it for its memory limit (mgpu.agent.runlimits)."""
    peak_bytes: int = 0
    """The highest memory use seen (where the kernel keeps no peak of its own)."""
    max_rss_mb: int | None = None
    """Its peak memory, MiB, once it has ended (None: not counted here)."""


MEMORY_POLL = 0.5
"""Seconds between looks at the runs' memory counters (`watch_memory`)."""

READ_MAX = 4 << 20
"""Bytes of one stream read at most per look at a run's spool files."""

OutputSink = Callable[[str, int, str, str, int, int], None]
"""(job_id, epoch, stream "o"/"e", text, start, end): text decodes bytes [start, end)."""


class Launcher:
    def __init__(self, spool: Path, on_output: OutputSink) -> None:
        self.spool = spool
        spool.mkdir(parents=True, exist_ok=True)
        self.on_output = on_output
        self.running: dict[tuple[str, int], Running] = {}
        """Keyed by (job id, epoch): an old run being killed and its successor can overlap."""
        self._trash: list[tuple[str, str | None]] = []
        """Files of ended runs, with the pool each goes back to (None: removed)."""
        self.pool = recycle.Pool(str(spool))
        self.records = RunRecords(spool, self.pool)
        self._uid = os.geteuid()
        self._tag = os.urandom(6).hex()
        """This agent process's part of its runs' tags (with a count: unique per run)."""
        self._runs = 0
        self.containment = cgroups.Containment(cgroups.PROCESS_TREE)
        """How runs are contained (`contain` picks the best the machine allows)."""
        self.isolation = devices.Isolation(devices.NONE)
        """How runs are kept off GPUs they were not given (`isolate` picks it)."""
        self.limits = runlimits.Limits()
        """Where runs' CPU and memory limits go (`limit` picks it)."""
        self.output_room: Callable[[], bool] = lambda: True
        """May more output be read and queued for the master now (mgpu.agent.agent)?"""
        self._pump_turn = 0
        self.on_terminal_output: Callable[[Running], object] = self.pump_output
        """Told when a terminal run wrote something (stored in its stdout file): send it."""
        self._home = os.path.expanduser("~")
        """The agent's own home (runs as the agent's user start there)."""
        self.spawner = Spawner(privileged.base_env()) if self._uid == 0 else None
        """Starts the shims of runs as other users (mgpu.agent.spawner): a root agent's."""

    def contain(self, node_id: str, known: list[RunRecord]) -> cgroups.Containment:
        """Pick the containment method at agent start, and kill and remove the cgroups of
        runs that no run record names any more."""
        self.containment = cgroups.choose(cgroups.agent_key(node_id, self.spool))
        cgroups.sweep(self.containment, {rec.cgroup for rec in known if rec.cgroup})
        return self.containment

    def isolate(self, node_id: str, dev_dir: Path, known: list[RunRecord]) -> devices.Isolation:
        """Pick the GPU isolation method at agent start (after `contain`), and remove the
        device cgroups of runs that no run record names any more."""
        key = cgroups.agent_key(node_id, self.spool)
        self.isolation = devices.choose(key, dev_dir, self.containment)
        devices.sweep(self.isolation, {rec.devices for rec in known if rec.devices})
        return self.isolation

    def limit(self, node_id: str, known: list[RunRecord]) -> runlimits.Limits:
        """Pick where runs' CPU and memory limits go at agent start (after `contain`), and
        remove the v1 limit cgroups of runs that no run record names any more."""
        key = cgroups.agent_key(node_id, self.spool)
        self.limits = runlimits.choose(key, self.containment)
        runlimits.sweep(self.limits, {path for rec in known for path in rec.limits})
        return self.limits

    # ---- persistence --------------------------------------------------------

    def load_previous(self) -> list[RunRecord]:
        """The runs earlier agent processes left (to `adopt`)."""
        return self.records.load()

    # ---- launch -------------------------------------------------------------

    def launch(self, req: LaunchRequest) -> Running:
        """Start a run (mgpu.agent.launchsteps) and watch it."""
        self._runs += 1
        # Unique per run: other runs of the same job (an older epoch being killed here, or
        # another node's part when agents share a machine) must not match.
        tag = f"{req.job_id}.{req.epoch}.{self._tag}{self._runs}"
        context = launchsteps.LaunchContext(
            spool=str(self.spool),
            pool=self.pool,
            uid=self._uid,
            home=self._home,
            containment=self.containment,
            isolation=self.isolation,
            spawner=self.spawner,
            limits=self.limits,
        )
        started = launchsteps.start(req, context, tag)
        rec = started.record()
        self.records.save(rec, new=True)
        run = Running(rec=rec, popen=started.popen, terminal=started.terminal)
        self._track(run, started.pidfd)
        if started.terminal is not None:
            started.terminal.start(lambda: self.on_terminal_output(run))
        return run

    def find(self, job_id: str, epoch: int | None = None) -> Running | None:
        """The run of `job_id` (of that epoch, or the newest)."""
        if epoch is not None:
            return self.running.get((job_id, epoch))
        runs = [r for (j, _), r in self.running.items() if j == job_id]
        return max(runs, key=lambda r: r.rec.epoch) if runs else None

    def adopt(self, rec: RunRecord) -> Running:
        """Take over a job started by an earlier agent process, if it is really still ours."""
        alive = same_process(rec) is True
        run = Running(rec=rec)
        if alive:
            self._track(run)
        else:
            self.running[(rec.job_id, rec.epoch)] = run
            run.exited.set()
        return run

    def _track(self, run: Running, pidfd: int | None = None) -> None:
        self.running[(run.rec.job_id, run.rec.epoch)] = run
        run.pidfd = pidfd if pidfd is not None else launchsteps.pidfd_open(run.rec.pid)
        loop = asyncio.get_running_loop()
        if run.pidfd is not None:
            loop.add_reader(run.pidfd, self._on_exit, run)
        else:  # pragma: no cover - kernels before 5.3
            run.poll_task = loop.create_task(self._poll_exit(run))
        self._arm(run)

    def _arm(self, run: Running) -> None:
        """The timers of the run's deadline: the time limit, and `--signal` before it."""
        for timer in run.timers:
            timer.cancel()
        run.timers.clear()
        if run.rec.deadline is None or run.exited.is_set():
            return
        loop = asyncio.get_running_loop()
        now = time.time()
        run.timers.append(loop.call_later(max(0.0, run.rec.deadline - now), self._time_limit, run))
        if run.rec.signal and not run.rec.signal_sent:
            when = run.rec.deadline - run.rec.signal_lead
            run.timers.append(loop.call_later(max(0.0, when - now), self._warn_once, run))

    def set_time_limit(self, run: Running, time_limit: float | None) -> None:
        """The job's limit changed (mgpu update): counted from the run's start, as before."""
        run.rec.deadline = None if time_limit is None else run.rec.start_time + time_limit
        self.records.save(run.rec)
        self._arm(run)

    def _warn_once(self, run: Running) -> None:
        if not run.rec.signal_sent and not run.exited.is_set() and run.kill_task is None:
            self.warn(run, run.rec.signal, run.rec.signal_batch)

    def warn(self, run: Running, sig: int, top_only: bool) -> None:
        """The job's warning signal (`--signal`), once."""
        run.rec.signal_sent = True
        self.records.save(run.rec)
        self.signal(run, sig, top_only)

    def signal(self, run: Running, sig: int, top_only: bool) -> None:
        """Send `sig` to the job, or to its top process only (mgpu.agent.jobsignal)."""
        tagged = set() if top_only else self._job_processes(run)
        shim = None if self.pid_reused(run) else run.rec.pid
        count = jobsignal.send(shim, run.rec.cgroup, tagged, sig, top_only)
        log.info("job %s: signal %d sent to %d process(es)", run.rec.job_id, sig, count)

    async def _poll_exit(self, run: Running) -> None:
        while psutil.pid_exists(run.rec.pid):
            if run.popen is not None and run.popen.poll() is not None:
                break
            await asyncio.sleep(0.05)
        self._on_exit(run)

    def _on_exit(self, run: Running) -> None:
        if run.pidfd is not None:
            asyncio.get_running_loop().remove_reader(run.pidfd)
            os.close(run.pidfd)
            run.pidfd = None
        run.exited.set()

    # ---- output -------------------------------------------------------------

    def pump_output(self, run: Running) -> bool:
        """Send what the job wrote since last time: at most READ_MAX bytes of each stream,
        and nothing more once `output_room` says enough is queued for the master (a job
        writing as fast as it can must not fill the root agent's memory).  True when all
        of it was sent (up to the files' sizes as they were when called)."""
        caught_up = True
        for stream, path_attr, sent_attr in (
            ("o", "out_path", "out_sent"),
            ("e", "err_path", "err_sent"),
        ):
            path = getattr(run.rec, path_attr)
            sent = getattr(run.rec, sent_attr)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size <= sent:
                continue
            budget = READ_MAX
            with open(path, "rb") as f:
                f.seek(sent)
                while budget > 0 and self.output_room():
                    data = f.read(min(READ_CHUNK, budget))
                    if not data:
                        break
                    budget -= len(data)
                    dec = run.decoders.get(stream)
                    if dec is None:
                        dec = run.decoders[stream] = codecs.getincrementaldecoder("utf-8")(
                            errors="replace"
                        )
                    # Offsets of whole characters: bytes the decoder holds are not sent yet.
                    start = sent - len(dec.getstate()[0])
                    sent += len(data)
                    text = dec.decode(data)
                    if text:
                        end = sent - len(dec.getstate()[0])
                        self.on_output(run.rec.job_id, run.rec.epoch, stream, text, start, end)
            setattr(run.rec, sent_attr, sent)
            caught_up = caught_up and sent >= size
        return caught_up

    def rewind(self, run: Running, stdout: int, stderr: int) -> None:
        """Send output again from these byte offsets (what the master has)."""
        run.rec.out_sent, run.rec.err_sent = stdout, stderr
        run.decoders.clear()

    def pump_all(self) -> None:
        """Send every run's new output; each turn starts with the next run, so that when
        the queue to the master is full the same runs do not always go first."""
        runs = list(self.running.values())
        if runs:
            self._pump_turn = (self._pump_turn + 1) % len(runs)
            for run in runs[self._pump_turn :] + runs[: self._pump_turn]:
                self.pump_output(run)

    # ---- exit ---------------------------------------------------------------

    def exit_code(self, run: Running) -> int | None:
        """The job's exit status, as a shell reports it (a signal's death: 128+N)."""
        return self.ending(run)[0]

    def ending(self, run: Running) -> tuple[int | None, int | None]:
        """The job's exit status (as a shell reports it: a signal's death is 128+N) and
        the signal that killed it, if one did.  Our own child: the shim exits with the
        job's code (or dies of a signal itself).  Adopted after an agent restart: the
        code the shim wrote to its file.  The signal: what the shim wrote there."""
        rc = None if run.popen is None else run.popen.wait()
        if rc is None:  # adopted, or its spawner died before it told
            return read_exit(run.rec.exit_path)
        if rc < 0:
            return exits.shell_code(rc), -rc
        if rc <= 128:
            return rc, None  # an exit: no file to read (the usual end)
        code, signum = read_exit(run.rec.exit_path)
        return rc, signum if code == rc else None

    async def kill_leftovers(self, run: Running, timeout: float = 5.0) -> None:
        """Leftovers die with the job, as in Slurm: its process group, and everything in its
        cgroups (then removed, once empty; its memory counters read first)."""
        if run.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.popen.wait(timeout=1)
        self._killpg(run, signal.SIGKILL)
        self._memory_at_end(run)
        for path in dict.fromkeys((run.rec.cgroup, run.rec.devices, *run.rec.limits)):
            if not path or cgroups.release(path):  # the usual end: nothing left, one rmdir
                continue
            cgroups.kill(path)
            deadline = time.monotonic() + timeout
            while cgroups.populated(path) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)  # SIGKILLed processes take a moment to go
            if not cgroups.release(path):
                log.warning("job %s: cgroup %s still busy, left for now", run.rec.job_id, path)

    # ---- memory -------------------------------------------------------------

    async def watch_memory(self, interval: float = MEMORY_POLL) -> None:
        """Look at the running jobs' memory: the peak where the kernel keeps none, and an
        out-of-memory kill, after which the whole job is killed (cgroup v1 kills one
        process; v2's `memory.oom.group` has the kernel kill all of it already)."""
        while True:
            await asyncio.sleep(interval)
            for run in list(self.running.values()):
                if run.rec.memory and not run.exited.is_set():
                    self._look_at_memory(run)

    def _look_at_memory(self, run: Running) -> runlimits.MemoryUse:
        use = runlimits.memory_use(run.rec.memory)
        run.peak_bytes = max(run.peak_bytes, use.current_bytes or 0)
        if use.oom_kills and not run.out_of_memory:
            run.out_of_memory = True
            log.warning("job %s: out of memory: killed whole", run.rec.job_id)
            cgroups.kill(run.rec.memory)  # v1: no fork can outrun the containment's kill
            self.kill(run, "out of memory", 0.0)
        return use

    def peaks(self) -> list[tuple[str, int, int]]:
        """(job id, epoch, MiB) of each running run's peak memory so far: the kernel's
        (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`), else the highest sampled; a
        few small reads a run, for the heartbeat."""
        out = []
        for run in self.running.values():
            if not run.rec.memory or run.exited.is_set():
                continue
            use = runlimits.memory_use(run.rec.memory)
            peak = max(use.peak_bytes or 0, use.current_bytes or 0, run.peak_bytes)
            if peak:
                out.append((run.rec.job_id, run.rec.epoch, -(-peak // runlimits.MB)))
        return out

    def _memory_at_end(self, run: Running) -> None:
        """How much memory the ended run used, and whether it ran out (the kernel's count;
        where it keeps none, a limit hit and the job killed by SIGKILL)."""
        if not run.rec.memory or not os.path.isdir(run.rec.memory):
            return
        use = self._look_at_memory(run)
        if use.oom_kills is None and use.failcnt and self.exit_code(run) == 128 + signal.SIGKILL:
            run.out_of_memory = True
        peak = max(use.peak_bytes or 0, run.peak_bytes)
        run.max_rss_mb = -(-peak // runlimits.MB) if peak else None

    def finish(self, run: Running) -> None:
        """Forget a job that has ended (leftovers killed) and whose end the master stored."""
        self.running.pop((run.rec.job_id, run.rec.epoch), None)
        if run.terminal is not None:
            run.terminal.close()
        # Emptied into the pool or unlinked later, in a thread: with `discard` mounts that
        # can take milliseconds, which the event loop should not wait for.
        rec = run.rec
        pool = rec.pool or None
        exits = f"{pool}x" if pool else None  # owned by the user: a pool of their own
        self._trash += [(rec.out_path, pool), (rec.err_path, pool), (rec.exit_path, exits)]
        self._trash.append((self.records.path(rec), recycle.RECORDS))
        if rec.hosts:
            self._trash.append((rec.hosts, None))
        if rec.script:
            self._trash += [(rec.script, None), (os.path.dirname(rec.script), None)]

    async def sweep(self, interval: float = 1.0) -> None:
        """Recycle or remove the spool files of finished runs, off the event loop."""
        while True:
            await asyncio.sleep(interval)
            if self._trash:
                batch = self._take_trash()
                self.pool.recycled(await asyncio.to_thread(recycle.recycle, batch))

    def _take_trash(self) -> list[tuple[str, str | None]]:
        """The finished runs' files waiting, each with the pool name it goes to (or None)."""
        batch, self._trash = self.pool.names(self._trash), []
        return batch

    def clean_up_now(self) -> None:
        """The agent is stopping: what ended runs leave outside the spool (job scripts and
        hostfiles in the temp dir) goes now, in this thread, and the spool files waiting for
        the sweep with it (the list is in memory).  A run whose end the master has not
        stored keeps its record and spool files: the next agent sends its end."""
        for run in self.running.values():
            if run.exited.is_set():
                rec = run.rec
                script = [rec.script, os.path.dirname(rec.script)] if rec.script else []
                recycle.unlink_all([rec.hosts, *script] if rec.hosts else script)
        if self._trash:
            self.pool.recycled(recycle.recycle(self._take_trash()))

    # ---- stopping -----------------------------------------------------------

    def _time_limit(self, run: Running) -> None:
        if not run.exited.is_set() and run.kill_task is None:
            run.timed_out = True
            self.kill(run, "time limit", run.rec.kill_grace)

    def kill(
        self,
        run: Running,
        reason: str,
        grace: float,
        warning: tuple[int, float, bool] | None = None,
    ) -> None:
        """SIGTERM, `grace`, SIGKILL; `warning` (signal, seconds, top process only) first,
        and that long for the job to end on its own (a preempted job's --signal)."""
        if run.kill_task is not None or run.exited.is_set():
            return
        run.kill_reason = reason
        run.kill_task = asyncio.get_running_loop().create_task(self._kill(run, grace, warning))

    async def _kill(
        self, run: Running, grace: float, warning: tuple[int, float, bool] | None = None
    ) -> None:
        if warning is not None:
            self.warn(run, warning[0], warning[2])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.exited.wait(), timeout=warning[1])
            if run.exited.is_set():
                return
        targets = self._job_processes(run)
        forks = self._forks_not_yet_execed(targets)
        self._signal(run, targets, signal.SIGTERM)
        ends = asyncio.get_running_loop().time() + grace
        await self._term_when_started(run, forks, ends)
        with contextlib.suppress(TimeoutError):
            left = ends - asyncio.get_running_loop().time()
            await asyncio.wait_for(run.exited.wait(), timeout=max(left, 0.0))
        # Escaped descendants (setsid) may outlive the shim: check them all.
        targets |= self._job_processes(run)
        self._signal(run, targets, signal.SIGKILL)

    @staticmethod
    def _forks_not_yet_execed(procs: set[psutil.Process]) -> dict[psutil.Process, list[str]]:
        """Those of `procs` that are their parent shell forked and not yet what it will
        run (the same command line as the parent), each with that command line: the
        shim's subshell about to exec the job's command, or the -o/-e wrapper's
        (agent/outputfiles.py).  A SIGTERM such a fork gets before it has reset its
        parent's trap is the trap's and is dropped with it: the command it then becomes
        never saw the signal."""
        forks: dict[psutil.Process, list[str]] = {}
        for p in procs:
            with contextlib.suppress(psutil.Error):
                parent = p.parent()
                line = p.cmdline()
                if parent is not None and line and line == parent.cmdline():
                    forks[p] = line
        return forks

    async def _term_when_started(
        self, run: Running, forks: dict[psutil.Process, list[str]], ends: float
    ) -> None:
        """SIGTERM each of `forks` again once it has become another command (a command
        line other than the one noted), until the run exits or `ends` (the grace time's
        end); one that ended or never execs is left alone."""
        loop = asyncio.get_running_loop()
        pause = 0.05
        while forks and not run.exited.is_set() and loop.time() < ends:
            with contextlib.suppress(TimeoutError):
                timeout = min(pause, max(ends - loop.time(), 0.0))
                await asyncio.wait_for(run.exited.wait(), timeout=timeout)
            pause = min(pause * 2, 1.0)
            for p, line in list(forks.items()):
                try:
                    if not p.is_running():
                        del forks[p]
                    elif p.cmdline() != line:
                        del forks[p]
                        p.send_signal(signal.SIGTERM)  # checks it is still that process
                except psutil.Error:
                    forks.pop(p, None)

    def pid_reused(self, run: Running) -> bool:
        """Does the run's pid name another process now?  Once the shim has ended and been
        reaped its pid is free, and a later process (a daemon that made itself a process
        group leader) can get it: that group and its children are not the job's.  A pid
        with no process is not reused: a group with that id can only be the job's (the
        kernel keeps a pid in use while a group of that id lives)."""
        return same_process(run.rec) is False

    def _killpg(self, run: Running, sig: int) -> None:
        """Signal the shim's process group, unless its pid was reused (checked just before:
        the pid of a live process is not reused, so the window is the check's microseconds)."""
        if self.pid_reused(run):
            log.warning(
                "job %s: pid %d is another process now: its group not signalled",
                run.rec.job_id,
                run.rec.pid,
            )
            return
        with contextlib.suppress(OSError):
            os.killpg(run.rec.pid, sig)

    def _signal(self, run: Running, targets: set[psutil.Process], sig: int) -> None:
        self._killpg(run, sig)
        if run.rec.cgroup:
            if sig == signal.SIGKILL:
                cgroups.kill(run.rec.cgroup)
            else:
                cgroups.signal_all(run.rec.cgroup, sig)
        for p in targets:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def _job_processes(self, run: Running) -> set[psutil.Process]:
        """The shim's descendants, plus any process tagged with this run in its environment."""
        found: set[psutil.Process] = set()
        if not self.pid_reused(run):  # else its children are another process's
            with contextlib.suppress(psutil.Error):
                found.update(psutil.Process(run.rec.pid).children(recursive=True))
        tag = (
            f"MGPU_RUN_TAG={run.rec.tag}" if run.rec.tag else f"MGPU_JOB_ID={run.rec.job_id}"
        ).encode()
        me = os.getpid()
        for pid in psutil.pids():
            if pid in (me, run.rec.pid):
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if tag in env.split(b"\0"):
                with contextlib.suppress(psutil.Error):
                    found.add(psutil.Process(pid))
        return found
