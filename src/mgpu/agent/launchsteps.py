"""Starting one run, as a sequence of named steps (as Nomad's task runner hooks).

`start` runs `STEPS` in order on one `Launching`, the run being started: each step reads
the request and what the steps before it made, and adds its own part (spool files, the
environment, the hostfile, the job script, the cgroups, the terminal, the shim).  What a
step makes it records there, and if any later step fails `Launching.undo` takes all of
it back: a failed launch leaves no file, cgroup or descriptor behind.  A new concern of
a launch is one more step, put where what it needs is ready.

The shim waits at its gate (a pipe) until `admit` has put it in its cgroups; only then
does the job run (see mgpu.agent.launcher for the shim and the gate).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu.agent import (
    accounts,
    cgroups,
    devices,
    jobscript,
    loginbin,
    outputfiles,
    recycle,
    runlimits,
    slurmbin,
)
from mgpu.agent.runrecord import RunRecord
from mgpu.agent.spawn import (
    BOOT_ID,
    PTY_SHIM,
    SHIM,
    JobError,
    LaunchError,
    OwnShim,
    admit,
    close_all,
    process_start_ticks,
    release_all,
    same_ids,
    spawn_own,
    spawn_shim,
    start_shim,
    ticks_to_time,
)
from mgpu.agent.spawner import Spawned, Spawner
from mgpu.agent.terminal import Terminal

__all__ = ["STEPS", "LaunchContext", "LaunchRequest", "Launching", "start"]

UserIds = tuple[int, int, list[int]]
"""uid, gid and supplementary groups a run is started as."""

EXIT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
OUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC

MPI_HOSTFILE_VARS = (
    "MGPU_HOSTFILE",
    "OMPI_MCA_orte_default_hostfile",
    "PRTE_MCA_prte_default_hostfile",
    "HYDRA_HOST_FILE",
)
"""Where mgpu, Open MPI 4, Open MPI 5 and MPICH look for the `--mpi` hostfile."""


@dataclass(frozen=True)
class LaunchRequest:
    """One run of a job to start (mgpu.agent.jobs builds it from the master's Launch)."""

    job_id: str
    epoch: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    """Where it starts (the submit dir); None, or one missing here: its user's home."""
    time_limit: float | None = None
    kill_grace: float = 10.0
    user_ids: UserIds | None = None
    """Whom it runs as; None: the agent's own user."""
    hostfile: str | None = None
    """The `--mpi` hostfile's text."""
    note: str | None = None
    """A line written to its stderr first (said by the agent)."""
    gpu_ids: Collection[int] | None = None
    """The GPUs it was given, the only ones it may open (None: no such rules)."""
    warning: tuple[int, float, bool] | None = None
    """`--signal`: (signal, seconds before the time limit, top process only)."""
    script: tuple[str, str] | None = None
    """(name, text) of a job script, run with `argv` as its arguments."""
    pty: tuple[int, int] | None = None
    """(rows, cols) of a terminal to run it on (its one output stream is stdout)."""
    output: tuple[str, str, bool] | None = None
    """A Slurm batch job's (-o file, -e file, append), written as its user
    (mgpu.agent.outputfiles)."""
    slurm_bin: bool = True
    """Put Slurm's commands first on its PATH (not for a container runtime's own command:
    the job inside has the image's files)."""
    owner: UserIds | None = None
    """The job's own user (None: the agent's).  Not always whom it runs as: a root
    container runtime runs with the agent's ids and keeps the job's uid inside with
    `--user`; then nothing the user names is opened, nor anything they chose run, with the
    run's ids (`check_owner`)."""
    cpus: list[int] | None = None
    """The CPUs it may run on (None: not limited; mgpu.agent.runlimits)."""
    mem_mb: int | None = None
    """The memory it may use, MiB, swap included (None: not limited)."""


@dataclass(frozen=True)
class LaunchContext:
    """What the node gives every launch (mgpu.agent.launcher.Launcher's)."""

    spool: str
    pool: recycle.Pool
    uid: int
    """The agent's effective uid."""
    home: str
    """The agent's own home (runs as the agent's user start there)."""
    containment: cgroups.Containment
    isolation: devices.Isolation
    spawner: Spawner | None
    """Starts the shims of runs as other users: a root agent's."""
    limits: runlimits.Limits = field(default_factory=runlimits.Limits)
    """Where the runs' CPU and memory limits go."""


@dataclass
class Launching:
    """A run being started: the request, and what each step made so far."""

    req: LaunchRequest
    ctx: LaunchContext
    tag: str
    """$MGPU_RUN_TAG: marks this run's processes, even those that leave its process group."""
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    foreign: bool = False
    """Started with other ids than its job's user's (a root container runtime's)."""
    workdir: str = "/"
    output_dir: str = "/"
    """Where a Slurm batch job's wrapper starts it (it enters the directory as the job's
    user, or says so and uses /tmp, as Slurm does)."""
    pool: str = ""
    out_path: str = ""
    err_path: str = ""
    exit_path: str = ""
    fds: list[int] = field(default_factory=list)
    """stdout, stderr and exit files, open for the shim (closed once it has them)."""
    made: list[str] = field(default_factory=list)
    """Files and directories made for the run: removed if the launch fails."""
    hosts: str = ""
    script: str = ""
    cgroup: str | None = None
    guard: str | None = None
    """The cgroup that holds the run's device rules."""
    limited: runlimits.RunLimits = field(default_factory=runlimits.RunLimits)
    """The run's CPU and memory limits: v1 cgroups it joins, where its memory is counted."""
    terminal: Terminal | None = None
    slave: int = -1
    gate: tuple[int, int] | None = None
    popen: subprocess.Popen[bytes] | Spawned | OwnShim | None = None
    pidfd: int | None = None
    ticks: int | None = None

    @property
    def base(self) -> str:
        return f"{self.ctx.spool}/{self.req.job_id}.{self.req.epoch}"

    def close_fds(self) -> None:
        """The descriptors only the shim needs (it has its own copies once started)."""
        close_all([*self.fds, self.slave] if self.slave >= 0 else self.fds)
        self.fds, self.slave = [], -1

    def undo(self) -> None:
        """Take back what the steps made: the launch failed."""
        if self.gate is not None:
            close_all(self.gate)
            self.gate = None
        if self.pidfd is not None:
            close_all([self.pidfd])
            self.pidfd = None
        if self.terminal is not None:
            self.terminal.close()
        release_all([self.cgroup, self.guard, *self.limited.join])
        recycle.unlink_all(self.made)

    def record(self) -> RunRecord:
        """What survives an agent restart of the run just started."""
        req, now, ticks = self.req, time.time(), self.ticks
        assert self.popen is not None
        if ticks is None:
            ticks = process_start_ticks(self.popen.pid)
        rec = RunRecord(
            job_id=req.job_id,
            epoch=req.epoch,
            pid=self.popen.pid,
            create_time=ticks_to_time(ticks) if ticks is not None else 0.0,
            start_ticks=ticks or 0,
            boot_id=BOOT_ID if ticks is not None else "",
            start_time=now,
            out_path=self.out_path,
            err_path=self.err_path,
            exit_path=self.exit_path,
            deadline=(now + req.time_limit) if req.time_limit else None,
            kill_grace=req.kill_grace,
            tag=self.tag,
            cgroup=self.cgroup or "",
            hosts=self.hosts,
            devices=self.guard if self.guard is not None and self.guard != self.cgroup else "",
            limits=list(self.limited.join),
            memory=self.limited.memory,
            script=self.script,
            pty=self.terminal is not None,
            pool=self.pool,
        )
        if req.warning is not None:
            rec.signal, rec.signal_lead, rec.signal_batch = req.warning
        return rec


# ---- the steps ----------------------------------------------------------------------


def check_owner(st: Launching) -> None:
    """A run started with other ids than its job's user's (docker's and rootful podman's
    runs have the agent's): what the user names would be opened, and what they chose run,
    with those ids.  A batch job's -o/-e files and a job script are refused (the master
    refuses both at submit: this holds against an older master, or a forged launch), and
    the shim does not enter the submit dir (`prepare_environment`): the runtime mounts it
    as the job's user entered it (mgpu.agent.site)."""
    req, ctx = st.req, st.ctx
    run_uid = ctx.uid if req.user_ids is None else req.user_ids[0]
    st.foreign = req.owner is not None and req.owner[0] != run_uid
    if not st.foreign:
        return
    if req.output is not None:
        raise JobError(
            "a Slurm batch job cannot run in --image here: its -o/-e files are opened only "
            "as its user, and this node's container runtime runs as the agent"
        )
    if req.script is not None:
        raise JobError(
            "a job script cannot run in --image: it would run outside the container, as "
            "the agent's user, not as its own"
        )


def open_spool_files(st: Launching) -> None:
    """stdout, stderr and the exit file, and the agent's note first in its stderr.  Files
    its processes hold are pool files of its user's only (mgpu.agent.recycle); a root
    agent's runs without ids are root runtimes' containers: removed, not reused."""
    ids, ctx = st.req.user_ids, st.ctx
    st.pool = str(ids[0]) if ids is not None else str(ctx.uid) if ctx.uid else ""
    if st.pool:
        take = ctx.pool.take
        st.out_path, st.err_path, st.exit_path = take(st.pool), take(st.pool), take(f"{st.pool}x")
    else:
        base = st.base  # strings, not Paths: this is a hot path
        st.out_path, st.err_path, st.exit_path = f"{base}.out", f"{base}.err", f"{base}.exit"
    try:
        for path in (st.out_path, st.err_path, st.exit_path):
            # The exit file is not truncated: its first line is blanked (see SHIM).
            st.fds.append(os.open(path, EXIT_FLAGS if path == st.exit_path else OUT_FLAGS, 0o600))
            st.made.append(path)
        os.pwrite(st.fds[2], b"\n", 0)
    except OSError as e:
        raise LaunchError(f"cannot write the spool dir {ctx.spool}: {e.strerror}") from None
    if ids is not None:
        os.fchown(st.fds[2], ids[0], ids[1])  # reopened by the shim as the user
    if st.req.note:
        note_fd = st.fds[1] if st.req.pty is None else st.fds[0]
        lines = st.req.note.splitlines()  # one or more (jobenv.with_note)
        os.write(note_fd, "".join(f"mgpu: {line}\n" for line in lines).encode())


def prepare_environment(st: Launching) -> None:
    """The run's environment and the directory it starts in."""
    req = st.req
    home = st.ctx.home
    if req.user_ids is not None:
        home = accounts.home_of(req.user_ids[0])
    if not os.path.isdir(home):
        home = "/"
    cwd = req.cwd
    if st.foreign:  # a root runtime: the user's directory is the container's (its -w)
        cwd, home = None, "/"
    elif req.output is not None:  # its wrapper enters the directory, as its user
        st.output_dir, cwd = cwd or home, None
    elif cwd and not (os.path.isabs(cwd) and os.path.isdir(cwd)):
        cwd = None  # the submit dir may not exist on this node: run in the user's home
    st.workdir = cwd or home
    st.argv = list(req.argv)
    st.env = dict(req.env)
    if req.user_ids is not None:
        st.env["HOME"] = home
    st.env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    st.env["MGPU_RUN_TAG"] = st.tag
    if "SLURM_JOB_ID" in st.env:  # the uid is the node's to say (mgpu.slurmenv)
        st.env["SLURM_JOB_UID"] = str(st.ctx.uid if req.user_ids is None else req.user_ids[0])
        st.env["SLURM_JOB_GID"] = str(os.getgid() if req.user_ids is None else req.user_ids[1])
    if req.slurm_bin and (slurm := slurmbin.job_path(st.env["PATH"])):  # sbatch, srun...
        st.env["PATH"], st.env["MGPU_SLURM_BIN"] = slurm
        loginbin.install(slurm[1])  # for `#!/bin/bash -l` and `env -i`, which reset PATH


def write_hostfile(st: Launching) -> None:
    """The `--mpi` hostfile: in the spool, or, when mpirun runs as another user (who
    cannot reach the private spool), a fresh private temp file owned by that user,
    written through its descriptor before it changes hands."""
    text, ids = st.req.hostfile, st.req.user_ids
    if text is None:
        return
    try:
        if ids is None:
            path = f"{st.base}.hosts"
            Path(path).write_text(text)
        else:
            fd, path = tempfile.mkstemp(prefix="mgpu-", suffix=".hosts")
            try:
                os.write(fd, text.encode())
                os.fchown(fd, ids[0], ids[1])
            except OSError:
                os.unlink(path)
                raise
            finally:
                os.close(fd)
    except OSError as e:
        raise LaunchError(f"cannot write the job's hostfile: {e.strerror}") from None
    st.hosts = path
    st.made.append(path)
    for var in MPI_HOSTFILE_VARS:
        st.env[var] = path


def write_script(st: Launching) -> None:
    """A job script, written for its user; the run's argv becomes its arguments."""
    script, ids = st.req.script, st.req.user_ids
    if script is None:
        return
    owner = None if ids is None else (ids[0], ids[1])
    try:
        st.script = jobscript.write(st.req.job_id, script[0], script[1], owner)
    except OSError as e:
        raise LaunchError(f"cannot write the job script: {e.strerror}") from None
    st.made += [st.script, os.path.dirname(st.script)]
    st.argv = [*jobscript.interpreter(script[1]), st.script, *st.argv]


def wrap_output(st: Launching) -> None:
    """A Slurm batch job's -o/-e files: a wrapper, run as the job's user, opens them and
    copies the run's output into them as it comes (the root agent opens no user path, and
    `check_owner` refused a run with other ids than its user's)."""
    if st.req.output is None:
        return
    st.argv = outputfiles.wrap(st.argv, st.output_dir, *st.req.output)
    outputfiles.share_spool(st.fds[:2], st.req.user_ids)


def make_cgroups(st: Launching) -> None:
    """The run's cgroup (mgpu.agent.cgroups), the device rules that deny it the GPUs it
    was not given (mgpu.agent.devices), and its CPU and memory limits
    (mgpu.agent.runlimits; one the node has no controller for is told on its stderr)."""
    req, ctx = st.req, st.ctx
    st.cgroup = cgroups.create(ctx.containment, req.job_id, req.epoch)
    if req.gpu_ids is not None:
        try:
            st.guard = devices.apply(ctx.isolation, req.job_id, req.epoch, req.gpu_ids, st.cgroup)
        except devices.IsolationError as e:
            raise LaunchError(f"cannot keep the job to its GPUs: {e}") from None
    try:
        limited = runlimits.apply(
            ctx.limits, req.job_id, req.epoch, req.cpus, req.mem_mb, st.cgroup
        )
    except runlimits.LimitError as e:
        raise LaunchError(str(e)) from None
    st.limited = limited
    if (note := limited.note()) is not None:
        os.write(st.fds[1] if req.pty is None else st.fds[0], f"mgpu: {note}\n".encode())


def open_terminal(st: Launching) -> None:
    """`--pty`: the terminal the shim's stdio is (its output goes to the stdout file)."""
    pty, ids = st.req.pty, st.req.user_ids
    if pty is None:
        return
    owner = None if ids is None else ids[:2]
    try:
        st.terminal, st.slave = Terminal.open(pty[0], pty[1], owner, Path(st.out_path))
    except OSError as e:
        raise LaunchError(f"cannot open a terminal: {e.strerror}") from None


def spawn(st: Launching) -> None:
    """Start the shim: through the spawner as another user (a root agent's), by posix_spawn
    with the agent's own ids, else by Popen.  It waits at its gate when it must first be
    put in cgroups or is not the agent's child."""
    ids, ctx = st.req.user_ids, st.ctx
    switch: dict[str, Any] = {}  # Popen's uid switch
    spawner = None
    if ids is not None and not same_ids(*ids):
        if ctx.spawner is not None:
            spawner = ctx.spawner  # not a fork of the whole agent
        else:
            switch.update(user=ids[0], group=ids[1], extra_groups=ids[2])
    if st.cgroup is not None or st.guard is not None or st.limited.join or spawner is not None:
        st.gate = os.pipe2(os.O_CLOEXEC)
    shim, pty_args = (SHIM, []) if st.terminal is None else (PTY_SHIM, [st.terminal.path])

    def shim_argv(exit_no: int) -> list[str]:  # $0: the exit file's descriptor
        return ["/bin/sh", "-c", shim, str(exit_no), *pty_args, st.workdir, *st.argv]

    out_fd, err_fd, exit_fd = st.fds
    stdio = (out_fd, err_fd) if st.terminal is None else (st.slave, st.slave)
    if spawner is not None and st.gate is not None and ids is not None:
        std = [st.gate[0], *stdio, exit_fd]  # the spawner numbers the exit file 3
        st.popen = spawn_shim(spawner, shim_argv(3), st.env, ids, std, st.tag)
    elif not switch:  # the agent's own ids
        stdin = st.gate[0] if st.gate is not None else None
        st.popen = spawn_own(shim_argv(3), stdin, *stdio, exit_fd, st.env)
    if st.popen is None:
        st.popen = start_shim(
            shim_argv(exit_fd),
            stdin=st.gate[0] if st.gate is not None else subprocess.DEVNULL,
            stdout=stdio[0],
            stderr=stdio[1],
            env=st.env,
            pass_fds=(exit_fd,),
            **switch,
        )
    if isinstance(st.popen, Spawned):
        # Not our child: the spawner reaps it once it ends, and its pid could then be
        # reused.  Held by a pidfd (and its start time read) while it waits at its gate.
        st.pidfd = pidfd_open(st.popen.pid)
        st.ticks = process_start_ticks(st.popen.pid)


def open_gate(st: Launching) -> None:
    """The shim waits at its gate: put it in the run's cgroups, then let it go on, before
    the run is reported started.  (A move into a cgroup v2 waits for an RCU grace period
    unless another move came just before: ~0.5 ms, once per burst of launches.  Done in a
    thread it would leave a window where a stopped or killed agent holds the job at its
    gate, or lets it run outside.)"""
    if st.gate is None:
        return
    assert st.popen is not None
    read_end, write_end = st.gate
    st.gate = None
    os.close(read_end)
    required = [st.guard] if st.guard is not None else []
    if not admit(st.cgroup, [*required, *st.limited.join], st.popen.pid, write_end):
        st.popen.wait()  # killed at its gate: the job never ran
        raise LaunchError("cannot put the job in the cgroups of its GPU, CPU or memory limits")


Step = Callable[[Launching], None]

STEPS: tuple[Step, ...] = (
    check_owner,
    open_spool_files,
    prepare_environment,
    write_hostfile,
    write_script,
    wrap_output,
    make_cgroups,
    open_terminal,
    spawn,
)
"""Up to the shim started, waiting at its gate; then the descriptors only it needs are
closed, and `open_gate` lets it run.  A new step goes before `spawn`: once the shim is
started nothing may fail but its gate (`admit` kills it there, so it never runs)."""


def start(req: LaunchRequest, ctx: LaunchContext, tag: str) -> Launching:
    """Run the steps; all they made is taken back if one fails."""
    st = Launching(req, ctx, tag)
    try:
        try:
            for step in STEPS:
                step(st)
        finally:
            st.close_fds()
        open_gate(st)
    except BaseException:
        st.undo()
        raise
    return st


def pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
