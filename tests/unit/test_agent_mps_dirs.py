"""MPS's directories are the agent's own, and `shares_enforced` is what the agent achieved.

Any account could make MPS's default pipe directory (`/tmp/nvidia-mps`) first: the agent
then refused it and ran every share without MPS while the node said "enforced".  The daemon
the agent starts now lives in its own directory, a planted one is ignored, and the node and
each shared job say what was achieved (a recording fake `nvidia-cuda-mps-control`, as in
test_agent_mps.py; a directory chowned to `nobody` stands in for another account's)."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_mps import LIMITED, SHARED, UID, calls, control_of, fake_control, started

from mgpu.agent import mps, mpsdirs

NOBODY = pwd.getpwnam("nobody").pw_uid
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@pytest.fixture(autouse=True)
def no_default_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MPS's default directory is the machine's (a real `/tmp/nvidia-mps` would be used as
    the site's daemon): each test has its own, empty unless it makes one."""
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(tmp_path / "default-mps"))


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A world-traversable dir, as /var/lib is (pytest's own tmp dirs are root's alone,
    which no job user could traverse), with a sticky, world-writable `tmp` in it."""
    top = Path(tempfile.mkdtemp(prefix="mgpu-mps-", dir="/tmp"))
    top.chmod(0o755)
    (top / "tmp").mkdir()
    (top / "tmp").chmod(0o1777)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def agent_env(tmp_path: Path) -> dict[str, str]:
    """A fake control binary on PATH, and no MPS directory named: a default install."""
    env = fake_control(tmp_path)
    del env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]
    return env


def node_dir_in(top: Path) -> Path:
    """The agent's state dir and node dir, private as the agent makes them."""
    node = top / "state" / "node-n1"
    node.mkdir(parents=True)
    for d in (node.parent, node):
        d.chmod(0o700)
    return node


def plant(directory: Path) -> None:
    """What another account does first: the directory, and a `control` FIFO in it."""
    directory.mkdir()
    os.mkfifo(directory / "control")
    os.chown(directory / "control", NOBODY, NOBODY)
    os.chown(directory, NOBODY, NOBODY)


def as_nobody(*argv: str) -> int:
    return subprocess.run([*AS_NOBODY, *argv], capture_output=True, timeout=30).returncode


def test_a_planted_default_pipe_directory_does_not_turn_shares_off(
    tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    planted = shared / "tmp" / "nvidia-mps"  # /tmp/nvidia-mps, made by another account
    plant(planted)
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(planted))
    node = node_dir_in(shared)
    control = control_of(node, agent_env(tmp_path))
    mps._refused.clear()
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        assert control.enforced()
        got = started(control, SHARED, "a")
    pipes, logs = node / "mps" / "pipe", node / "mps" / "log"
    assert got["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
    assert got["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert calls(tmp_path) == [f"start {pipes} {logs}", *LIMITED]  # its own daemon, limited
    assert control.enforced() and control.share_held("a") is True
    assert control.note("a", "n1") is None
    assert f"{planted} is owned by uid {NOBODY}" in caplog.text and "not used" in caplog.text
    # A job that is not shared is kept off the planted one (CUDA would look there itself).
    whole = control.job_env({"CUDA_VISIBLE_DEVICES": "0"}, "w")
    assert whole == {"CUDA_MPS_PIPE_DIRECTORY": str(node / "no-mps")}
    # The chain down to the pipe: the agent's alone, traversable by the job users.
    for d, mode in ((node.parent, 0o711), (node, 0o711), (pipes.parent, 0o711), (pipes, 0o755)):
        st = d.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode), d


@needs_root
def test_another_account_reaches_the_pipe_but_can_plant_nothing(
    tmp_path: Path, shared: Path
) -> None:
    node = node_dir_in(shared)
    (node / "spool").mkdir(mode=0o700)
    control = control_of(node, agent_env(tmp_path))
    started(control, SHARED, "a", uid=NOBODY)
    pipes = node / "mps" / "pipe"
    assert control.share_held("a") is True  # its uid reaches the pipe
    assert as_nobody("test", "-p", str(pipes / "control")) == 0  # reached, as MPS needs
    assert as_nobody("ls", str(node)) != 0  # not listable
    assert as_nobody("ls", str(node / "spool")) != 0  # the rest stays private
    for d in (node.parent, node, pipes.parent, pipes, node / "mps" / "log"):
        assert as_nobody("mkdir", str(d / "planted")) != 0, d
    assert not any(p.name == "planted" for p in node.rglob("*"))


def test_a_pipe_directory_another_account_made_is_refused_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The site named a directory, and another account made it first: the node says that
    shares are not enforced, and why; the job is told; no daemon is started there."""
    env = fake_control(tmp_path)
    (tmp_path / "mps").mkdir(mode=0o755)
    os.chown(tmp_path / "mps", NOBODY, NOBODY)
    control = control_of(tmp_path, env)
    mps._refused.clear()
    assert not control.enforced()
    assert control.describe().startswith(f"not enforced: MPS pipe directory {tmp_path / 'mps'}")
    with caplog.at_level(logging.WARNING, logger="mgpu.agent"):
        assert started(control, SHARED, "a") == {}
    assert calls(tmp_path) == []
    assert control.share_held("a") is False
    note = control.note("a", "n1") or ""
    assert note.startswith("n1 does not hold GPU shares to their limits (MPS ")
    assert f"owned by uid {NOBODY}" in note and "without MPS" in caplog.text


def test_a_failed_start_is_what_the_node_says_until_a_start_succeeds(tmp_path: Path) -> None:
    env = fake_control(tmp_path)
    script = tmp_path / "bin" / mps.CONTROL
    working = script.read_text()
    script.write_text("#!/bin/sh\necho no GPU >&2\nexit 1\n")
    control = control_of(tmp_path, env)
    assert control.enforced()  # it has the binary: it can try
    assert started(control, SHARED, "a") == {}
    assert not control.enforced()  # it tried, and could not
    assert "-d failed" in control.describe() and control.describe().startswith("not enforced")
    assert control.share_held("a") is False and "-d failed" in (control.note("a", "n") or "")
    assert control.share_held("whole") is None
    script.write_text(working)  # the site fixed it: the next shared job starts it
    assert started(control, SHARED, "b", uid=0)["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps")
    assert control.enforced() and control.share_held("b") is True


def test_a_user_who_cannot_reach_the_pipe_directory_is_told(tmp_path: Path) -> None:
    """pytest's tmp dir is root's alone (0700): another user's CUDA would not find the
    daemon and would run as an ordinary context."""
    control = control_of(tmp_path, fake_control(tmp_path))
    started(control, SHARED, "mine", uid=0)
    started(control, SHARED, "theirs", uid=UID)
    assert control.share_held("mine") is True
    assert control.share_held("theirs") is False
    assert f"uid {UID} cannot reach {tmp_path / 'mps'}" in (control.note("theirs", "n") or "")


def test_directories_others_could_change_are_refused(tmp_path: Path, shared: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    (open_dir / "mps").mkdir(mode=0o755)
    open_dir.chmod(0o777)  # not sticky: anyone may move `mps` aside and put theirs there
    assert "writable by group or others" in (mpsdirs.chain_unsafe(str(open_dir / "mps")) or "")
    sticky = shared / "tmp" / "mine"  # /tmp is sticky: a directory of root's there is safe
    sticky.mkdir(mode=0o755)
    assert mpsdirs.chain_unsafe(str(sticky)) is None
    node = node_dir_in(shared)
    (node / "mps").symlink_to(shared / "tmp")  # the agent's own name, a link: refused
    with pytest.raises(OSError, match="symbolic link"):
        mpsdirs.make_own(node, traversable=True)
