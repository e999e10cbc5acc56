"""`mgpu node`: the agent on one GPU machine.

It dials the master (so it works behind NAT), says hello with its hostname, IP,
GPUs and whatever it already runs, then launches and stops jobs as told and
streams their output back.  When the master goes away, jobs keep running;
messages wait in an ordered outbox and the agent reconnects with backoff.

Several masters (`--master-host a,b`: one leads, the others stand by) are dialled in turn
until one leads (`mgpu.masters`, shared with the client): a standby refuses the handshake
with 503 and names the leader when it knows it (`X-Mgpu-Leader`), which is dialled next if
it may be.  Once the cluster's CA is pinned (in the state dir), every dial is TLS verified
against it and no hello goes out in clear.  The link to a leader is pinged, so a
leader that stopped (SIGSTOP, a machine off, a cut network) is left within seconds.  A
leader's Welcome carries its lease generation: the agent keeps the highest it was welcomed
with (in its node dir) and leaves a master whose generation is lower, a deposed leader
that woke up, before acting on anything it says.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import logging
import os
import random
import signal
import socket
import ssl as ssl_errors
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mgpu.agent import handlers, jobenv, outputfiles, sigdefaults
from mgpu.agent.generation import DeposedMaster, LeaderGeneration
from mgpu.agent.gpus import GpuInfo, detect_gpus
from mgpu.agent.handlers import first_line
from mgpu.agent.heartbeats import Heartbeats
from mgpu.agent.hostres import HostResources, detect_host
from mgpu.agent.identity import NodeIdentity, NodeIdentityError
from mgpu.agent.launcher import JobError, Launcher, LaunchError, Running
from mgpu.agent.launchsteps import UserIds
from mgpu.agent.link import (
    StandbyMaster,
    ip_towards,
    open_link,
    said_nothing,
    standby_refusal,
    watch_leader,
)
from mgpu.agent.mps import MpsControl
from mgpu.agent.options import AgentOptions
from mgpu.agent.site import SiteHooks
from mgpu.masters import Search, Transport
from mgpu.protocol import (
    CpuDesc,
    Exited,
    GpuDesc,
    Hello,
    Launch,
    Output,
    Refused,
    RunningReport,
    Started,
    Welcome,
    batch_frames,
    encode,
    parse_master_message,
)

log = logging.getLogger("mgpu.agent")

OUTPUT_POLL = 0.05
"""Seconds between looks at running jobs' spool files."""
STARTED_HOLD = 0.01
"""A run's start is told this long after it, or with its first output or its end if one
comes sooner: a short job's start and end reach the master in one frame and one commit.
(The start time told is the real one, stamped at the start.)"""


OUTPUT_QUEUED_MAX = 16 << 20
"""Characters of job output queued for the master at most: past this, no spool file is read
until the connection has taken some (a job writing as fast as it can, or a slow master,
must not fill the root agent's memory).  The output waits in its spool file meanwhile."""


MULTI_BACKOFF_MAX = 1.0
"""Seconds between rounds over several masters at most: a new leader is found within
about this long of taking over."""
SINGLE_BACKOFF_MAX = 4.0
"""The same for one master: capped well under its node timeout, so a restarted master
hears from every agent before it would declare one lost."""


class AgentRefused(RuntimeError):
    pass


class Agent:
    def __init__(self, options: AgentOptions) -> None:

        self.options = options
        node_id = options.node_id
        self.node_id = node_id
        self.masters = options.addresses
        """The masters configured (a leader a standby names is dialled, never added)."""
        self.master = self.masters[0]
        """The master dialled now, or last connected to."""
        told = "http" if options.insecure else options.scheme
        self.transport = Transport(told, options.token, str(options.state_dir))
        """TLS or plain for each dial: TLS only for a TLS master's join token, or once the
        CA is pinned in the state dir."""
        self.tls = self._tls_auto = False
        self._choose_tls()
        self._welcomed = False
        """Whether the session now (or last) was welcomed: the master dialled leads."""
        self._leads_elsewhere: tuple[str, int] | None = None
        """Another master that leads now, found while linked to a deposed one."""
        self._ssl_context: Any = None
        """The cluster CA pinned (one CA for every master of the cluster)."""
        self.generations = LeaderGeneration(options.node_dir)
        """The highest leader generation this agent was welcomed with (mgpu.agent.generation)."""
        self._failing: dict[tuple[str, int], str] = {}
        """Why each master could not be used, as last logged (a reason is logged once)."""
        self.token = options.token
        """The join token (found later, if the master makes it after this agent started)."""
        self.hostname = socket.gethostname()
        self.gpus: list[GpuInfo] = []
        self.gpu_source = "none"
        self.host = HostResources(cpus=[], mem_mb=0)
        """Its CPUs and memory (mgpu.agent.hostres), found with its GPUs."""
        self.launcher = Launcher(options.node_dir / "spool", self._on_output)
        self.mps = MpsControl(options.node_dir)  # shared jobs' limits held
        self.outbox: deque[tuple[str, str]] = deque()
        """(message type, encoded message), sent in order over the live connection."""
        self.output_queued = 0
        """Characters of the output messages in `outbox` (OUTPUT_QUEUED_MAX)."""
        self._output_room = asyncio.Event()
        """Set when the connection took queued output (waited on by `_send_all_output`)."""
        self._connection = 0
        """Counts connections: work begun for one is dropped once another has begun."""
        self._exits: dict[tuple[str, int], Exited] = {}
        """Ends not yet stored by the master (no `Forget` yet): re-sent after a reconnect."""
        self._outbox_ready = asyncio.Event()
        self._held: dict[tuple[str, int], tuple[Running, asyncio.TimerHandle]] = {}
        """Starts not told yet (STARTED_HOLD), by run."""
        self.heartbeat_interval = 5.0
        self.heartbeats = Heartbeats(
            self.launcher, self.mps, self.send, lambda: self.heartbeat_interval
        )
        self.connected = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.site = SiteHooks(self, self.launcher, node_id, options.container_runtime)
        """Prolog/epilog scripts and container jobs (mgpu.agent.site)."""
        self.identity = NodeIdentity(options.node_dir, node_id)
        """The node secret that proves this agent is `node_id` (mgpu.agent.identity)."""
        # A terminal's output is sent as it comes (else after the reconnect, from the file).
        self.launcher.on_terminal_output = lambda run: (
            self.launcher.pump_output(run) if self.connected else None
        )
        self.launcher.output_room = lambda: self.output_queued < OUTPUT_QUEUED_MAX

    def _choose_tls(self) -> None:
        """As the transport says for the master dialled now (mgpu.masters.Transport)."""
        self.tls = self.transport.tls(self.master)
        self._tls_auto = self.transport.may_switch(self.master)

    def _use(self, address: tuple[str, int]) -> None:
        if address != self.master:
            self.master = address
            self._choose_tls()

    @property
    def generation(self) -> int | None:
        return self.generations.value

    def _check_generation(self, reply: Welcome) -> None:
        """Refuse a Welcome from a deposed leader (a generation lower than one seen)."""
        self.generations.check(reply.generation, _shown(self.master))

    def _say_failing(self, reason: str) -> None:
        """One line per master and reason (not one per round while a failover runs)."""
        if self._failing.get(self.master) != reason:
            self._failing[self.master] = reason
            log.warning("%s", reason)

    # ---- outbound -----------------------------------------------------------

    def send(self, message: BaseModel) -> None:
        kind, text = str(getattr(message, "type", "")), encode(message)
        if kind == "output":
            self.output_queued += len(text)
        self.outbox.append((kind, text))
        self._outbox_ready.set()

    def _on_output(
        self, job_id: str, epoch: int, stream: str, text: str, start: int, end: int
    ) -> None:
        if self._held:
            self._tell_started((job_id, epoch))  # the master hears of a start before its output
        out = Output(job_id=job_id, epoch=epoch, stream=stream, data=text, offset=start, end=end)  # type: ignore[arg-type]
        self.send(out)

    def report_exit(self, msg: Exited) -> None:
        """Send a run's end now if connected, and again after every reconnect until the
        master says it has stored it (`Forget`)."""
        self._exits[(msg.job_id, msg.epoch)] = msg
        if self._held:
            self._tell_started((msg.job_id, msg.epoch))
        if self.connected:
            self.send(msg)

    # ---- main loop ----------------------------------------------------------

    async def run(self) -> None:
        _make_private(self.options.state_dir, self.launcher.spool.parent, self.launcher.spool)
        self.identity.open()
        self.gpus, self.gpu_source = detect_gpus(
            self.options.fake_gpus, count=self.options.gpu_count
        )
        self.host = detect_host(
            self.gpus, self.gpu_source, self.options.fake_cpus, self.options.fake_mem_mb
        )
        await self.site.probe()
        log.info(
            "node %s on %s: %d GPU(s) via %s, %d CPU(s), %d MiB",
            self.node_id,
            self.hostname,
            len(self.gpus),
            self.gpu_source,
            len(self.host.cpus),
            self.host.mem_mb,
        )
        records = self.launcher.load_previous()
        self.site.sweep([(rec.job_id, rec.epoch) for rec in records])  # container cwd mounts
        containment = self.launcher.contain(self.node_id, records)
        log.info("jobs are contained by %s", containment.describe())
        isolation = self.launcher.isolate(self.node_id, self.options.gpu_device_dir, records)
        log.info("jobs are kept to their GPUs by %s", isolation.describe())
        limits = self.launcher.limit(self.node_id, records)
        log.info("jobs are held to their CPUs and memory by %s", limits.describe())
        for rec in records:
            run = self.launcher.adopt(rec)
            alive = not run.exited.is_set()
            log.info("re-adopted job %s (pid %d, alive=%s)", rec.job_id, rec.pid, alive)
            if alive and rec.pty:  # its terminal closed with the agent that held it
                self.launcher.kill(run, "its terminal ended with the agent", 0.0)
            self._tasks.add(asyncio.get_running_loop().create_task(self._watch(run)))
        loop = asyncio.get_running_loop()
        self._tasks.add(loop.create_task(self._pump_loop()))
        self._tasks.add(loop.create_task(self.launcher.sweep()))
        self._tasks.add(loop.create_task(self.launcher.watch_memory()))
        loop.add_signal_handler(signal.SIGTERM, self._terminate)
        self.generations.load()
        await self._dial_forever()

    async def _dial_forever(self) -> None:
        """Connect, converse, and when the link drops dial again: the master last used
        first, then the others in turn (or the leader a standby names), pausing only once
        every master was tried."""
        cap = MULTI_BACKOFF_MAX if len(self.masters) > 1 else SINGLE_BACKOFF_MAX
        delay = 0.2
        search = Search(self.masters, self.transport)
        while True:
            self._welcomed = False
            hint = None
            silent = False
            try:
                await self._session()
            except (AgentRefused, NodeIdentityError):
                raise
            except StandbyMaster as e:
                self._say_failing(str(e))
                hint = e.leader
            except DeposedMaster as e:
                self._say_failing(str(e))
            except (TimeoutError, OSError) as e:
                silent = said_nothing(e)
                if self._welcomed:
                    log.warning("connection to the master at %s lost: %s", self.url, e)
                else:
                    self._say_failing(f"cannot reach the master at {self.url}: {e}")
            except Exception as e:
                silent = said_nothing(e)
                log.warning("connection to the master lost: %s", e)
            self.connected = False
            if self._welcomed:  # it led: a new round, from it (a blip), then the others
                self._failing.clear()
                search, delay = Search(self.masters, self.transport), 0.2
                if self._leads_elsewhere is not None:  # deposed: the one that leads now
                    self._use(self._leads_elsewhere)
                    self._leads_elsewhere = None
                elif silent:  # frozen: whoever took over is elsewhere; it is dialled last
                    self._use(search.failed(self.master, silent=True) or self.master)
                elif self.master not in self.masters:  # a hinted leader: that link only
                    self._use(self.masters[0])
                await asyncio.sleep(0.1 * (0.5 + random.random()))
                continue
            after = search.failed(self.master, hint, silent)
            if after is not None:
                self._use(after)
                continue
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, cap)
            self._use(search.again())

    def _terminate(self) -> None:
        """SIGTERM: ended runs' job scripts are removed first (else they stay in the temp
        dir), then the agent ends as SIGTERM ends it.  Running jobs run on; the next agent
        adopts them."""
        self.launcher.clean_up_now()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    @property
    def url(self) -> str:
        return f"{'wss' if self.tls else 'ws'}://{_shown(self.master)}/api/agent"

    async def _tls_context(self) -> Any:
        if self._ssl_context is None:
            from mgpu import tlsutil

            fingerprint = self.transport.fingerprint
            if not fingerprint:
                raise AgentRefused(
                    "the master uses TLS but no join token names its CA "
                    "(mgpu node --token, or $MGPU_JOIN_TOKEN)"
                )
            # Pinned in the state dir: from then on this agent dials the cluster in TLS only.
            pem = await asyncio.to_thread(
                tlsutil.cached_ca, *self.master, fingerprint, 10.0, str(self.options.state_dir)
            )
            self._ssl_context = tlsutil.client_context(pem)
        return self._ssl_context

    async def _session(self) -> None:
        import websockets

        if self.token is None:
            from mgpu.credentials import find_join_token

            # The master may have made it since this agent started.
            self.token = find_join_token(None, self.options.state_dir)
            self.transport.use_token(self.token)
        self._choose_tls()  # the CA may have been pinned since the last dial
        ssl = await self._tls_context() if self.tls else None
        try:
            async with open_link(self.url, ssl, len(self.masters) > 1) as ws:
                await self._converse(ws)
        except websockets.InvalidStatus as e:  # it answered in HTTP: TLS or not was right
            raise standby_refusal(e, _shown(self.master)) or e from None
        except (websockets.InvalidMessage, websockets.InvalidHandshake, EOFError):
            if self._tls_auto:  # a loopback master may speak only TLS (--tls)
                self.transport.switch(self.master, not self.tls)
            raise
        except ssl_errors.SSLCertVerificationError:
            raise  # a certificate that is not the cluster's: never a reason to go plain
        except ssl_errors.SSLError:
            # A plain master answers a TLS hello in HTTP (WRONG_VERSION_NUMBER): a loopback
            # master of unknown transport guessed TLS after a cut handshake (a master that
            # re-executes itself) is plain again, or no dial would ever reach it.
            if self._tls_auto and self.tls:
                self.transport.switch(self.master, False)
            raise

    async def _converse(self, ws: Any) -> None:
        refused = None if self.tls else self.transport.plain_refused(self.master)
        if refused:  # no hello in clear, and no Welcome or Launch from an unproven peer
            raise ConnectionError(refused)
        ip = self.options.advertise_ip or ws.local_address[0]
        hello = Hello(
            node_id=self.node_id,
            hostname=self.hostname,
            ip=ip,
            gpus=[GpuDesc(**vars(g), numa_node=self.host.gpu_numa.get(g.index)) for g in self.gpus],
            cpus=[CpuDesc(id=c.id, core=c.core, numa=c.numa) for c in self.host.cpus],
            mem_mb=self.host.mem_mb or None,
            gpu_source=self.gpu_source,
            running=self._running_reports(),
            token=self.token,
            run_as_user=None if os.geteuid() == 0 else getpass.getuser(),
            features=self.site.features(),
            node_secret=self.identity.secret,
            containment=self.launcher.containment.method,
            gpu_isolation=self.launcher.isolation.method,
            watches_leader=len(self.masters) > 1,
        )
        await ws.send(encode(hello))
        reply = parse_master_message(await asyncio.wait_for(ws.recv(), timeout=30))
        if isinstance(reply, Refused):
            raise AgentRefused(reply.reason)
        if not isinstance(reply, Welcome):
            raise ConnectionError("the master did not welcome us")
        self._check_generation(reply)  # before anything it says is acted on
        self._welcomed = True
        if reply.node_secret:  # first join: kept before anything else happens
            self.identity.save(reply.node_secret)
            log.info("joined as node %s; its secret is in %s", self.node_id, self.identity.path)
        self.heartbeat_interval = reply.heartbeat_interval
        for rep in reply.kill:
            run = self.launcher.find(rep.job_id, rep.epoch)
            if run is not None:
                log.warning("killing %s: the master does not expect it here", rep.job_id)
                self.launcher.kill(run, "unknown to the master", 0.0)
            else:
                self.site.cancel(rep.job_id, rep.epoch, "unknown to the master")
        # Output and ends still queued may never have reached the master, or may have: drop
        # them and send again from where the master's copy ends (it drops what it has).
        self.outbox = deque(m for m in self.outbox if m[0] not in ("output", "exited"))
        self.output_queued = 0
        self._connection += 1
        for res in reply.resume:
            run = self.launcher.find(res.job_id, res.epoch)
            if run is not None:
                self.send(self._started(run))  # again: lost if the master died right after
                self.launcher.rewind(run, res.stdout, res.stderr)
        self.connected = True
        behind = []  # ends that must wait for more output than fits the queue now
        for (job_id, epoch), exited in self._exits.items():
            run = self.launcher.find(job_id, epoch)
            if run is None or self.launcher.pump_output(run):
                self.send(exited)
            else:
                behind.append((run, exited))
        for run, exited in behind:
            self._spawn(self._send_end_after_output(run, exited, self._connection))
        self._failing.clear()
        log.info("connected to the master at %s as %s", _shown(self.master), self.node_id)
        sender = asyncio.create_task(self._sender(ws))
        beater = asyncio.create_task(self.heartbeats.beat(self.gpus, self.gpu_source))
        several = len(self.masters) > 1  # another may lead: it is dialled once it does
        args = (self.master, self.masters, self.transport, self._ssl_context, ws)
        watcher = asyncio.create_task(watch_leader(*args)) if several else None
        try:
            async for raw in ws:
                for msg in handlers.parse_frame(self, raw):
                    self._handle(msg)
        finally:
            sender.cancel()
            beater.cancel()
            self.connected = False
            if watcher is not None and watcher.done() and not watcher.cancelled():
                self._leads_elsewhere = watcher.result()
            elif watcher is not None:
                watcher.cancel()

    def _running_reports(self) -> list[RunningReport]:
        reps = []
        for run in self.launcher.running.values():
            reps.append(
                RunningReport(
                    job_id=run.rec.job_id,
                    epoch=run.rec.epoch,
                    pid=run.rec.pid,
                    exited=run.exited.is_set(),
                )
            )
        reps.extend(self.site.pending_reports())  # launches still being prepared
        return reps

    async def _sender(self, ws: Any) -> None:
        while True:
            while self.outbox:
                # Everything queued goes out now, many messages to a frame; they leave the
                # outbox only once sent, so a dropped connection loses none of them.
                count = len(self.outbox)
                for frame in batch_frames([self.outbox[i][1] for i in range(count)]):
                    await ws.send(frame)
                for _ in range(count):
                    kind, text = self.outbox.popleft()
                    if kind == "output":
                        self.output_queued -= len(text)
                self._output_room.set()
            self._outbox_ready.clear()
            await self._outbox_ready.wait()

    async def _pump_loop(self) -> None:
        while True:
            await asyncio.sleep(OUTPUT_POLL)
            if self.connected:
                self.launcher.pump_all()

    # ---- inbound ------------------------------------------------------------

    def fail_launch(self, job_id: str, epoch: int, error: str, fatal: bool = True) -> None:
        log.error("job %s: %s", job_id, first_line(error))
        self.report_exit(
            Exited(
                job_id=job_id,
                epoch=epoch,
                exit_code=None,
                time=time.time(),
                launch_error=first_line(error),
                fatal=fatal,
            )
        )

    def forget_exit(self, job_id: str, epoch: int) -> None:
        self._exits.pop((job_id, epoch), None)

    def _handle(self, msg: BaseModel) -> None:
        """One message from the master (to its handler: mgpu.agent.handlers).  Whatever goes
        wrong stays with it: logged, and a launch reported as failed; the connection and
        the other messages carry on."""
        try:
            handlers.dispatch(self, msg)
        except Exception as e:
            log.exception("handling a %s message failed", getattr(msg, "type", "?"))
            if isinstance(msg, Launch) and self.launcher.find(msg.job_id, msg.epoch) is None:
                self.site.discard(msg.job_id, msg.epoch)
                self.fail_launch(msg.job_id, msg.epoch, f"the agent failed to launch it: {e}")

    def launch(self, msg: Launch) -> None:
        old = self.launcher.find(msg.job_id)
        if old is not None:
            if old.rec.epoch == msg.epoch:
                return  # duplicate
            self.launcher.kill(old, "superseded", 0.0)
        try:
            req = self.site.request(msg, self.job_env(msg), self.run_as(msg), self.gpus)
            note = jobenv.with_note(req.note, self.mps.note(msg.job_id, self.node_id))
            run = self.launcher.launch(dataclasses.replace(req, note=note))
            self.mps.launched(msg.job_id)  # a shared job's daemon and limits kept while it runs
        except (jobenv.UserError, LaunchError) as e:
            self.site.discard(msg.job_id, msg.epoch)
            fatal = isinstance(e, jobenv.UserError | JobError)  # the job's problem, not the node's
            self.fail_launch(msg.job_id, msg.epoch, str(e), fatal)
            return
        loop = asyncio.get_running_loop()
        key = (msg.job_id, msg.epoch)
        self._held[key] = (run, loop.call_later(STARTED_HOLD, self._tell_started, key))
        self._tasks.add(loop.create_task(self._watch(run)))

    def _tell_started(self, key: tuple[str, int]) -> None:
        """Send a held start now (if it still is)."""
        held = self._held.pop(key, None)
        if held is not None:
            held[1].cancel()
            self.send(self._started(held[0]))

    def _started(self, run: Running) -> Started:
        return Started(
            job_id=run.rec.job_id,
            epoch=run.rec.epoch,
            pid=run.rec.pid,
            hostname=self.hostname,
            ip=self.options.advertise_ip or ip_towards(self.master[0]),
            time=run.rec.start_time,
            share_enforced=self.mps.share_held(run.rec.job_id),
        )

    def run_as(self, msg: Launch) -> UserIds | None:
        """uid, gid and groups to run the job as; None = as this agent's own user."""
        return jobenv.run_as(msg, self.hostname)

    def job_env(self, msg: Launch) -> dict[str, str]:
        # Every master, the leader first: `mgpu` in the job finds it after a failover too;
        # https:// when this link is TLS, so the job's commands never send a token in clear.
        lead = [self.master] if self.master in self.masters else []
        masters = [*lead, *(a for a in self.masters if a != self.master)]
        scheme = "https" if self.tls else ("http" if self.options.insecure else None)
        return jobenv.job_env(msg, masters, self.gpus, self.mps, scheme)

    def share_setup(self, msg: Launch) -> Callable[[], None] | None:
        """A shared job's MPS server limits, set before its process starts (mgpu.agent.mps):
        what `site.prepare` runs in a thread; None where there is nothing to set."""
        return jobenv.share_setup(msg, self.hostname, self.gpus, self.mps)

    async def _send_all_output(self, run: Running) -> bool:
        """Queue an ended run's output up to where its files end now, as the connection takes
        it (the master drops output that comes after the run's end).  False when the
        connection went first: the rest is sent after the reconnect."""
        ends = []
        for path in (run.rec.out_path, run.rec.err_path):
            try:
                ends.append(os.path.getsize(path))
            except OSError:
                ends.append(0)
        connection = self._connection
        while self.connected and connection == self._connection:
            # Caught up with the files as they are now also ends it: one cut short since
            # (by a process that escaped the job) will never reach `ends`.
            caught_up = self.launcher.pump_output(run)
            if caught_up or (run.rec.out_sent >= ends[0] and run.rec.err_sent >= ends[1]):
                return True
            if self.launcher.output_room():
                await asyncio.sleep(0)  # READ_MAX read: the rest next turn of the loop
                continue
            self._output_room.clear()
            # Bounded: the sender that sets it goes with a dropped connection.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._output_room.wait(), OUTPUT_POLL)
        return False

    async def _send_end_after_output(self, run: Running, exited: Exited, connection: int) -> None:
        """After a reconnect: an end the master has not stored, once its output is sent."""
        sent = await self._send_all_output(run)
        stored = (run.rec.job_id, run.rec.epoch) not in self._exits  # Forget came meanwhile
        if sent and connection == self._connection and not stored:
            self.send(exited)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, run: Running) -> None:
        await run.exited.wait()
        await self.launcher.kill_leftovers(run)
        if run.terminal is not None:
            run.terminal.drain()  # the last of its output, then the pty goes
            run.terminal.close()
        epilog_error = await self.site.after(run)  # its output joins the job's stderr
        # Its output before its end (else after the reconnect, from where the master is);
        # again if a new connection began meanwhile: it rewound to the master's copy.
        while not await self._send_all_output(run) and self.connected:
            pass
        code, signum = self.launcher.ending(run)
        error = outputfiles.open_failure(code, run.rec.err_path)  # fails the job (fatal)
        if code is None:
            error = "the job's process vanished while the agent was down"
        ended = time.time()
        with contextlib.suppress(OSError):
            ended = os.path.getmtime(run.rec.exit_path)  # the shim wrote it as the job ended
        # The run stays (listed in hello, files kept) until the master has stored its end.
        self.report_exit(
            Exited(
                job_id=run.rec.job_id,
                epoch=run.rec.epoch,
                exit_code=code if signum is None else -signum,  # -N: killed by signal N
                time=min(ended, time.time()),
                timed_out=run.timed_out,
                launch_error=error,
                fatal=error is not None and code is not None,
                epilog_error=epilog_error,
                out_of_memory=run.out_of_memory,
                max_rss_mb=run.max_rss_mb,
            )
        )
        task = asyncio.current_task()
        if task is not None:
            self._tasks.discard(task)


PRIVATE_UMASK = 0o077
"""The agent's own files (run records, spool, side files with an epilog's environment) are
its alone whatever its caller's umask; its children get `privileged.CHILD_UMASK` back."""


def _make_private(*dirs: Path) -> None:
    """The state dir, the node's dir and its spool: 0700, also ones made before."""
    for d in dirs:
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(d, 0o700)
        except OSError as e:
            raise NodeIdentityError(f"cannot use the state dir {d}: {e.strerror}") from None


def _shown(address: tuple[str, int]) -> str:
    from mgpu.addresses import format_address

    return format_address(address)


def run_agent(options: AgentOptions) -> None:
    from mgpu.credentials import find_join_token

    os.umask(PRIVATE_UMASK)
    sigdefaults.defaults_for_children()  # before the spawner or any job is started
    token = find_join_token(options.token, options.state_dir)
    agent = Agent(dataclasses.replace(options, token=token))
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=_loop_factory()) as r:
        r.run(agent.run())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (as the master's uvicorn uses it): the
    agent's Python per job (a launch, its exit, a frame each way) is ~20 % less on it."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a platform without uvloop: asyncio's own
        return None
    return uvloop.new_event_loop


__all__ = ["Agent", "AgentOptions", "AgentRefused", "DeposedMaster", "StandbyMaster", "run_agent"]
