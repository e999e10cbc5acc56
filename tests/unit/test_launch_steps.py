"""A launch is a sequence of steps; one that fails takes back all the steps before it made."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from mgpu.agent import launchsteps
from mgpu.agent.launcher import Launcher, LaunchError, LaunchRequest

BEFORE_SPAWN = [s.__name__ for s in launchsteps.STEPS if s is not launchsteps.spawn]

ARGV = ['cat "$MGPU_HOSTFILE"']
REQUEST = LaunchRequest(
    "j1",
    1,
    ARGV,
    {},
    note="a note",
    hostfile="node1 slots=1\n",
    script=("job.sh", '#!/bin/sh\necho "script $1"; sh -c "$1"\n'),
    pty=(24, 80),
)
"""Every step has work to do."""


def test_the_shim_is_started_last() -> None:
    assert launchsteps.STEPS[-1] is launchsteps.spawn


@pytest.mark.parametrize("failing", BEFORE_SPAWN)
def test_a_failed_step_leaves_no_file_or_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    def then_fail(step: launchsteps.Step) -> launchsteps.Step:
        def run(st: launchsteps.Launching) -> None:
            step(st)
            raise LaunchError(f"{step.__name__} went wrong")

        return run

    steps = tuple(then_fail(s) if s.__name__ == failing else s for s in launchsteps.STEPS)
    monkeypatch.setattr(launchsteps, "STEPS", steps)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where job scripts are written
    spool = tmp_path / "spool"

    async def scenario() -> None:
        launcher = Launcher(spool, lambda *a: None)
        open_before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(LaunchError, match=f"{failing} went wrong"):
            launcher.launch(REQUEST)
        assert set(os.listdir("/proc/self/fd")) <= open_before
        assert launcher.running == {}

    asyncio.run(scenario())
    assert list(spool.iterdir()) == []
    assert list(temp.iterdir()) == []


def test_the_steps_start_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same request, nothing failing: the script runs with the hostfile, on a terminal."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where job scripts are written
    spool = tmp_path / "spool"

    async def scenario() -> str:
        launcher = Launcher(spool, lambda *a: None)
        run = launcher.launch(REQUEST)
        await asyncio.wait_for(run.exited.wait(), 20)
        await launcher.kill_leftovers(run)
        assert run.terminal is not None
        run.terminal.drain()
        run.terminal.close()
        assert launcher.exit_code(run) == 0
        return Path(run.rec.out_path).read_text()

    out = asyncio.run(scenario()).replace("\r\n", "\n")
    assert out == f"mgpu: a note\nscript {ARGV[0]}\nnode1 slots=1\n"
