"""A job killed by a signal, told apart from one that exits with 128+N: the shim
(mgpu.agent.spawn.SHIM) and the -o/-e wrapper (mgpu.agent.outputfiles) run as they are, by
/bin/sh; the shell's own line (`Killed`) never reaches the job's output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import pytest

from mgpu import exits
from mgpu.agent import outputfiles, spawn

# The shim without its gate (`read`: the agent opens it once the shim is in its cgroup).
SHIM = spawn.SHIM.replace("read -r _; ", "")
assert SHIM != spawn.SHIM


def start_shim(
    tmp_path: Path, argv: list[str], fd: int, out: IO[bytes], err: IO[bytes]
) -> subprocess.Popen[bytes]:
    """The shim in a session of its own, its exit file `fd`, in `tmp_path`."""
    return subprocess.Popen(
        ["/bin/sh", "-c", SHIM, str(fd), str(tmp_path), *argv],
        pass_fds=(fd,),
        stdout=out,
        stderr=err,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def run_shim(tmp_path: Path, argv: list[str]) -> tuple[int, bytes, bytes, tuple[int | None, ...]]:
    """The shim's status, the job's stdout and stderr, and what read_exit makes of its
    exit file (one an earlier, longer run wrote to first, then blanked as the agent does)."""
    exit_path = tmp_path / "exit"
    exit_path.write_bytes(b"Segmentation fault (core dumped)\n139\nleft over\n")
    fd = os.open(exit_path, os.O_RDWR)
    # Files, as the agent's spool: the wrapper's copies reopen them to read.
    with open(tmp_path / "out", "w+b") as out, open(tmp_path / "err", "w+b") as err:
        try:
            os.pwrite(fd, b"\n", 0)
            proc = start_shim(tmp_path, argv, fd, out, err)
            proc.wait(timeout=60)
        finally:
            os.close(fd)
        out.seek(0)
        err.seek(0)
        said = out.read(), err.read()
    return proc.returncode, *said, spawn.read_exit(str(exit_path))


@pytest.mark.parametrize(
    ("script", "code", "signum"),
    [
        ("echo out; kill -KILL $$", 137, 9),
        ("echo out; kill -TERM $$", 143, 15),
        ("echo out; exit 137", 137, None),
        ("echo out; exit 3", 3, None),
        ("echo out", 0, None),
    ],
)
def test_the_shim_tells_a_signal_from_an_exit(
    tmp_path: Path, script: str, code: int, signum: int | None
) -> None:
    status, out, err, ended = run_shim(tmp_path, ["bash", "-c", script])
    assert (status, out, err) == (code, b"out\n", b"")  # no `Killed` line in the output
    assert ended == (code, signum)


def test_the_job_s_own_errors_still_reach_its_stderr(tmp_path: Path) -> None:
    status, _, err, ended = run_shim(tmp_path, ["no-such-program-here"])
    assert status == 127 and ended == (127, None)
    assert err.endswith(b"no-such-program-here: not found\n")


def test_a_blanked_exit_file_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "exit"
    path.write_bytes(b"\nilled\n137\n")
    assert spawn.read_exit(str(path)) == (None, None)
    assert spawn.read_exit(str(tmp_path / "absent")) == (None, None)


@pytest.mark.parametrize(("script", "signum"), [("kill -KILL $$", 9), ("exit 137", None)])
def test_the_output_wrapper_dies_of_its_script_s_signal(
    tmp_path: Path, script: str, signum: int | None
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    job = ["/bin/bash", "-c", f"echo dying; {script}"]
    argv = outputfiles.wrap(job, str(work), "o.out", "o.out", False)
    status, out, err, ended = run_shim(tmp_path, argv)
    assert (status, ended) == (137, (137, signum))
    assert (out, err) == (b"dying\n", b"")
    assert (work / "o.out").read_text() == "dying\n"
    assert sorted(p.name for p in work.iterdir()) == ["o.out"]  # no core file


def test_exit_codes_as_people_and_shells_read_them() -> None:
    assert exits.describe(3) == "exit code 3"
    assert exits.describe(-9) == "killed by signal 9 (SIGKILL)"
    assert exits.describe(-99) == "killed by signal 99"
    assert [exits.shell_status(c) for c in (0, 3, -9, -15, 300)] == [0, 3, 137, 143, 1]


def test_a_cancel_s_sigterm_leaves_the_wrapper_telling_the_script_s_own_exit(
    tmp_path: Path,
) -> None:
    # SIGTERM to the whole group, as a cancel sends it: the script traps it and exits 3;
    # the wrapper's subshell that waits for it survives to tell that, and says nothing.
    work = tmp_path / "work"
    work.mkdir()
    script = "trap 'echo got TERM; exit 3' TERM; echo started; while :; do :; done"
    argv = outputfiles.wrap(["/bin/bash", "-c", script], str(work), "o.out", "o.out", False)
    exit_path = tmp_path / "exit"
    exit_path.write_bytes(b"\n")
    fd = os.open(exit_path, os.O_RDWR)
    with open(tmp_path / "out", "w+b") as out:
        proc = start_shim(tmp_path, argv, fd, out, out)
        os.close(fd)
        try:
            deadline = time.monotonic() + 60
            while b"started" not in (tmp_path / "out").read_bytes():
                assert time.monotonic() < deadline, "the script never started"
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=60) == 3
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert spawn.read_exit(str(exit_path)) == (3, None)
    assert (work / "o.out").read_text() == "started\ngot TERM\n"
