"""The agent's site integration: prolog and epilog scripts, and container jobs.

The master sends the cluster's `site:` settings (prolog, epilog, their time limits) and
the job's `--image` in each `Launch`, so one config file governs every node.

* Before a job that has a prolog or an image, the agent prepares it asynchronously (the
  agent keeps serving other jobs meanwhile): it checks the image is on this node (a
  missing image fails the job at once, before any GPU time), then runs the prolog.  A
  prolog that fails or runs out of time is a node failure: the job goes back to the
  queue without spending one of its retries and the node's failure count grows (drained
  at `scheduling.node_failure_threshold`, the reason naming the prolog's first line).
* After every job the epilog runs (also after a restart of the agent, if it had not yet).
  Its output is appended to the job's stderr as `[epilog] ` lines, so it is kept with the
  job (`mgpu logs`).  An epilog that fails drains the node (as Slurm does); the job's own
  result stands.

The scripts run as the agent's user (root on a real node), like Slurm's, with the fixed
base environment of mgpu.agent.privileged (a standard PATH, the agent's HOME) plus the
variables the scheduler sets for the job (`MGPU_*`, `CUDA_VISIBLE_DEVICES`, the torchrun
variables), `MGPU_JOB_USER` and `MGPU_SCRIPT_CONTEXT=prolog|epilog`, and the epilog also
`MGPU_JOB_EXIT_CODE`.  Variables the user submitted are *not* passed: a root script must
not run with a user's `LD_PRELOAD` or `PATH`.  What the epilog needs after an agent
restart (its command, time limit and environment, and later its result) is kept next to
the run's spool files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mgpu import execspec
from mgpu.agent import bindmount, containers, jobenv, privileged, userenv, usermounts
from mgpu.agent.gpus import GpuInfo
from mgpu.agent.launcher import JobError, Launcher, LaunchError, LaunchRequest, Running
from mgpu.agent.launchsteps import UserIds
from mgpu.agent.privileged import script_env
from mgpu.protocol import Exited, Launch, RunningReport
from mgpu.spec import SpecError

log = logging.getLogger("mgpu.agent")

SCRIPT_OUTPUT_MAX = 64 * 1024
"""Bytes of a prolog's / epilog's output kept (the end of it)."""
IMAGE_CHECK_TIMEOUT = 60.0


@dataclass(slots=True)
class ScriptResult:
    ok: bool
    output: str
    error: str | None
    """Why it failed, one line ("exit code 3: <first line>", "timed out after 30 s")."""


async def run_script(
    path: str, env: dict[str, str], timeout: float, cwd: str = "/"
) -> ScriptResult:
    """Run a site script (executed directly, as Slurm does) with a time limit, as the
    agent: `env` goes over the privileged base (see `script_env`)."""
    try:
        proc = await privileged.start(
            [path], env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd
        )
    except OSError as e:
        return ScriptResult(False, "", f"cannot run {path}: {e.strerror or e}")
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError) as e:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if isinstance(e, asyncio.CancelledError):
            raise
        return ScriptResult(False, "", f"timed out after {timeout:g} s")
    text = out[-SCRIPT_OUTPUT_MAX:].decode(errors="replace")
    if proc.returncode == 0:
        return ScriptResult(True, text, None)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    code = proc.returncode
    why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return ScriptResult(False, text, first or why)


@dataclass(slots=True)
class Pending:
    """A job being prepared (image check, prolog) before its process starts."""

    msg: Launch
    task: asyncio.Task[None] | None = None
    cancelled: str | None = None
    setup: Callable[[], None] | None = None
    """Blocking work before the job's process starts, run in a thread (a shared job's MPS
    server limits: JobHost.share_setup)."""


class JobHost(Protocol):
    """What the site hooks need of the agent (mgpu.agent.agent.Agent implements it)."""

    def report_exit(self, msg: Exited) -> None:
        """Tell the master a run ended (or never started), again after reconnects."""

    def job_env(self, msg: Launch) -> dict[str, str]:
        """The environment the agent gives the job of `msg`."""

    def launch(self, msg: Launch) -> None:
        """Start the job of a launch that is now prepared."""

    def run_as(self, msg: Launch) -> tuple[int, int, list[int]] | None:
        """uid, gid and groups the job of `msg` runs as (None: the agent's own); raises
        (a RuntimeError) when it may not run here."""

    def share_setup(self, msg: Launch) -> Callable[[], None] | None:
        """What must be done (blocking) before a shared job's process starts, or None."""


class SiteHooks:
    def __init__(
        self, host: JobHost, launcher: Launcher, node_id: str, runtime_choice: str = "auto"
    ) -> None:
        self.host = host
        self.launcher = launcher
        self.node_id = node_id
        self.runtime_choice = runtime_choice
        self.runtime: containers.Runtime | None = None
        self.pending: dict[tuple[str, int], Pending] = {}
        self._pinned: dict[
            tuple[str, int], tuple[str | None, list[usermounts.Bind]] | JobError | LaunchError
        ] = {}
        """Container working directories and mounts pinned while their launch was prepared
        (off the event loop): the mount points, or why they could not be (taken by `wrap`)."""
        self._plain: set[tuple[str, int]] = set()
        """Runs this agent process started with no side files (no epilog, no container):
        their end needs no look at the spool (most runs; adopted ones are not here)."""
        self._notes: dict[tuple[str, int], str] = {}
        """What preparing a run has to say on its stderr (a login environment not had)."""

    # ---- start-up -------------------------------------------------------------

    async def probe(self) -> None:
        self.runtime = await asyncio.to_thread(containers.probe, self.runtime_choice)
        if self.runtime is not None:
            log.info("container runtime: %s (%s)", self.runtime.name, self.runtime.version)
        elif self.runtime_choice not in ("auto", "none"):
            log.warning("container runtime %s does not work here: none used", self.runtime_choice)

    def features(self) -> list[str]:
        return containers.features(self.runtime)

    # ---- before a job ---------------------------------------------------------

    def prepare(self, msg: Launch) -> bool:
        """Take over a launch that needs preparing (True), or leave it to the agent."""
        key = (msg.job_id, msg.epoch)
        if key in self.pending or self.launcher.find(*key) is not None:
            return True  # a duplicate of a launch being prepared or done
        setup = self.host.share_setup(msg)
        if not (msg.image or msg.prolog or setup is not None or userenv.wanted(msg)):
            return False
        for job_id, epoch in list(self.pending):
            if job_id == msg.job_id and epoch != msg.epoch:
                self.cancel(job_id, epoch, "superseded")
        pending = self.pending[key] = Pending(msg, setup=setup)
        pending.task = asyncio.get_running_loop().create_task(self._prepare(pending))
        pending.task.add_done_callback(lambda task: self._prepared(pending, task))
        return True

    def _prepared(self, pending: Pending, task: asyncio.Task[None]) -> None:
        """A task cancelled before it ran never saw its CancelledError: end it here."""
        if task.cancelled():
            self.pending.pop((pending.msg.job_id, pending.msg.epoch), None)
            self._cancelled(pending)
        elif task.exception() is not None:
            log.error("preparing job %s failed: %r", pending.msg.job_id, task.exception())
            key = (pending.msg.job_id, pending.msg.epoch)
            self.pending.pop(key, None)
            if self.launcher.find(*key) is None:  # as Agent._handle: what `wrap` made goes
                self.discard(*key)
            self._exit(pending.msg, f"the agent failed to prepare the job: {task.exception()}")

    def _exit(self, msg: Launch, error: str, fatal: bool = False, free: bool = False) -> None:
        log.error("job %s: %s", msg.job_id, error)
        self.host.report_exit(
            Exited(
                job_id=msg.job_id,
                epoch=msg.epoch,
                exit_code=None,
                time=time.time(),
                launch_error=error,
                fatal=fatal,
                requeue_free=free,
            )
        )

    async def _prepare(self, pending: Pending) -> None:
        msg = pending.msg
        key = (msg.job_id, msg.epoch)
        try:
            if pending.setup is not None:  # off the event loop: MPS control may take seconds
                await asyncio.to_thread(pending.setup)
            if msg.image and not await self._check_image(msg):
                return
            if msg.image:
                await self._pin_ahead(msg)
            if msg.prolog:
                env = script_env(self.host.job_env(msg), msg.user, "prolog")
                res = await run_script(msg.prolog, env, msg.prolog_timeout)
                if not res.ok:
                    self._exit(msg, f"prolog failed: {res.error}", free=True)
                    return
            if userenv.wanted(msg):  # sbatch --export=NONE: as Slurm's --get-user-env
                note = await userenv.load(msg)
                if note:
                    self._notes[key] = note
        except asyncio.CancelledError:
            self._cancelled(pending)
            return
        finally:
            self.pending.pop(key, None)
        if pending.cancelled is not None:
            self._cancelled(pending)
            return
        self.host.launch(msg)

    async def _pin_ahead(self, msg: Launch) -> None:
        """Pin a container job's working directory and the paths it mounts now, in a
        thread: entering them as its user can take up to `enter_dir`'s timeout (a hung NFS
        server, a user's FUSE mount), which the agent's event loop must not wait for.
        `wrap` takes the result."""
        rt = self.runtime
        cwd = _container_cwd(msg)
        if cwd is not None and ":" in cwd:
            cwd = None  # refused by `wrap`
        if rt is None or not containers.runs_as_agent(rt):
            return
        try:
            ids = self.host.run_as(msg)
        except RuntimeError:
            return  # the launch finds it again and says why
        if ids is None or (cwd is None and msg.container is None):
            return
        key = (msg.job_id, msg.epoch)
        pin = asyncio.ensure_future(asyncio.to_thread(self._pin_all, msg, cwd, ids))
        try:
            self._pinned[key] = await asyncio.shield(pin)
        except (JobError, LaunchError) as e:
            self._pinned[key] = e
        except asyncio.CancelledError:  # the thread goes on: its mounts go when made
            pin.add_done_callback(lambda _: self.discard(*key))
            raise

    def _pin_all(
        self, msg: Launch, cwd: str | None, ids: tuple[int, int, list[int]]
    ) -> tuple[str | None, list[usermounts.Bind]]:
        """The working directory's mount point and the pinned binds (usermounts)."""
        source = self._pin_cwd(msg.job_id, msg.epoch, cwd, ids) if cwd else None
        binds = usermounts.binds_of(msg.container, ids[0])
        try:
            pinned = usermounts.pin_all(str(self.launcher.spool), msg.job_id, msg.epoch, binds, ids)
        except (JobError, LaunchError):
            bindmount.release(self._mount_path(msg.job_id, msg.epoch))
            raise
        return source, pinned

    async def _check_image(self, msg: Launch) -> bool:
        assert msg.image is not None
        rt = self.runtime
        node = self.node_id
        if rt is None:
            self._exit(msg, f"{node} has no container runtime for --image")
            return False
        try:
            _image_of(msg)
        except JobError as e:
            self._exit(msg, str(e), fatal=True)
            return False
        if containers.is_image_file(msg.image) and not containers.runs_files(rt):
            self._exit(
                msg,
                f"{node}'s container runtime ({rt.name}) cannot run the image file "
                f"{msg.image}: only apptainer runs SIF or squashfs files; give an image name",
                fatal=True,
            )
            return False
        try:
            present = await containers.image_present(rt, msg.image, IMAGE_CHECK_TIMEOUT)
        except containers.ImageCheckError as e:
            self._exit(msg, str(e))  # the runtime is broken here: a node failure
            return False
        if not present:
            self._exit(msg, f"image {msg.image} not found on {node} ({rt.name})", fatal=True)
            return False
        return True

    def _cancelled(self, pending: Pending) -> None:
        """A launch killed while being prepared ends as a job killed at once would."""
        msg = pending.msg
        log.info("job %s: %s before it started", msg.job_id, pending.cancelled or "killed")
        self.host.report_exit(
            Exited(job_id=msg.job_id, epoch=msg.epoch, exit_code=128 + 15, time=time.time())
        )

    def cancel(self, job_id: str, epoch: int | None, reason: str) -> bool:
        """Kill a launch still being prepared; False if there is none."""
        found = False
        for (jid, ep), pending in list(self.pending.items()):
            if jid == job_id and (epoch is None or ep == epoch):
                found = True
                pending.cancelled = reason
                if pending.task is not None:
                    pending.task.cancel()
        return found

    def pending_reports(self) -> list[RunningReport]:
        """Launches being prepared count as running (the master expects them here)."""
        return [RunningReport(job_id=j, epoch=e) for (j, e) in self.pending]

    # ---- the job's process ----------------------------------------------------

    def _side_path(self, job_id: str, epoch: int) -> Path:
        return self.launcher.spool / f"{job_id}.{epoch}.site.json"

    def _env_path(self, job_id: str, epoch: int) -> Path:
        return self.launcher.spool / f"{job_id}.{epoch}.env"

    def _mount_path(self, job_id: str, epoch: int) -> str:
        return f"{self.launcher.spool}/{job_id}.{epoch}{bindmount.SUFFIX}"

    def _pin_cwd(self, job_id: str, epoch: int, cwd: str, ids: tuple[int, int, list[int]]) -> str:
        """Mount the directory `cwd` as the job's user enters it on a mount point of the
        private spool (mgpu.agent.bindmount); its path."""
        fd = privileged.enter_dir(cwd, ids)
        if fd is None:
            raise JobError(f"cannot enter the working directory {cwd}")
        target = self._mount_path(job_id, epoch)
        try:
            bindmount.bind(fd, target)
        except OSError as e:
            raise LaunchError(f"cannot mount the working directory: {e.strerror}") from None
        finally:
            os.close(fd)
        return target

    def sweep(self, runs: Collection[tuple[str, int]]) -> None:
        """At agent start: unmount the working directories of runs without a record (an
        agent that died between mounting and saving the record); the others go at their
        end, as usual."""
        keep = {f"{job_id}.{epoch}" for job_id, epoch in runs}
        for name in bindmount.sweep(str(self.launcher.spool), keep):
            log.info("unmounted a leftover working directory %s", name)

    def request(
        self, msg: Launch, env: dict[str, str], user: UserIds | None, gpus: list[GpuInfo]
    ) -> LaunchRequest:
        """The run of `msg` to start, for its user `user` (mgpu.agent.jobenv.run_as): its
        command line, environment and ids wrapped by `wrap` (a container)."""
        argv, env, ids, note = self.wrap(msg, env, user)
        note = jobenv.with_note(self._notes.pop((msg.job_id, msg.epoch), None), note)
        return jobenv.launch_request(msg, argv, env, ids, note, gpus, owner=user)

    def wrap(
        self, msg: Launch, env: dict[str, str], ids: tuple[int, int, list[int]] | None
    ) -> tuple[list[str], dict[str, str], tuple[int, int, list[int]] | None, str | None]:
        """The argv, environment and user to start, and a note for the job's stderr: a
        container command line for --image; remembers what the end of the run needs
        (epilog, container to clean up)."""
        argv = list(msg.argv)
        side: dict[str, Any] = {}
        note = None
        if msg.epilog:
            side["epilog"] = {
                "path": msg.epilog,
                "timeout": msg.epilog_timeout,
                "env": script_env(env, msg.user, "epilog"),
            }
        if msg.image:
            rt = self.runtime
            if rt is None:
                raise LaunchError(f"{self.node_id} has no container runtime for --image")
            name = containers.container_name(msg.job_id, msg.epoch)
            uid_gid = (ids[0], ids[1]) if ids is not None else (os.getuid(), os.getgid())
            image = _image_of(msg)
            cwd = _container_cwd(msg)
            if cwd and ":" in cwd:  # `-v SRC:DST:OPTIONS`, `--bind SRC:DST:OPTIONS`
                raise JobError(f"a container cannot mount a directory with ':' in its name: {cwd}")
            source = None
            uid = ids[0] if ids is not None else os.getuid()
            binds = usermounts.binds_of(msg.container, uid)
            if ids is not None and containers.runs_as_agent(rt):
                # A root runtime would mount them for the user whatever their parents
                # allow, and finds them by name again: it gets what the user reached
                # (pinned while the launch was prepared, or now).
                pinned = self._pinned.pop((msg.job_id, msg.epoch), None)
                if isinstance(pinned, (JobError, LaunchError)):
                    raise pinned
                if pinned is None:
                    pinned = self._pin_all(msg, cwd, ids)
                source, binds = pinned
            env_file = None
            if containers.uses_env_file(rt):
                # The container's variables go in through a 0600 file in the private spool,
                # not through the environment of the runtime (root: see privileged).
                env_file = self._env_path(msg.job_id, msg.epoch)
                also = msg.container.env if msg.container is not None else ()
                passed = {k: env[k] for k in containers.passed_env(env, also)}
                try:
                    dropped = privileged.write_env_file(env_file, passed, inherit=["MGPU_RUN_TAG"])
                except OSError as e:
                    raise LaunchError(f"cannot write the container's env file: {e}") from None
                if dropped:
                    note = (
                        "not passed into the container (a value a line-based env file cannot "
                        "hold): " + ", ".join(dropped)
                    )
                env = privileged.base_env()
            argv = containers.build_argv(
                rt,
                image,
                argv,
                grant=msg.grant,
                cwd=cwd,
                uid_gid=uid_gid,
                env_file=str(env_file) if env_file is not None else None,
                name=name,
                source=source,
                options=msg.container,
                binds=binds,
            )
            if containers.runs_as_agent(rt):
                ids = None  # the runtime runs as the agent; --user keeps the job's uid
            side["container"] = {"runtime": rt.name, "exe": rt.exe, "name": name}
        if side:
            self._plain.discard((msg.job_id, msg.epoch))
            path = self._side_path(msg.job_id, msg.epoch)
            with contextlib.suppress(OSError):
                path.write_text(json.dumps(side))
        else:
            self._plain.add((msg.job_id, msg.epoch))
        return argv, env, ids, note

    # ---- after a job ----------------------------------------------------------

    async def after(self, run: Running) -> str | None:
        """Clean up a container (its working directory's mount, too) and run the epilog of
        an ended run; the epilog's error."""
        if (run.rec.job_id, run.rec.epoch) in self._plain:
            return None
        with contextlib.suppress(OSError):
            self._env_path(run.rec.job_id, run.rec.epoch).unlink()  # read when the run began
        bindmount.release(self._mount_path(run.rec.job_id, run.rec.epoch))
        usermounts.release_all(str(self.launcher.spool), run.rec.job_id, run.rec.epoch)
        path = self._side_path(run.rec.job_id, run.rec.epoch)
        try:
            side = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        box = side.get("container")
        if box and run.kill_reason is not None:  # killed: `--rm` may not have happened
            await self._remove_container(box)
        epilog = side.get("epilog")
        if not epilog:
            return None
        if "result" not in epilog:
            env = dict(epilog["env"])
            code = self.launcher.exit_code(run)
            env["MGPU_JOB_EXIT_CODE"] = "" if code is None else str(code)
            res = await run_script(epilog["path"], env, float(epilog["timeout"]))
            self._append_output(run, res.output)
            epilog["result"] = {"ok": res.ok, "error": res.error}
            with contextlib.suppress(OSError):
                path.write_text(json.dumps(side))
        result = epilog["result"]
        return None if result["ok"] else f"epilog failed: {result['error']}"

    def _append_output(self, run: Running, output: str) -> None:
        """The epilog's lines go to the end of the job's stderr, prefixed `[epilog] `."""
        lines = output.splitlines()
        if not lines:
            return
        text = "".join(f"[epilog] {line}\n" for line in lines)
        try:
            with open(run.rec.err_path, "ab") as f:
                f.write(text.encode())
        except OSError as e:
            log.warning("job %s: cannot keep the epilog's output: %s", run.rec.job_id, e)

    async def _remove_container(self, box: dict[str, str]) -> None:
        rt = containers.Runtime(box["runtime"], box["exe"])
        argv = containers.cleanup_argv(rt, box["name"])
        if argv is None:
            return
        try:
            proc = await privileged.start(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            await asyncio.wait_for(proc.wait(), 30)
        except (OSError, TimeoutError) as e:
            log.warning("cannot remove container %s: %s", box["name"], e)

    def forget(self, job_id: str, epoch: int) -> None:
        if (job_id, epoch) in self._plain:
            self._plain.discard((job_id, epoch))
            return  # nothing was written
        with contextlib.suppress(OSError):
            self._side_path(job_id, epoch).unlink()

    def discard(self, job_id: str, epoch: int) -> None:
        """Remove what `wrap` wrote for a run that did not start."""
        plain = (job_id, epoch) in self._plain
        self._pinned.pop((job_id, epoch), None)
        self._notes.pop((job_id, epoch), None)
        self.forget(job_id, epoch)
        if not plain:
            with contextlib.suppress(OSError):
                self._env_path(job_id, epoch).unlink()
            bindmount.release(self._mount_path(job_id, epoch))
            usermounts.release_all(str(self.launcher.spool), job_id, epoch)


def _image_of(msg: Launch) -> str:
    """The job's image, checked again (the master checks it at submit): a root runtime
    would read a name that begins with `-` as one of its own options (`--user=0`)."""
    try:
        return execspec.validate_image(msg.image or "")
    except SpecError as e:
        raise JobError(str(e)) from None


def _container_cwd(msg: Launch) -> str | None:
    """The directory a container job is given as its own: the submit directory, if here."""
    cwd = msg.cwd
    return cwd if cwd and os.path.isabs(cwd) and os.path.isdir(cwd) else None


__all__ = ["JobHost", "SiteHooks", "run_script", "script_env"]
