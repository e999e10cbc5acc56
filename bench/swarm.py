"""The master at scale: N simulated nodes x 8 GPUs against one real master process.

The nodes are not processes: one process (`swarm.py agents ...`, started by this script)
runs them all in one asyncio event loop, each on its own WebSocket to the master and
speaking the real protocol (mgpu.protocol) as the agent does (mgpu.agent.agent):

- hello with a join token; the node secret the master issues at the first join is kept
  and proven in every later hello (in memory: the swarm's nodes live as long as it does;
  a real agent keeps it 0600 in its state dir, mgpu.agent.identity);
- heartbeats at the interval the master's Welcome sets (and a later `SetHeartbeat`
  changes, as the cluster grows), with simulated GPU telemetry (mgpu.agent.gpus, busy
  GPUs look loaded);
- for each launch: `started`, a few lines of output, and `exited` (code 0) after the
  run time; kills end a run (143), port reservations for gang jobs are answered,
  `forget` drops a stored end (re-sent after a reconnect until then);
- messages batched into one frame when several are waiting, as the agent sends them.

So no job process is spawned and the master alone is timed.  For each N this script
starts a master (as mgpu.testing.LocalCluster does), then the swarm, and measures:

- join time: from the swarm's first connection to the last node's Welcome;
- the master's CPU while idle with every node heartbeating (psutil, over --idle seconds);
- `mgpu queue --json` as a whole process: median latency and size of the answer;
- throughput: --jobs one-GPU jobs submitted from --threads threads, jobs/s from the first
  submit to the last job's end (the master's end_time);
- the master's resident memory after that.

The masters' state dirs are made under $TMPDIR and kept until every N ran.  On an ext4
without a journal (this VM's root) creating a file costs kernel CPU in proportion to the
inodes of its block group freed in the last minutes (the allocator steps over each), so a
master whose state dir sits where other work just deleted many files pays up to ~0.8 ms a
job for its output files: `TMPDIR=/a/fresh/top/level/dir` keeps that out of the figures.

Prints a table, writes bench/results/swarm.json and a plot bench/results/swarm.png
(jobs/s against nodes).  The load average is recorded next to each figure: this machine
may be shared.  Not a test; tests/e2e/test_swarm.py runs it small.

    python bench/swarm.py [--nodes 50,200,1000] [--jobs 2000] [--threads 8] [--idle 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import websockets

from mgpu.agent.gpus import fake_gpus, sample_gpus
from mgpu.protocol import (
    Exited,
    Forget,
    GpuDesc,
    GpuTelemetry,
    Heartbeat,
    Hello,
    Kill,
    Launch,
    Output,
    PortReserved,
    Refused,
    ReservePort,
    RunningReport,
    SetHeartbeat,
    Started,
    Welcome,
    batch_frames,
    encode,
    parse_master_message,
    parse_master_messages,
)
from mgpu.testing import BIN, LocalCluster, kill_group, wait_for

RESULTS = Path(__file__).resolve().parent / "results"

# ---- the swarm: simulated nodes in one event loop ------------------------------------


class Refusal(Exception):
    pass


class Run:
    __slots__ = ("end", "epoch", "gpu_ids", "job_id", "pid", "started", "stdout")

    def __init__(self, msg: Launch, pid: int) -> None:
        self.job_id = msg.job_id
        self.epoch = msg.epoch
        self.gpu_ids = list(msg.grant.gpus)
        self.pid = pid
        self.started = time.time()
        self.stdout = b""
        self.end: asyncio.TimerHandle | None = None


class SimNode:
    """One node: what mgpu.agent.agent.Agent does on the wire, with no process behind it."""

    def __init__(self, swarm: Swarm, node_id: str, gpus: int) -> None:
        self.swarm = swarm
        self.node_id = node_id
        self.hostname = f"sim-{node_id}"
        self.gpus = fake_gpus(gpus, hostname=self.hostname)
        self.secret: str | None = None
        self.runs: dict[tuple[str, int], Run] = {}
        self.exits: dict[tuple[str, int], str] = {}
        """Ends the master has not confirmed storing (no Forget yet), encoded."""
        self.outbox: list[str] = []
        self.outbox_ready = asyncio.Event()
        self.heartbeat_interval = 5.0
        self.rng = random.Random(node_id)

    def send(self, encoded: str) -> None:
        self.outbox.append(encoded)
        self.outbox_ready.set()

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                async with websockets.connect(
                    self.swarm.url,
                    max_size=64 * 1024 * 1024,
                    open_timeout=120,
                    ping_interval=None,
                    compression=None,
                ) as ws:
                    await self._converse(ws)
                delay = 0.2
            except Refusal as e:
                self.swarm.count("refused")
                print(f"swarm: {self.node_id} refused: {e}", file=sys.stderr)
                return
            except (OSError, TimeoutError, websockets.WebSocketException):
                pass
            self.swarm.count("reconnects")
            await asyncio.sleep(delay * (0.5 + self.rng.random()))
            delay = min(delay * 2, 4.0)

    async def _converse(self, ws: Any) -> None:
        hello = Hello(
            node_id=self.node_id,
            hostname=self.hostname,
            ip=ws.local_address[0],
            gpus=[GpuDesc(index=g.index, name=g.name, memory_mb=g.memory_mb) for g in self.gpus],
            gpu_source="fake",
            running=[
                RunningReport(job_id=r.job_id, epoch=r.epoch, pid=r.pid) for r in self.runs.values()
            ]
            + [RunningReport(job_id=j, epoch=e, exited=True) for j, e in self.exits],
            token=self.swarm.token,
            node_secret=self.secret,
        )
        await ws.send(encode(hello))
        reply = parse_master_message(await asyncio.wait_for(ws.recv(), timeout=120))
        if isinstance(reply, Refused):
            raise Refusal(reply.reason)
        if not isinstance(reply, Welcome):
            raise ConnectionError("the master did not welcome us")
        if reply.node_secret:  # the first join: proven in every later hello
            self.secret = reply.node_secret
        self.heartbeat_interval = reply.heartbeat_interval
        for rep in reply.kill:
            self._end((rep.job_id, rep.epoch), 143)
        self.outbox = []
        for res in reply.resume:  # runs the master expects: their start again
            run = self.runs.get((res.job_id, res.epoch))
            if run is not None:
                self.send(self._started(run))
        for encoded in self.exits.values():
            self.send(encoded)
        self.swarm.welcomed(self)
        sender = asyncio.create_task(self._sender(ws))
        beater = asyncio.create_task(self._heartbeats())
        try:
            async for raw in ws:
                try:
                    messages = parse_master_messages(raw)
                except ValueError as e:  # as the agent does: dropped, the connection stays
                    self.swarm.count("bad_frames")
                    print(f"swarm: {self.node_id}: unreadable frame: {e}", file=sys.stderr)
                    continue
                for msg in messages:
                    self._handle(msg)
        finally:
            sender.cancel()
            beater.cancel()

    async def _sender(self, ws: Any) -> None:
        while True:
            while self.outbox:
                batch, self.outbox = self.outbox, []
                for frame in batch_frames(batch):
                    await ws.send(frame)
            self.outbox_ready.clear()
            await self.outbox_ready.wait()

    async def _heartbeats(self) -> None:
        while True:
            busy = {g for run in self.runs.values() for g in run.gpu_ids}
            samples = sample_gpus(self.gpus, "fake", busy=busy, rng=self.rng)
            telemetry = [
                GpuTelemetry(
                    index=s.index,
                    utilization_pct=s.utilization_pct,
                    memory_used_mb=s.memory_used_mb,
                    memory_total_mb=s.memory_total_mb,
                    temperature_c=s.temperature_c,
                    power_w=s.power_w,
                    simulated=True,
                    foreign_memory_mb=0,
                )
                for s in samples
            ]
            self.send(encode(Heartbeat(telemetry=telemetry)))
            self.swarm.count("heartbeats")
            await asyncio.sleep(self.heartbeat_interval)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, Launch):
            key = (msg.job_id, msg.epoch)
            if key in self.runs or key in self.exits:
                return  # a duplicate
            self.swarm.count("launched")
            run = self.runs[key] = Run(msg, self.swarm.next_pid())
            self.send(self._started(run))
            for i in range(self.swarm.lines):
                line = f"{msg.job_id}: line {i + 1} of {self.swarm.lines}\n".encode()
                offset, run.stdout = len(run.stdout), run.stdout + line
                out = Output(
                    job_id=run.job_id,
                    epoch=run.epoch,
                    stream="o",
                    data=line.decode(),
                    offset=offset,
                    end=len(run.stdout),
                )
                self.send(encode(out))
            loop = asyncio.get_running_loop()
            run.end = loop.call_later(self.swarm.run_time, self._end, key, 0)
        elif isinstance(msg, Kill):
            for key in [k for k in self.runs if k[0] == msg.job_id]:
                if msg.epoch is None or key[1] == msg.epoch:
                    self.swarm.count("killed")
                    self._end(key, 143)  # 128 + SIGTERM, as the agent reports a killed job
        elif isinstance(msg, ReservePort):
            self.swarm.count("ports")
            port = PortReserved(job_id=msg.job_id, epoch=msg.epoch, port=self.swarm.next_port())
            self.send(encode(port))
        elif isinstance(msg, Forget):
            self.exits.pop((msg.job_id, msg.epoch), None)
        elif isinstance(msg, SetHeartbeat):
            self.swarm.count("heartbeat_changes")
            self.heartbeat_interval = msg.heartbeat_interval

    def _started(self, run: Run) -> str:
        msg = Started(
            job_id=run.job_id,
            epoch=run.epoch,
            pid=run.pid,
            hostname=self.hostname,
            ip="127.0.0.1",
            time=run.started,
        )
        return encode(msg)

    def _end(self, key: tuple[str, int], code: int) -> None:
        run = self.runs.pop(key, None)
        if run is None:
            return
        if run.end is not None:
            run.end.cancel()
        self.swarm.count("exited")
        ended = Exited(job_id=run.job_id, epoch=run.epoch, exit_code=code, time=time.time())
        self.exits[key] = encode(ended)
        self.send(self.exits[key])


class Swarm:
    def __init__(self, args: argparse.Namespace) -> None:
        scheme = "wss" if args.tls else "ws"
        self.url = f"{scheme}://127.0.0.1:{args.port}/api/agent"
        self.token = os.environ.get("MGPU_JOIN_TOKEN")
        self.run_time = args.run_time
        self.lines = args.lines
        self.nodes = [SimNode(self, f"sim{i:04d}", args.gpus) for i in range(1, args.nodes + 1)]
        self.counters: dict[str, int] = {}
        self._welcomed: set[str] = set()
        self._all_welcomed = asyncio.Event()
        self._pid = 100000
        self._port = 20000

    def count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def next_pid(self) -> int:
        self._pid += 1
        return self._pid

    def next_port(self) -> int:
        self._port = 20000 + (self._port - 19999) % 40000
        return self._port

    def welcomed(self, node: SimNode) -> None:
        self._welcomed.add(node.node_id)
        if len(self._welcomed) == len(self.nodes):
            self._all_welcomed.set()

    def stats(self) -> dict[str, Any]:
        return {"welcomed": len(self._welcomed), **self.counters}

    async def main(self, join_timeout: float) -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        pending = b""

        def on_stdin() -> None:  # the driver's commands: "stats", or EOF to stop
            nonlocal pending
            data = os.read(0, 4096)
            if not data:
                done.set()
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip() == b"stats":
                    say(self.stats())

        loop.add_reader(0, on_stdin)
        t0 = time.monotonic()
        tasks = [loop.create_task(node.run()) for node in self.nodes]
        for task in tasks:
            task.add_done_callback(_report_crash)
        try:
            await asyncio.wait_for(self._all_welcomed.wait(), join_timeout)
            say({"joined": round(time.monotonic() - t0, 3), **self.stats()})
        except TimeoutError:
            say({"joined": None, **self.stats()})
        await done.wait()
        for task in tasks:
            task.cancel()


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        print(f"swarm: a node crashed: {task.exception()!r}", file=sys.stderr)


def say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def run_swarm(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(Swarm(args).main(args.join_timeout))


# ---- the driver: a master, the swarm, the measurements -------------------------------


class SwarmProcess:
    def __init__(self, cluster: LocalCluster, args: argparse.Namespace, nodes: int) -> None:
        argv = [sys.executable, __file__, "agents", "--port", str(cluster.port)]
        argv += ["--nodes", str(nodes), "--gpus", str(args.gpus), "--lines", str(args.lines)]
        argv += ["--run-time", str(args.run_time), "--join-timeout", str(args.join_timeout)]
        with open(cluster.root / "swarm.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=cluster.env,
                start_new_session=True,
            )
        self._selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not self._selector.select(timeout):
            raise AssertionError(f"the swarm said nothing for {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the swarm ended (exit code {self.proc.wait()})")
        return dict(json.loads(line))

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"stats\n")
        self.proc.stdin.flush()
        return self.read(30)

    def stop(self) -> None:
        kill_group(self.proc)
        self._selector.close()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


def load() -> float:
    return round(os.getloadavg()[0], 2)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def queue_json(cluster: LocalCluster, runs: int) -> dict[str, Any]:
    """`mgpu queue --json` as a whole process: median wall time, and the answer's size."""
    argv = [str(BIN / "mgpu"), "queue", "--json"]
    times, size = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, env=cluster.env, timeout=120)
        times.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise AssertionError(f"mgpu queue --json failed: {res.stderr.decode()}")
        size = len(res.stdout)
    with cluster.client() as client:
        client.queue()
        answers = []
        for _ in range(runs):
            t0 = time.perf_counter()
            client.queue()
            answers.append(time.perf_counter() - t0)
    return {
        "queue_json_ms": round(statistics.median(times) * 1000, 1),
        "queue_json_bytes": size,
        "queue_answer_ms": round(statistics.median(answers) * 1000, 1),
        "load_queue": load(),
    }


def throughput(cluster: LocalCluster, jobs: int, threads: int) -> dict[str, Any]:
    """`jobs` one-GPU jobs from `threads` threads; jobs/s from the first submit to the
    last end (the master's clock, which is this machine's)."""
    ids: list[list[str]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def submit(k: int) -> None:
        try:
            with cluster.client() as client:
                for _ in range(jobs // threads + (k < jobs % threads)):
                    ids[k].append(client.submit(["true"], gpus=1, env={}).id)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=submit, args=(k,)) for k in range(threads)]
    t0 = time.time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    submitted = time.time()
    if errors:
        raise errors[0]
    every = [i for chunk in ids for i in chunk]
    with cluster.client() as client:
        ended = client.wait_all(every, timeout=1800)
    states: dict[str, int] = {}
    for job in ended:
        states[job["state"]] = states.get(job["state"], 0) + 1
    last = max(job["end_time"] or time.time() for job in ended)
    return {
        "jobs": jobs,
        "completed": states.get("completed", 0),
        "states": states,
        "submit_s": round(submitted - t0, 3),
        "wall_s": round(last - t0, 3),
        "jobs_per_s": round(jobs / (last - t0), 1),
        "load_throughput": load(),
    }


def gang_jobs(cluster: LocalCluster, count: int) -> int:
    """Two-node jobs (their port reservation included); returns how many completed."""
    if not count:
        return 0
    with cluster.client() as client:
        ids = [client.submit(["true"], nodes=2, gpus_per_node=1, env={}).id for _ in range(count)]
        return sum(j["state"] == "completed" for j in client.wait_all(ids, timeout=300))


def measure(args: argparse.Namespace, nodes: int, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "gpus_per_node": args.gpus}
    root.mkdir(parents=True)
    config = None
    if args.heartbeat is not None:
        config = f"networking:\n  heartbeat_interval: {args.heartbeat}\n"
    cluster = LocalCluster(root, config)
    swarm: SwarmProcess | None = None
    try:
        cluster.start_master()
        assert cluster.master is not None
        master = psutil.Process(cluster.master.pid)
        out["load_start"] = load()
        swarm = SwarmProcess(cluster, args, nodes)
        joined = swarm.read(args.join_timeout + 60)
        out["join_s"] = joined["joined"]
        out["load_join"] = load()

        def online() -> int:
            listed = cluster.client().nodes()
            return sum(n["state"] == "online" and n["connected"] for n in listed)

        out["nodes_online"] = wait_for(
            lambda: online() if online() == nodes else None, timeout=60, what="nodes online"
        )
        time.sleep(min(5.0, args.idle))  # the joins' aftermath settles
        procs = [master, psutil.Process(swarm.proc.pid), psutil.Process()]
        before = [cpu_seconds(p) for p in procs]
        psutil.cpu_percent(None)
        t0 = time.monotonic()
        time.sleep(args.idle)
        idle = time.monotonic() - t0
        used = [cpu_seconds(p) - b for p, b in zip(procs, before, strict=True)]
        out["master_idle_cpu_pct"] = round(100 * used[0] / idle, 2)
        out["swarm_idle_cpu_pct"] = round(100 * used[1] / idle, 2)
        # The whole machine (2 cores = 100 %): what else ran beside the master and swarm.
        out["machine_busy_idle_pct"] = round(psutil.cpu_percent(None))
        out["load_idle"] = load()
        out.update(queue_json(cluster, args.queue_runs))
        out["master_rss_idle_mb"] = round(master.memory_info().rss / 2**20, 1)
        # CPU while the jobs flow: the master's, the swarm's, this process's (the
        # submitters); the master's per job is the figure the machine's load moves least.
        before = [cpu_seconds(p) for p in procs]
        psutil.cpu_percent(None)
        t0 = time.monotonic()
        out.update(throughput(cluster, args.jobs, args.threads))
        elapsed = time.monotonic() - t0
        used = [cpu_seconds(p) - b for p, b in zip(procs, before, strict=True)]
        for name, cpu in zip(("master", "swarm", "submitters"), used, strict=True):
            out[f"{name}_cpu_during_pct"] = round(100 * cpu / elapsed)
        out["master_cpu_ms_per_job"] = round(1000 * used[0] / args.jobs, 2)
        out["machine_busy_during_pct"] = round(psutil.cpu_percent(None))
        out["throughput_measured_s"] = round(elapsed, 1)
        out["master_rss_mb"] = round(master.memory_info().rss / 2**20, 1)
        out["gang_completed"] = gang_jobs(cluster, args.gang_jobs)
        out["swarm"] = swarm.stats()
    finally:
        if swarm is not None:
            swarm.stop()
        cluster.stop()
    return out


def plot(runs: list[dict[str, Any]], path: Path, target: float = 0.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [r["nodes"] for r in runs]
    rates = [r["jobs_per_s"] for r in runs]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    ax.plot(nodes, rates, marker="o")
    for n, r in zip(nodes, rates, strict=True):
        ax.annotate(f"{r:.0f}", (n, r), textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xscale("log")
    ax.set_xticks(nodes, [str(n) for n in nodes])
    if target:
        ax.axhline(target, linestyle="--", color="grey", linewidth=1)
        ax.annotate(
            f"target {target:g}",
            (nodes[0], target),
            xytext=(0, 4),
            textcoords="offset points",
            color="grey",
        )
    ax.set_ylim(bottom=0, top=max([*rates, target]) * 1.2)
    ax.set_xlabel(f"simulated nodes × {runs[0]['gpus_per_node']} GPUs")
    ax.set_ylabel("jobs/s end to end")
    ax.set_title(f"{runs[0]['jobs']} one-GPU jobs from {runs[0]['threads']} threads")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def python_floor(runs: int = 20) -> float:
    """Median ms of a bare `python -c pass`: how fast this (virtual) machine runs today, for
    comparing figures taken on different days."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 1)


def drive(args: argparse.Namespace) -> None:
    # Stopped with SIGTERM (a test's timeout), the master and the swarm are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_path = Path(args.out)
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "python_c_pass_ms": python_floor(),
        },
        "settings": {
            k: getattr(args, k)
            for k in ("gpus", "jobs", "threads", "run_time", "lines", "idle", "heartbeat")
        },
        "runs": [],
    }
    head = ("nodes", "join s", "idle CPU", "queue --json", "jobs/s", "RSS")
    print(" ".join(h.rjust(w) for h, w in zip(head, (6, 7, 9, 16, 7, 7), strict=True)))
    with tempfile.TemporaryDirectory(prefix="mgpu-swarm-") as tmp_name:
        tmp = Path(tmp_name)
        for nodes in args.nodes:
            # Each N's state dir is kept until every N ran: a master's thousands of output files,
            # deleted just before the next master creates its own, would cost the next run up to
            # ~0.5 ms of kernel CPU a job on an ext4 without a journal (this VM's), whose inode
            # allocator steps over every inode freed in the last minutes, one by one.
            run = measure(args, nodes, tmp / f"n{nodes}")
            run["threads"] = args.threads
            result["runs"].append(run)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(result, indent=2) + "\n")  # kept as each N ends
            print(
                f"{nodes:>6} {run['join_s']!s:>7} {run['master_idle_cpu_pct']:>8.1f}% "
                f"{run['queue_json_ms']:>7.0f} ms {run['queue_json_bytes'] / 1024:>5.0f} KB "
                f"{run['jobs_per_s']:>7.0f} {run['master_rss_mb']:>5.0f} MB"
                f"   (load {run['load_idle']} idle, {run['load_throughput']} busy; "
                f"{run['completed']}/{run['jobs']} completed; "
                f"master {run['master_cpu_ms_per_job']} ms CPU a job; "
                f"swarm CPU {run['swarm_idle_cpu_pct']:.1f}% idle, "
                f"{run['swarm_cpu_during_pct']}% busy)",
                flush=True,
            )
    if args.plot:
        plot(result["runs"], Path(args.plot), args.target)
    print(f"(a bare `python -c pass` took {result['machine']['python_c_pass_ms']} ms)")
    print(f"written to {out_path}" + (f" and {args.plot}" if args.plot else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role")
    a = sub.add_parser("agents", help="(internal) run the simulated nodes")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--tls", action="store_true")
    a.add_argument("--nodes", type=int, required=True)
    for q in (p, a):
        q.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
        q.add_argument("--run-time", type=float, default=0.0, help="seconds each job runs")
        q.add_argument("--lines", type=int, default=3, help="output lines per job")
        q.add_argument("--join-timeout", type=float, default=300.0)
    p.add_argument(
        "--nodes",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[50, 200, 1000],
        help="node counts, e.g. 50,200,1000",
    )
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measurement")
    p.add_argument("--queue-runs", type=int, default=10)
    p.add_argument("--gang-jobs", type=int, default=0, help="two-node jobs after the others")
    p.add_argument("--heartbeat", type=float, help="the master's heartbeat_interval")
    p.add_argument("--target", type=float, default=500.0, help="jobs/s line on the plot")
    p.add_argument("--out", default=str(RESULTS / "swarm.json"))
    p.add_argument("--plot", default=str(RESULTS / "swarm.png"), help="'' for none")
    args = p.parse_args()
    if args.role == "agents":
        run_swarm(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
