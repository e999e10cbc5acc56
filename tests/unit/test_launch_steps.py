"""A launch is a sequence of steps; one that fails takes back all the steps before it made."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from pathlib import Path

import pytest

from mgpu.agent import jobenv, launchsteps
from mgpu.agent.launcher import JobError, Launcher, LaunchError, LaunchRequest
from mgpu.protocol import Grant, Launch

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


def test_a_run_with_other_ids_than_its_users_opens_and_runs_nothing_they_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root container runtime runs with the agent's ids (`user_ids` None) for a job of
    another user (`owner`): its -o/-e wrapper, or a job script, would open or run the
    user's paths with the agent's ids.  The launch is refused; the job's own user gets it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where job scripts are written
    spool, out = tmp_path / "spool", tmp_path / "o.txt"
    other = (os.geteuid() + 1, os.getegid() + 1, [])
    batch = LaunchRequest("j1", 1, ["echo", "hi"], {}, cwd=str(tmp_path),
                          output=(str(out), str(out), True), owner=other)  # fmt: skip
    script = LaunchRequest("j2", 1, [], {}, cwd=str(tmp_path), owner=other,
                           script=("job.sh", f"#!/bin/sh\necho ran > {out}\n"))  # fmt: skip

    async def scenario() -> str:
        launcher = Launcher(spool, lambda *a: None)
        with pytest.raises(JobError, match="its -o/-e files are opened only as its user"):
            launcher.launch(batch)
        with pytest.raises(JobError, match="a job script cannot run in --image"):
            launcher.launch(script)
        assert launcher.running == {} and list(spool.iterdir()) == []
        own = (os.geteuid(), os.getegid(), [])  # the agent's own job: as before
        run = launcher.launch(dataclasses.replace(batch, owner=own))
        await asyncio.wait_for(run.exited.wait(), 20)
        await launcher.kill_leftovers(run)
        return out.read_text()

    assert asyncio.run(scenario()) == "hi\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.txt", "spool"]  # no script dir


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent switches users")
def test_a_launch_that_names_no_user_is_not_run_as_root() -> None:
    msg = Launch(job_id="j1", epoch=1, argv=["true"], env={}, grant=Grant(gpus=[]))
    with pytest.raises(jobenv.UserError, match="names no user"):
        jobenv.run_as(msg, "node001")
    assert jobenv.run_as(msg.model_copy(update={"allow_root": True}), "node001") is None
    ids = jobenv.run_as(msg.model_copy(update={"user": "nobody"}), "node001")
    assert ids is not None and ids[0] == 65534
