"""Killing a run never signals a process that only got the run's pid later: the shim's
process group and children are signalled only while its pid is still the shim (same start
time) or names no process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers import wait_for
from mgpu.agent import spawn
from mgpu.agent.launcher import Launcher, Running, RunRecord, process_start_time, same_process
from mgpu.agent.spawn import process_start_ticks, ticks_to_time


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process group leader with a child: what a reused pid could name."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(proc.pid).children(), timeout=10, what="its child")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its child too, whatever the test did
        proc.wait(timeout=10)


def run_of(pid: int, create_time: float, spool: Path) -> Running:
    rec = RunRecord(
        job_id="j1",
        epoch=1,
        pid=pid,
        create_time=create_time,
        start_time=create_time,
        out_path=str(spool / "j1.out"),
        err_path=str(spool / "j1.err"),
        exit_path=str(spool / "j1.exit"),
        tag="j1.1.test",
    )
    return Running(rec=rec)


def stop(launcher: Launcher, run: Running) -> None:
    """Everything that signals a run: a cancel (TERM, then KILL), the clean-up after its
    end, and a --signal warning to the whole job."""

    async def main() -> None:
        launcher.warn(run, signal.SIGTERM, top_only=False)
        launcher.kill(run, "cancelled", 0.0)
        assert run.kill_task is not None
        await run.kill_task
        await launcher.kill_leftovers(run)

    asyncio.run(main())


def test_a_reused_pid_is_not_signalled(tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    started = process_start_time(stranger.pid)
    assert started is not None
    launcher = Launcher(tmp_path / "spool", lambda *a: None)
    shim_before = run_of(stranger.pid, started - 1000.0, tmp_path)  # the shim, long ago
    assert launcher.pid_reused(shim_before)
    stop(launcher, shim_before)
    with pytest.raises(subprocess.TimeoutExpired):
        stranger.wait(timeout=0.5)
    (child,) = psutil.Process(stranger.pid).children()

    # The same calls do reach the process while the pid is still the run's (same start).
    same = run_of(stranger.pid, started, tmp_path)
    assert not launcher.pid_reused(same)
    stop(launcher, same)
    stranger.wait(timeout=10)
    child.wait(timeout=10)


def test_a_pid_with_no_process_is_not_reused(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    launcher = Launcher(tmp_path / "spool", lambda *a: None)
    assert not launcher.pid_reused(run_of(proc.pid, 1.0, tmp_path))


def test_a_clock_step_between_two_agents_does_not_hide_a_live_run(
    tmp_path: Path, stranger: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent restarted after the clock was stepped computes every start time anew from
    a moved boot time: a record's start ticks (since this boot) still match, so its live run
    is adopted and signalled as its own."""
    ticks = process_start_ticks(stranger.pid)
    assert ticks is not None
    started = ticks_to_time(ticks)  # as the agent that launched it recorded it
    run = run_of(stranger.pid, started, tmp_path)
    run.rec.start_ticks, run.rec.boot_id = ticks, spawn.BOOT_ID
    older = run_of(stranger.pid, started, tmp_path)  # an older agent's record: no ticks
    launcher = Launcher(tmp_path / "spool", lambda *a: None)
    assert same_process(run.rec) and same_process(older.rec)

    monkeypatch.setattr(spawn, "_boot_time", started - ticks / os.sysconf("SC_CLK_TCK") + 5.0)
    assert same_process(run.rec) is True and not launcher.pid_reused(run)
    assert same_process(older.rec) is False  # what every record was judged by before

    # Another boot's ticks say nothing: its record is judged by its start time.
    run.rec.boot_id = "another-boot"
    assert same_process(run.rec) is False


def _killed_within_the_grace_time(tmp_path: Path, script: str) -> None:
    """Start `script` as a shim (`sh -c`), kill its run once a `sleep` of it runs, and
    check that it wrote 143 (its `sleep 60` died of SIGTERM) to tmp_path/code well before
    the grace time's SIGKILL."""
    shim = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    try:
        wait_for(
            lambda: any(
                p.name() == "sleep" for p in psutil.Process(shim.pid).children(recursive=True)
            ),
            timeout=30,
            what="the fork's first sleep",
        )
        started = process_start_time(shim.pid)
        assert started is not None
        launcher = Launcher(tmp_path / "spool", lambda *a: None)
        run = run_of(shim.pid, started, tmp_path)

        async def main() -> None:
            async def exits() -> None:
                await asyncio.to_thread(shim.wait, 60)
                run.exited.set()

            waiting = asyncio.create_task(exits())
            launcher.kill(run, "cancelled", 30.0)
            assert run.kill_task is not None
            await asyncio.wait_for(run.kill_task, 60)
            await waiting

        began = time.monotonic()
        asyncio.run(main())
        took = time.monotonic() - began
        assert (tmp_path / "code").read_text().strip() == "143"  # `sleep 60` died of TERM
        assert took < 30, f"{took:.1f} s: it waited for the SIGKILL"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shim.pid, signal.SIGKILL)
        shim.wait(timeout=10)


def test_a_kill_reaches_the_job_a_fork_of_the_shim_became_after_it(tmp_path: Path) -> None:
    """The shim's subshell, forked but not yet the job's command when the kill's SIGTERM
    comes, still has the shim's trap: the signal is the trap's and is dropped, and the job
    it then becomes ran until the SIGKILL (srun -K read 137, not 143, on a loaded node).
    Here the fork keeps a trap for a moment, then becomes `sleep 60`: it is sent SIGTERM
    again once it has, and the run ends by it well within the grace time."""
    code = tmp_path / "code"
    _killed_within_the_grace_time(
        tmp_path, f"trap : TERM; (trap : TERM; sleep 0.5; exec sleep 60); echo $? > {code}"
    )


def test_a_kill_reaches_the_job_a_fork_of_the_output_wrapper_became_after_it(
    tmp_path: Path,
) -> None:
    """The same through a shell between the shim and the job, as the -o/-e wrapper is
    (agent/outputfiles.py): its subshell, forked with the wrapper's trap, has the
    wrapper's command line, not the shim's."""
    code = tmp_path / "code"
    wrapper = f"trap : TERM; (trap : TERM; sleep 0.5; exec sleep 60); echo $? > {code}"
    shim = f"trap : TERM; /bin/sh -c '{wrapper}' wrapper; exit $?"  # a fork, not an exec
    _killed_within_the_grace_time(tmp_path, shim)
