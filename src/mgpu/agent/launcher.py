"""Starting, watching and stopping job processes on one node.

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
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from mgpu.agent import (
    accounts,
    cgroups,
    devices,
    jobscript,
    jobsignal,
    outputfiles,
    privileged,
    recycle,
)
from mgpu.agent.spawn import (
    BOOT_ID,
    PTY_SHIM,
    READ_CHUNK,
    SHIM,
    JobError,
    LaunchError,
    OwnShim,
    admit,
    close_all,
    process_start_ticks,
    process_start_time,
    release_all,
    same_ids,
    spawn_own,
    spawn_shim,
    start_shim,
    ticks_to_time,
)
from mgpu.agent.spawner import Spawned, Spawner
from mgpu.agent.terminal import Terminal

__all__ = ["JobError", "LaunchError", "Launcher", "RunRecord", "Running", "process_start_time"]

log = logging.getLogger("mgpu.agent")


@dataclass
class RunRecord:
    """What survives an agent restart, per running job (in running.json)."""

    job_id: str
    epoch: int
    pid: int
    create_time: float
    start_time: float
    out_path: str
    err_path: str
    exit_path: str
    deadline: float | None = None
    kill_grace: float = 10.0
    out_sent: int = 0
    err_sent: int = 0
    tag: str = ""
    """$MGPU_RUN_TAG of this run's processes (empty in records of older agents)."""
    cgroup: str = ""
    """The run's cgroup (empty: none, the process tree is what is killed)."""
    hosts: str = ""
    """The `--mpi` hostfile written for this run, removed with its spool files."""
    devices: str = ""
    """The run's v1 devices cgroup, which denies it the GPUs it was not given (empty: none)."""
    signal: int = 0
    """`--signal`: sent `signal_lead` seconds before `deadline` (0: none), to the top
    process only when `signal_batch`; `signal_sent` once it went."""
    signal_lead: float = 0.0
    signal_batch: bool = False
    signal_sent: bool = False
    script: str = ""
    """The job script written for this run (mgpu.agent.jobscript), removed with it."""
    pty: bool = False
    """Runs on a terminal the agent held (it did not survive an agent restart)."""
    pool: str = ""
    """The pool its stdout, stderr and exit files go back to at its end (its user's uid:
    mgpu.agent.recycle); empty: they are removed."""
    start_ticks: int = 0
    """The shim's start in clock ticks since boot (0 in records of older agents: then
    `create_time` identifies it, which a clock step between two agents moves)."""
    boot_id: str = ""
    """The boot `start_ticks` counts from."""


def same_process(rec: RunRecord) -> bool | None:
    """Is `rec.pid` still the process the record was made for?  None: no such process.
    By start ticks within one boot (a clock step between the agent that launched it and
    this one does not move them); by start time for a record of an older agent."""
    if rec.start_ticks and rec.boot_id and rec.boot_id == BOOT_ID:
        ticks = process_start_ticks(rec.pid)
        return None if ticks is None else ticks == rec.start_ticks
    started = process_start_time(rec.pid)
    return None if started is None else abs(started - rec.create_time) < SAME_START


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


EXIT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
SAME_START = 0.05
"""Seconds two readings of one process's start time may differ by (clock ticks, boot time)."""

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
        self._uid = os.geteuid()
        self._tag = os.urandom(6).hex()
        """This agent process's part of its runs' tags (with a count: unique per run)."""
        self._runs = 0
        self.containment = cgroups.Containment(cgroups.PROCESS_TREE)
        """How runs are contained (`contain` picks the best the machine allows)."""
        self.isolation = devices.Isolation(devices.NONE)
        """How runs are kept off GPUs they were not given (`isolate` picks it)."""
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

    # ---- persistence --------------------------------------------------------

    def _record_path(self, rec: RunRecord) -> str:
        return f"{self.spool}/{rec.job_id}.{rec.epoch}.run"

    def save(self, rec: RunRecord, new: bool = False) -> None:
        """One small file per running job: cheaper than rewriting a shared index.  Written
        in place (a torn record after a crash fails to parse and is skipped; the master
        then treats that job as lost, which is what it was).  A `new` one is written into
        a file of the pool (mgpu.agent.recycle) and then renamed: never emptied, so an old
        record's blocks are not flushed first, and whole once it has its name."""
        path = self._record_path(rec)
        spare = self.pool.spare(recycle.RECORDS) if new else None
        try:
            data = orjson.dumps(vars(rec))  # flat: vars() = asdict(), no copy
        except orjson.JSONEncodeError:  # a path that is not UTF-8 (surrogate escapes)
            data = json.dumps(vars(rec)).encode()
        fd = os.open(spare or path, os.O_WRONLY | os.O_CREAT | (0 if spare else os.O_TRUNC), 0o600)
        try:
            os.write(fd, data)
            if spare:
                os.ftruncate(fd, len(data))  # the rest of what it held before
        finally:
            os.close(fd)
        if spare:
            os.rename(spare, path)

    def load_previous(self) -> list[RunRecord]:
        records = []
        for path in sorted(self.spool.glob("*.run")):
            try:
                records.append(RunRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        self.pool.adopt({p for rec in records for p in (rec.out_path, rec.err_path, rec.exit_path)})
        return records

    # ---- launch -------------------------------------------------------------

    def launch(
        self,
        job_id: str,
        epoch: int,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        time_limit: float | None,
        kill_grace: float,
        user_ids: tuple[int, int, list[int]] | None = None,
        hostfile: str | None = None,
        note: str | None = None,
        gpu_ids: Collection[int] | None = None,
        warning: tuple[int, float, bool] | None = None,
        script: tuple[str, str] | None = None,
        pty: tuple[int, int] | None = None,
        output: tuple[str, str, bool] | None = None,
    ) -> Running:
        """Start a run; `note` is a line written to its stderr first (said by the agent).
        `gpu_ids`: the GPUs it was given, the only ones it may open (None: no such rules).
        `warning`: (signal, seconds, top process only) before the time limit (--signal).
        `script`: (name, text) of a job script, run with `argv` as its arguments.
        `pty`: (rows, cols) of a terminal to run it on (its one output stream is stdout).
        `output`: a Slurm batch job's (-o file, -e file, append) (mgpu.agent.outputfiles)."""
        base = f"{self.spool}/{job_id}.{epoch}"  # strings, not Paths: this is a hot path
        # Files its processes hold are pool files of its user's only (mgpu.agent.recycle).
        # A root agent's runs without ids are root runtimes' containers: removed, not reused.
        pool = str(user_ids[0]) if user_ids is not None else str(self._uid) if self._uid else ""
        if pool:
            take = self.pool.take
            out_path, err_path, exit_path = take(pool), take(pool), take(f"{pool}x")
        else:
            out_path, err_path, exit_path = f"{base}.out", f"{base}.err", f"{base}.exit"
        made: list[str] = []  # removed again if the launch fails
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fds: list[int] = []
        try:
            for path in (out_path, err_path, exit_path):
                # The exit file is not truncated: its first line is blanked (see SHIM).
                fds.append(os.open(path, EXIT_FLAGS if path == exit_path else flags, 0o600))
                made.append(path)
            os.pwrite(fds[2], b"\n", 0)
        except OSError as e:
            close_all(fds)
            recycle.unlink_all(made)
            raise LaunchError(f"cannot write the spool dir {self.spool}: {e.strerror}") from None
        out_fd, err_fd, exit_fd = fds
        cgroup: str | None = None
        guard: str | None = None  # the cgroup that holds the run's device rules
        gate: tuple[int, int] | None = None
        term: Terminal | None = None
        slave = -1
        try:
            if note:
                os.write(err_fd if pty is None else out_fd, f"mgpu: {note}\n".encode())
            home = self._home
            if user_ids is not None:
                uid, gid, _ = user_ids
                home = accounts.home_of(uid)
                os.fchown(exit_fd, uid, gid)  # reopened by the shim as the user
            if not os.path.isdir(home):
                home = "/"
            workdir, cwd = (cwd, None) if output is not None else (None, cwd)  # its wrapper's
            if cwd and not (os.path.isabs(cwd) and os.path.isdir(cwd)):
                cwd = None  # the submit dir may not exist on this node: run in the user's home
            full_env = dict(env)
            if user_ids is not None:
                full_env["HOME"] = home
            full_env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
            if "SLURM_JOB_ID" in full_env:  # the uid is the node's to say (mgpu.slurmenv)
                full_env["SLURM_JOB_UID"] = str(self._uid if user_ids is None else user_ids[0])
            # Marks this run's processes, even those that escape the shim's process group.
            # Unique per run: other runs of the same job (an older epoch being killed here,
            # or another node's part when agents share a machine) must not match.
            self._runs += 1
            tag = f"{job_id}.{epoch}.{self._tag}{self._runs}"
            full_env["MGPU_RUN_TAG"] = tag
            hosts = ""
            if hostfile is not None:
                try:
                    hosts = self._write_hostfile(base, hostfile, user_ids)
                except OSError as e:
                    raise LaunchError(f"cannot write the job's hostfile: {e.strerror}") from None
                made.append(hosts)
                for var in (
                    "MGPU_HOSTFILE",
                    "OMPI_MCA_orte_default_hostfile",
                    "PRTE_MCA_prte_default_hostfile",
                    "HYDRA_HOST_FILE",
                ):
                    full_env[var] = hosts
            script_path = ""
            if script is not None:
                owner = None if user_ids is None else (user_ids[0], user_ids[1])
                try:
                    script_path = jobscript.write(job_id, script[0], script[1], owner)
                except OSError as e:
                    raise LaunchError(f"cannot write the job script: {e.strerror}") from None
                made += [script_path, os.path.dirname(script_path)]
                argv = [*jobscript.interpreter(script[1]), script_path, *argv]
            if output is not None:
                argv = outputfiles.wrap(argv, workdir or home, *output)
                outputfiles.share_spool((out_fd, err_fd), user_ids)
            kwargs: dict[str, Any] = {}
            spawner = None
            if user_ids is not None and not same_ids(*user_ids):
                if self.spawner is not None:
                    spawner = self.spawner  # not a fork of the whole agent
                else:
                    uid, gid, groups = user_ids
                    kwargs.update(user=uid, group=gid, extra_groups=groups)
            cgroup = cgroups.create(self.containment, job_id, epoch)
            if gpu_ids is not None:
                try:
                    guard = devices.apply(self.isolation, job_id, epoch, gpu_ids, cgroup)
                except devices.IsolationError as e:
                    raise LaunchError(f"cannot keep the job to its GPUs: {e}") from None
            if cgroup is not None or guard is not None or spawner is not None:
                gate = os.pipe2(os.O_CLOEXEC)
            shim, pty_args = SHIM, []
            if pty is not None:
                owner = None if user_ids is None else user_ids[:2]
                try:
                    term, slave = Terminal.open(pty[0], pty[1], owner, Path(out_path))
                except OSError as e:
                    raise LaunchError(f"cannot open a terminal: {e.strerror}") from None
                shim, pty_args = PTY_SHIM, [term.path]

            def shim_argv(exit_no: int) -> list[str]:  # $0: the exit file's descriptor
                return ["/bin/sh", "-c", shim, str(exit_no), *pty_args, cwd or home, *argv]

            stdio = (out_fd, err_fd) if term is None else (slave, slave)
            popen: subprocess.Popen[bytes] | Spawned | OwnShim | None = None
            if spawner is not None and gate is not None and user_ids is not None:
                std = [gate[0], *stdio, exit_fd]  # the spawner numbers the exit file 3
                popen = spawn_shim(spawner, shim_argv(3), full_env, user_ids, std, tag)
            elif not kwargs:  # the agent's own ids
                stdin = gate[0] if gate is not None else None
                popen = spawn_own(shim_argv(3), stdin, *stdio, exit_fd, full_env)
            if popen is None:
                popen = start_shim(
                    shim_argv(exit_fd),
                    stdin=gate[0] if gate is not None else subprocess.DEVNULL,
                    stdout=stdio[0],
                    stderr=stdio[1],
                    env=full_env,
                    pass_fds=(exit_fd,),
                    **kwargs,
                )
        except BaseException:
            if gate is not None:
                close_all(gate)
            if term is not None:
                term.close()
            release_all([cgroup, guard])
            recycle.unlink_all(made)
            raise
        finally:
            close_all([*fds, slave] if slave >= 0 else fds)
        pidfd = ticks = None
        if isinstance(popen, Spawned):
            # Not our child: the spawner reaps it once it ends, and its pid could then be
            # reused.  Held by a pidfd (and its start time read) while it waits at its gate.
            pidfd = _pidfd_open(popen.pid)
            ticks = process_start_ticks(popen.pid)
        if gate is not None:
            # The shim waits at its gate: put it in the run's cgroups, then let it go on, before
            # the run is reported started.  (A move into a cgroup v2 waits for an RCU grace
            # period unless another move came just before: ~0.5 ms, once per burst of
            # launches.  Done in a thread it would leave a window where a stopped or killed
            # agent holds the job at its gate, or lets it run outside.)
            os.close(gate[0])
            if not admit(cgroup, guard, popen.pid, gate[1]):
                popen.wait()  # killed at its gate: the job never ran
                close_all([pidfd] if pidfd is not None else [])
                if term is not None:
                    term.close()
                release_all([cgroup, guard])
                recycle.unlink_all(made)
                raise LaunchError("cannot put the job in the cgroup of its GPU device rules")
        now = time.time()
        if ticks is None:
            ticks = process_start_ticks(popen.pid)
        rec = RunRecord(
            job_id=job_id,
            epoch=epoch,
            pid=popen.pid,
            create_time=ticks_to_time(ticks) if ticks is not None else 0.0,
            start_ticks=ticks or 0,
            boot_id=BOOT_ID if ticks is not None else "",
            start_time=now,
            out_path=out_path,
            err_path=err_path,
            exit_path=exit_path,
            deadline=(now + time_limit) if time_limit else None,
            kill_grace=kill_grace,
            tag=tag,
            cgroup=cgroup or "",
            hosts=hosts,
            devices=guard if guard is not None and guard != cgroup else "",
            script=script_path,
            pty=term is not None,
            pool=pool,
        )
        if warning is not None:
            rec.signal, rec.signal_lead, rec.signal_batch = warning
        self.save(rec, new=True)
        run = Running(rec=rec, popen=popen, terminal=term)
        self._track(run, pidfd)
        if term is not None:
            term.start(lambda: self.on_terminal_output(run))
        return run

    def _write_hostfile(
        self, base: str, text: str, user_ids: tuple[int, int, list[int]] | None
    ) -> str:
        """The `--mpi` hostfile: in the spool, or, when mpirun runs as another user (who
        cannot reach the private spool), a fresh private temp file owned by that user,
        written through its descriptor before it changes hands."""
        if user_ids is None:
            path = f"{base}.hosts"
            Path(path).write_text(text)
            return path
        fd, path = tempfile.mkstemp(prefix="mgpu-", suffix=".hosts")
        try:
            os.write(fd, text.encode())
            os.fchown(fd, user_ids[0], user_ids[1])
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return path

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
        run.pidfd = pidfd if pidfd is not None else _pidfd_open(run.rec.pid)
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
        self.save(run.rec)
        self._arm(run)

    def _warn_once(self, run: Running) -> None:
        if not run.rec.signal_sent and not run.exited.is_set() and run.kill_task is None:
            self.warn(run, run.rec.signal, run.rec.signal_batch)

    def warn(self, run: Running, sig: int, top_only: bool) -> None:
        """Send `sig` to the job, or to its top process only (mgpu.agent.jobsignal)."""
        run.rec.signal_sent = True
        self.save(run.rec)
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
        """The job's exit status.  Our own child: the shim exits with the job's code (or
        dies of a signal: 128+N, as a shell reports it).  Adopted after an agent restart:
        the code the shim wrote to its file."""
        if run.popen is not None:
            rc = run.popen.wait()  # None: its spawner died before it told (as if adopted)
            if rc is not None:
                return 128 - rc if rc < 0 else rc
        try:
            with open(run.rec.exit_path, "rb") as f:
                return int(f.readline())  # the rest: what an earlier run left (see SHIM)
        except (OSError, ValueError):
            return None

    async def kill_leftovers(self, run: Running, timeout: float = 5.0) -> None:
        """Leftovers die with the job, as in Slurm: its process group, and everything in its
        cgroup (then removed, once empty)."""
        if run.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.popen.wait(timeout=1)
        self._killpg(run, signal.SIGKILL)
        for path in (run.rec.cgroup, run.rec.devices):
            if not path or cgroups.release(path):  # the usual end: nothing left, one rmdir
                continue
            cgroups.kill(path)
            deadline = time.monotonic() + timeout
            while cgroups.populated(path) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)  # SIGKILLed processes take a moment to go
            if not cgroups.release(path):
                log.warning("job %s: cgroup %s still busy, left for now", run.rec.job_id, path)

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
        self._trash.append((self._record_path(rec), recycle.RECORDS))
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
        self._signal(run, targets, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.exited.wait(), timeout=grace)
        # Escaped descendants (setsid) may outlive the shim: check them all.
        targets |= self._job_processes(run)
        self._signal(run, targets, signal.SIGKILL)

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


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
