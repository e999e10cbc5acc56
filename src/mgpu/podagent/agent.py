"""`mgpu pod-agent`: the agent of one job, in one of its Pods (a Kubernetes partition).

It runs as the Pod's user (the job's: never root unless the partition allows root jobs)
inside the Pod's container, so a step has the Pod's GPUs, CPUs, memory, volumes and
network, and ends with the Pod.  It dials the master's `/api/kube/pod` (`$MGPU_MASTER`,
TLS pinned to the CA the job's credential names) with the job's credential
(`$MGPU_TOKEN`) and its Pod's name (`$MGPU_POD_NAME`); the master sends it only the
steps of its job on its Pod's node (mgpu.master.kube.podagents) and it answers as an
agent does: started, output (with byte offsets), exited.  A dropped connection is dialled
again; a step's messages not sent yet wait for it, and each running step's start is told
again (a master that started meanwhile learns what runs here).  It holds no secret of its
own.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from mgpu import exits
from mgpu.agent.terminal import Terminal
from mgpu.podagent import jobsignal
from mgpu.protocol import (
    Exited,
    Kill,
    Launch,
    Output,
    SignalRun,
    Started,
    TerminalAck,
    TerminalInput,
    TerminalResize,
    encode,
    parse_master_messages,
)

__all__ = ["main", "step_env"]

log = logging.getLogger("mgpu.podagent")

PATH = "/api/kube/pod"
CHUNK = 64 * 1024
RETRY = (0.5, 1.0, 2.0, 5.0)
"""Seconds between dials after a failed one (the last repeated)."""
KEPT = ("MGPU_MASTER", "MGPU_POD_IP", "MGPU_POD_NAME", "MGPU_SLURM_BIN", "HOSTNAME")
"""The Pod's own variables a step keeps; the rest is its launch's."""


def step_env(launch: Launch, pod_env: dict[str, str]) -> dict[str, str]:
    """A step's environment: its launch's, the Pod's own few (`KEPT`), the GPU variables
    of its grant (the master named them as the container numbers them), and Slurm's
    commands first on its PATH."""
    from mgpu.agent import grants

    env = grants.apply(launch.env, launch.grant, [])  # no GPU name of the launch's own
    env.update({k: pod_env[k] for k in KEPT if k in pod_env})
    path = env.get("PATH") or pod_env.get("PATH") or "/usr/bin:/bin"
    bin_dir = pod_env.get("MGPU_SLURM_BIN")
    env["PATH"] = f"{bin_dir}:{path}" if bin_dir else path
    return env


@dataclass
class _Run:
    launch: Launch
    proc: asyncio.subprocess.Process
    started: Started
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    killing: bool = False
    terminal: Terminal | None = None
    """`srun --pty`: the pty it runs on (its output is the pty's)."""


class PodAgent:
    def __init__(self, url: str, token: str, pod: str, ssl: Any) -> None:
        self.url, self.token, self.pod, self.ssl = url, token, pod, ssl
        self.hostname = pod
        self.ip = os.environ.get("MGPU_POD_IP") or "0.0.0.0"
        self.runs: dict[str, _Run] = {}
        self.outbox: asyncio.Queue[str] = asyncio.Queue()
        self.held: str | None = None
        """A message taken from the outbox that a dropped connection did not send."""

    def tell(self, message: BaseModel) -> None:
        self.outbox.put_nowait(encode(message))

    async def serve(self) -> None:
        """Dial the master, again and again: until it refuses (not this job's Pod, or
        the job ended)."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        failures = 0
        while True:
            try:
                async with connect(
                    self.url,
                    additional_headers={
                        "Authorization": f"Bearer {self.token}",
                        "X-Mgpu-Pod": self.pod,
                    },
                    ssl=self.ssl,
                    max_size=64 * 1024 * 1024,
                    compression=None,
                    open_timeout=10,
                ) as ws:
                    failures = 0
                    if await self._session(ws):
                        return
            except InvalidStatus as e:
                if e.response.status_code in (401, 403):
                    log.error("the master refused this pod's agent: %s", e)
                    return
            except (OSError, ConnectionClosed, TimeoutError) as e:
                log.info("the master at %s: %s", self.url, e)
            await asyncio.sleep(RETRY[min(failures, len(RETRY) - 1)])
            failures += 1

    async def _session(self, ws: Any) -> bool:
        """One connection; True when the master refused this agent."""
        for run in list(self.runs.values()):  # a master that started since knows them so
            self.tell(run.started)
        writer = asyncio.create_task(self._write(ws))
        try:
            async for raw in ws:
                if '"refused"' in raw[:40]:
                    log.error("the master refused this pod's agent: %s", raw)
                    return True
                for message in parse_master_messages(raw):
                    self._handle(message)
        finally:
            writer.cancel()
        return False

    async def _write(self, ws: Any) -> None:
        while True:
            if self.held is None:
                self.held = await self.outbox.get()
            await ws.send(self.held)
            self.held = None

    # ---- the master's messages --------------------------------------------

    def _handle(self, message: BaseModel) -> None:
        if isinstance(message, Launch):
            if message.job_id not in self.runs:  # else sent again after a reconnect
                asyncio.get_running_loop().create_task(self._launch(message))
        elif isinstance(message, Kill):
            run = self.runs.get(message.job_id)
            if run is not None and not run.killing:
                run.killing = True
                asyncio.get_running_loop().create_task(self._kill(run, message))
        elif isinstance(message, SignalRun):
            run = self.runs.get(message.job_id)
            if run is not None:
                _signal(run.proc.pid, message.signal, group=not message.top_only)
            elif message.job_id == os.environ.get("MGPU_JOB_ID"):  # the job's own processes
                steps = {r.proc.pid for r in self.runs.values()}
                sent = jobsignal.send(message.signal, os.getpid(), steps, message.top_only)
                log.info("signal %d to %d process(es) of the job", message.signal, sent)
        elif isinstance(message, TerminalInput):
            self._typed(message)
        elif isinstance(message, TerminalResize):
            run = self.runs.get(message.job_id)
            if run is not None and run.terminal is not None:
                run.terminal.resize(message.size.rows, message.size.cols)

    def _typed(self, message: TerminalInput) -> None:
        """Typed input for a step's pty; every byte acknowledged as it leaves (written, or
        dropped), which lets its client send more (as mgpu's agent does)."""
        job_id, epoch = message.job_id, message.epoch
        data = base64.b64decode(message.data)

        def ack(n: int) -> None:
            self.tell(TerminalAck(job_id=job_id, epoch=epoch, bytes=n))

        run = self.runs.get(job_id)
        if run is None or run.terminal is None:
            ack(len(data))
        else:
            run.terminal.write(data, ack)

    async def _launch(self, launch: Launch) -> None:
        env = step_env(launch, dict(os.environ))
        terminal, slave, argv = None, -1, list(launch.argv)
        if launch.pty is not None:  # the program's stdin, stdout and stderr: a new pty
            out = _OutputTeller(self, launch, "o")
            terminal, slave = Terminal.open(launch.pty.rows, launch.pty.cols, None, out.tell)
            argv = [*_ON_TERMINAL, terminal.path, *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=launch.cwd if launch.cwd and os.path.isdir(launch.cwd) else None,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=slave if terminal is not None else asyncio.subprocess.PIPE,
                stderr=slave if terminal is not None else asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            if terminal is not None:
                terminal.close()
            self.tell(_exited(launch, None, f"{launch.argv[0] if launch.argv else ''}: {e}"))
            return
        finally:
            if slave >= 0:
                os.close(slave)  # the program has it
        started = Started(
            job_id=launch.job_id,
            epoch=launch.epoch,
            pid=proc.pid,
            hostname=self.hostname,
            ip=self.ip,
            time=time.time(),
        )
        run = self.runs[launch.job_id] = _Run(launch, proc, started, terminal=terminal)
        self.tell(started)
        if terminal is not None:
            terminal.start(lambda: None)
            code = await proc.wait()
            terminal.drain()  # what it wrote last
            terminal.close()
        else:
            assert proc.stdout is not None and proc.stderr is not None
            await asyncio.gather(
                self._pump(run, proc.stdout, "o"), self._pump(run, proc.stderr, "e")
            )
            code = await proc.wait()
        run.ended.set()
        self.runs.pop(launch.job_id, None)
        self.tell(_exited(launch, exits.shell_code(code), None))

    async def _pump(self, run: _Run, stream: asyncio.StreamReader, name: str) -> None:
        out = _OutputTeller(self, run.launch, name)
        while True:
            chunk = await stream.read(CHUNK)
            out.tell(chunk)
            if not chunk:
                return

    async def _kill(self, run: _Run, kill: Kill) -> None:
        """The agent's kill: the kill's signal first if it names one, then SIGTERM to the
        step's process group, SIGKILL after the grace."""
        pid = run.proc.pid
        for sig, wait in ((kill.signal, kill.signal_lead), (signal.SIGTERM, kill.grace)):
            if sig is None:
                continue
            _signal(pid, int(sig), group=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.ended.wait(), max(0.0, wait))
            if run.ended.is_set():
                return
        _signal(pid, signal.SIGKILL, group=True)


_ON_TERMINAL = ("/bin/sh", "-c", 'exec <"$0" && exec "$@"')
"""Runs a step on its pty: the program's session leader (a new session) opens the pty's
path as its stdin, which makes it the session's controlling terminal (Linux), so Ctrl-C
and a size change reach the program's process group; then the program replaces it."""


class _OutputTeller:
    """One stream of a step's output told to the master as it comes: text (UTF-8, a
    character cut between two reads kept for the next), with its byte offsets."""

    def __init__(self, agent: PodAgent, launch: Launch, stream: str) -> None:
        self.agent, self.launch = agent, launch
        self.stream: Literal["o", "e"] = "o" if stream == "o" else "e"
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.offset = 0

    def tell(self, chunk: bytes) -> None:
        """`chunk` read (b"": the end of the stream)."""
        data = self.decoder.decode(chunk, final=not chunk)
        if not data:
            return
        end = self.offset + len(data.encode())
        out = Output(
            job_id=self.launch.job_id, epoch=self.launch.epoch, stream=self.stream, data=data
        )
        out.offset, out.end = self.offset, end
        self.agent.tell(out)
        self.offset = end


def _signal(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _exited(launch: Launch, code: int | None, error: str | None) -> Exited:
    return Exited(
        job_id=launch.job_id,
        epoch=launch.epoch,
        exit_code=code,
        time=time.time(),
        launch_error=error,
    )


def _endpoint(token: str) -> tuple[str, Any]:
    """The master's WebSocket URL and TLS context, from $MGPU_MASTER and the credential
    (a TLS cluster's names its CA: the only one trusted)."""
    from mgpu.client.leader import resolve_addresses
    from mgpu.tokens import parse_token

    scheme, addresses = resolve_addresses()
    host, port = addresses[0]
    parts = parse_token(token)
    tls = scheme == "https" or (scheme is None and parts.tls)
    where = f"[{host}]" if ":" in host else host
    if not tls:
        return f"ws://{where}:{port}{PATH}", None
    if parts.fingerprint is None:
        raise SystemExit("mgpu pod-agent: the job's credential names no CA to verify the master")
    from mgpu import tlsutil

    pem = tlsutil.fetch_pinned_ca(host, port, parts.fingerprint, 10.0)
    return f"wss://{where}:{port}{PATH}", tlsutil.client_context(pem)


def main() -> int:
    """`mgpu pod-agent`: serve the job's steps in this Pod until the master refuses."""
    logging.basicConfig(level=logging.INFO, format="mgpu pod-agent: %(message)s")
    token = os.environ.get("MGPU_TOKEN", "")
    pod = os.environ.get("MGPU_POD_NAME", "")
    if not token or not pod:
        print("mgpu pod-agent: runs in a job's Pod ($MGPU_TOKEN, $MGPU_POD_NAME)", file=sys.stderr)
        return 2
    for attempt in range(30):  # the master may be starting or failing over
        try:
            url, context = _endpoint(token)
            break
        except OSError as e:
            log.info("the master's CA: %s", e)
            time.sleep(RETRY[min(attempt, len(RETRY) - 1)])
    else:
        return 1
    with contextlib.suppress(OSError):  # out of the job's process group: its signals
        os.setsid()
    asyncio.run(PodAgent(url, token, pod, context).serve())
    return 0
