"""Real terminals and allocations end to end: `mgpu srun --pty` driven through a pseudo-
terminal of the test's own (as a person at a terminal), and `mgpu alloc` with its steps."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import BIN, LocalCluster, kill_group, local_cluster, wait_for

PY = "python3"


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    """In the child, before exec: the pty (stdin) becomes its controlling terminal, so that
    the kernel sends it SIGWINCH as a terminal emulator's shell gets it."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Term:
    """`mgpu ARGS` run on a pseudo-terminal of its own, the test at the keyboard."""

    def __init__(self, env: dict[str, str], *args: str, rows: int = 24, cols: int = 80) -> None:
        self.master, self.slave = os.openpty()
        _set_size(self.slave, rows, cols)
        self.attrs = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [str(BIN / "mgpu"), *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=env,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        self.seen = b""

    def read(self, timeout: float = 0.05) -> bytes:
        # poll, not select: a long test process may hold a descriptor past select's 1024.
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        if poller.poll(timeout * 1000):
            with contextlib.suppress(OSError):
                self.seen += os.read(self.master, 65536)
        return self.seen

    def expect(self, pattern: str, timeout: float = 30) -> re.Match[bytes]:
        """Wait for `pattern` (a regex) in what the terminal has shown so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern.encode(), self.read())
            if found:
                return found
        raise AssertionError(f"{pattern!r} never appeared; the terminal shows {self.seen!r}")

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read()
        return self.proc.wait(timeout=1)

    def restored(self) -> bool:
        """Is the terminal as it was before mgpu ran (termios attributes all equal)?"""
        return termios.tcgetattr(self.slave) == self.attrs

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def term(cluster: LocalCluster) -> Iterator[Any]:
    """Make `Term`s on the cluster (with `mgpu` on the PATH of the commands they run)."""
    made: list[Term] = []
    env = {**cluster.env, "PATH": f"{BIN}:{cluster.env.get('PATH', '')}"}

    def make(*args: str, rows: int = 24, cols: int = 80) -> Term:
        made.append(Term(env, *args, rows=rows, cols=cols))
        return made[-1]

    yield make
    for t in made:
        t.close()


def _only_job(cluster: LocalCluster) -> dict[str, Any]:
    (job,) = cluster.client().queue(all=True)["jobs"]
    return job


# ---- srun --pty ---------------------------------------------------------------------


def test_pty_is_a_terminal_of_the_users_size(cluster: LocalCluster, term: Any) -> None:
    script = "for f in 0 1 2; do test -t $f || echo NOTTY$f; done; echo size=$(stty size); exit 7"
    t = term("srun", "--pty", "--gpus", "1", "--", "sh", "-c", script, rows=37, cols=101)
    t.expect(r"size=37 101")
    assert t.wait() == 7  # the program's exit code
    assert b"NOTTY" not in t.seen
    assert t.restored()
    job = _only_job(cluster)
    assert (job["state"], job["exit_code"], job["pty"]) == ("failed", 7, True)
    logs = cluster.cli("logs", job["id"], check=True).stdout
    assert "size=37 101" in logs  # a terminal's output reaches mgpu logs too


def test_a_resize_reaches_the_program(cluster: LocalCluster, term: Any) -> None:
    # The handler exits: the signal may come before pause() is reached (which would then
    # wait for ever).
    program = (
        "import os, signal, sys\n"
        "def winch(*a):\n"
        "    print('winch', *os.get_terminal_size())\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGWINCH, winch)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    t = term("srun", "--pty", "--", PY, "-c", program, rows=24, cols=80)
    t.expect("ready")
    _set_size(t.slave, 50, 120)  # the user's window grows: the client gets SIGWINCH
    t.expect(r"winch 120 50")
    assert t.wait() == 0
    assert t.restored()


def _sleep_of(job_id: str) -> bool:
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] == ["sleep", "100"]:
            with contextlib.suppress(psutil.Error):
                if p.environ().get("MGPU_JOB_ID") == job_id:
                    return True
    return False


def test_ctrl_c_stops_the_program_not_the_shell(cluster: LocalCluster, term: Any) -> None:
    t = term("srun", "--pty", "--gpus", "1", "--", "bash", "--norc", "--noprofile", "-i")
    t.expect(r"[#$] $")  # bash's prompt
    job_id = cluster.client().queue()["jobs"][0]["id"]
    t.type(b"sleep 100; echo slept\r")
    wait_for(lambda: _sleep_of(job_id), what="the sleep in the job's bash")
    t.type(b"\x03")  # Ctrl-C, as a byte: the node's pty makes it SIGINT for the sleep
    t.type(b"echo alive-$((40+2))\r")
    t.expect("alive-42")
    assert b"\nslept" not in t.seen  # the sleep was interrupted: its `echo` never ran
    t.type(b"exit 3\r")
    assert t.wait() == 3
    assert t.restored()


def test_a_raw_mode_program_gets_each_key_at_once(cluster: LocalCluster, term: Any) -> None:
    program = (
        "import sys, tty\ntty.setraw(0)\nprint('ready', flush=True)\n"
        "print(repr(sys.stdin.read(1)), flush=True)\n"
    )
    t = term("srun", "--pty", "--", PY, "-c", program)
    t.expect("ready")
    t.type(b"x")  # no newline: only a raw terminal hands it over
    t.expect(r"'x'")
    assert t.wait() == 0
    assert t.restored()


def test_the_terminal_is_restored_when_the_master_goes_away(
    cluster: LocalCluster, term: Any
) -> None:
    t = term("srun", "--pty", "--", "sh", "-c", "echo ready; sleep 100")
    t.expect("ready")
    wait_for(lambda: not t.restored(), what="the terminal in raw mode")  # the program runs
    assert cluster.master is not None
    kill_group(cluster.master)  # the master is gone for good
    assert t.wait(timeout=60) != 0
    t.expect(r"mgpu: error: .*the job \w+ may still be running")
    assert t.restored()


def test_a_terminal_job_cancelled_while_queued(cluster: LocalCluster, term: Any) -> None:
    client = cluster.client()
    busy = [client.submit("sleep 300", gpus=4).id for _ in range(2)]  # every GPU taken
    wait_for(
        lambda: all(client.show(j)["state"] == "running" for j in busy), what="the jobs to start"
    )
    t = term("srun", "--pty", "--gpus", "1", "--", "bash")
    t.expect(r"queued")  # shown on one status line while it waits
    t.type(b"\x03")  # not raw yet: Ctrl-C cancels the job, as srun's does
    assert t.wait() == 130
    assert t.restored()
    (job,) = [j for j in client.queue(all=True)["jobs"] if j["id"] not in busy]
    assert job["state"] == "cancelled"
    for j in busy:
        client.cancel(j)


def test_without_a_terminal_srun_pty_goes_on_without_one(cluster: LocalCluster) -> None:
    res = cluster.cli("srun", "--pty", "--", "sh", "-c", "test -t 1 || echo plain", input="x\n")
    assert res.returncode == 0
    assert res.stdout == "plain\n"
    assert res.stderr == "mgpu: warning: not using a pseudo-terminal, stdin is not a terminal\n"


REFUSED = [
    (["submit", "--pty", "echo hi"], "--pty is for srun"),
    (["alloc", "--array", "0-3", "--", "true"], "--array does not apply to an allocation"),
    (["alloc", "--preemptible"], "--preemptible does not apply to an allocation"),
]


@pytest.mark.parametrize(("args", "sentence"), REFUSED)
def test_bad_terminal_and_allocation_requests_are_one_sentence(
    refusing_cluster: LocalCluster, args: list[str], sentence: str
) -> None:
    cluster = refusing_cluster
    res = cluster.cli(*args)
    assert res.returncode != 0
    assert res.stderr.startswith("mgpu: error: ") and sentence in res.stderr
    assert res.stderr.count("\n") == 1
    assert cluster.client().queue(all=True)["jobs"] == []


def test_a_terminal_on_several_nodes_is_refused(cluster: LocalCluster) -> None:
    from mgpu import MgpuError

    with pytest.raises(MgpuError, match="--pty runs one program on one node"):
        cluster.client().submit(["bash"], pty=True, nodes=2)


# ---- alloc ----------------------------------------------------------------------------


def _alloc_env(cluster: LocalCluster) -> dict[str, str]:
    return {**cluster.env, "PATH": f"{BIN}:{cluster.env.get('PATH', '')}"}


def _alloc(
    cluster: LocalCluster, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "mgpu"), "alloc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_alloc_env(cluster),
        stdin=subprocess.DEVNULL,
    )


def test_steps_run_together_on_the_allocations_gpus(cluster: LocalCluster) -> None:
    gate = cluster.root / "gate"
    gate.mkdir()
    # Each step waits for the other to have started: both finish only if they run at once.
    step = (
        "touch {g}/{me}; for i in $(seq 400); do [ -e {g}/{other} ] && break; sleep 0.05; done; "
        "[ -e {g}/{other} ] && echo {me}=$CUDA_VISIBLE_DEVICES@$MGPU_NODE_ID"
    )
    a = step.format(g=gate, me="A", other="B")
    b = step.format(g=gate, me="B", other="A")
    script = f"mgpu srun -- sh -c '{a}' & mgpu srun -- sh -c '{b}'; wait; echo id=$MGPU_JOB_ID"
    res = _alloc(cluster, "--gpus", "2", "--", "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    job = _only_job(cluster)
    (slot,) = job["allocation"]
    gpus = ",".join(map(str, slot["gpu_ids"]))
    lines = sorted(res.stdout.splitlines())
    assert lines == [
        f"A={gpus}@{slot['node_id']}",
        f"B={gpus}@{slot['node_id']}",
        f"id={job['id']}",
    ]
    granted = f"mgpu: allocation {job['id']} granted on {slot['node_id']} (GPUs {gpus})"
    assert granted in res.stderr.splitlines()
    assert (job["kind"], job["state"], job["exit_code"]) == ("allocation", "completed", 0)


def test_the_allocation_ends_with_its_command(cluster: LocalCluster) -> None:
    res = _alloc(
        cluster, "--gpus", "1", "--", "sh", "-c", "mgpu srun -- sh -c 'exit 4'; exit $(($? + 1))"
    )
    assert res.returncode == 5, res.stderr  # the step's code 4 reached the shell
    job = _only_job(cluster)
    assert (job["state"], job["exit_code"], job["reason"]) == ("failed", 5, "exit code 5")
    assert cluster.client().nodes()[0]["gpus"][0]["busy_job"] is None


def test_the_allocation_ends_at_its_time_limit(cluster: LocalCluster) -> None:
    script = "mgpu srun -- sleep 100; echo step=$?"
    res = _alloc(cluster, "--time", "0:04", "--", "sh", "-c", script)
    job = _only_job(cluster)
    assert (job["state"], job["reason"]) == ("timeout", "time limit reached")
    told = [line for line in res.stderr.splitlines() if "has ended" in line]
    assert told == [
        f"mgpu: job allocation {job['id']} has ended (timeout: time limit reached); "
        "its steps were stopped"
    ]
    assert res.stdout == "step=255\n"  # the step was killed with it
    assert res.returncode == 0  # the command's own code


def test_a_terminal_step_inside_an_allocation(cluster: LocalCluster, term: Any) -> None:
    inner = "test -t 0 && echo STEP-TTY; echo step-size=$(stty size); exit 6"
    t = term(
        "alloc",
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        f"mgpu srun --pty -- sh -c '{inner}'",
        rows=30,
        cols=90,
    )
    t.expect("step-size=30 90")
    assert t.wait() == 6
    assert b"STEP-TTY" in t.seen
    assert t.restored()


def test_a_killed_clients_allocation_is_ended_by_the_master(tmp_path: Path) -> None:
    config = "networking:\n  heartbeat_interval: 0.5\n  timeout: 3\n"
    with local_cluster(tmp_path, agents=1, gpus=2, config=config) as cluster:
        proc = subprocess.Popen(
            [str(BIN / "mgpu"), "alloc", "--gpus", "2", "--", "sleep", "300"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_alloc_env(cluster),
            start_new_session=True,
            text=True,
        )
        try:
            assert proc.stderr is not None
            assert "granted" in proc.stderr.readline()
            os.killpg(proc.pid, signal.SIGKILL)  # the client and its command, without a word
            proc.wait(timeout=10)

            def ended() -> dict[str, Any] | None:
                job = _only_job(cluster)
                return job if job["state"] != "running" else None

            job = wait_for(ended, timeout=20, what="the master to end the allocation")
            assert job["state"] == "cancelled" and "its client went away" in job["reason"]
            assert all(g["busy_job"] is None for g in cluster.client().nodes()[0]["gpus"])
            events = cluster.client().audit()
            assert any(e["kind"] == "cancel" and e["target"] == job["id"] for e in events)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_srun_inside_a_plain_job_is_still_a_new_job(cluster: LocalCluster) -> None:
    env = _alloc_env(cluster)
    outer = cluster.client().submit("mgpu srun --gpus 0 -- true", gpus=0, env=env).id
    done = cluster.client().wait(outer, timeout=60)
    assert done["state"] == "completed", json.dumps(done)
    assert len(cluster.client().queue(all=True)["jobs"]) == 2  # the inner srun: its own job
