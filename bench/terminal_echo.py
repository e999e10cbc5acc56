"""Keystroke echo latency of `mgpu srun --pty` on loopback (issue 14, item 5).

A master and one agent with 1 fake GPU on this machine.  `mgpu srun --pty -- cat` runs on
a pseudo-terminal of the benchmark's own, as under a person's terminal emulator; the
benchmark types one byte at a time and times until its echo is back on that terminal.
The echo is made by the node's pty (its line discipline echoes as it reads), so each
sample is the whole way: client → master (attach WebSocket) → agent (its WebSocket) → the
node's pty, and back through the output path (the run's output file, offsets, the
master's output store, the attach WebSocket).

The floor is the same measurement on a bare local pty running `cat`: what a terminal
costs with no network at all.  Prints the figures and writes
bench/results/terminal_echo.json.  Not a test.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from mgpu.testing import BIN, LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "terminal_echo.json"
SAMPLES = int(os.environ.get("BENCH_ECHO_SAMPLES", 300))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))]


def _controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`argv` on a new pty; the benchmark at its keyboard."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        os.close(slave)

    def until(self, needle: bytes, timeout: float = 30) -> None:
        seen = b""
        deadline = time.monotonic() + timeout
        while needle not in seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise TimeoutError(f"{needle!r} never came; seen {seen[-200:]!r}")
            seen += os.read(self.master, 65536)

    def echo_times(self, n: int) -> list[float]:
        """Type n distinct letters, one at a time; seconds until each is echoed."""
        times = []
        for i in range(n):
            key = bytes([ord("a") + i % 26])
            t0 = time.perf_counter()
            os.write(self.master, key)
            self.until(key)
            times.append(time.perf_counter() - t0)
        return times

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        os.close(self.master)


def measure(argv: list[str], env: dict[str, str], ready: bytes | None) -> list[float]:
    term = Terminal(argv, env)
    try:
        if ready is not None:
            os.write(term.master, b"echo READY\r")
            term.until(ready)
        term.echo_times(20)  # warm-up: connections and caches
        return term.echo_times(SAMPLES)
    finally:
        term.close()


def summary(times: list[float]) -> dict[str, float]:
    ms = [t * 1000 for t in times]
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
    }


def main() -> None:
    env = dict(os.environ)
    floor = measure(["cat"], env, None)
    with tempfile.TemporaryDirectory(prefix="mgpu-echo-") as tmp:
        cluster = LocalCluster(Path(tmp))
        try:
            cluster.start_master()
            cluster.start_agent("node001", gpus=1)
            env = {**cluster.env, "PATH": f"{BIN}:{env.get('PATH', '')}"}
            argv = [str(BIN / "mgpu"), "srun", "--pty", "--", "sh"]
            mgpu = measure(argv, env, b"\r\nREADY")
        finally:
            cluster.stop()
    result = {
        "samples": SAMPLES,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "srun_pty": summary(mgpu),
        "local_pty_floor": summary(floor),
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
