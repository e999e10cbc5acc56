"""A root runtime's view of a container job's working directory is the directory the job's
user entered, pinned, even when the user swaps the path for a link afterwards
(mgpu.agent.bindmount, privileged.enter_dir, site.SiteHooks.wrap)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mgpu.agent import bindmount, privileged
from mgpu.agent.containers import Runtime
from mgpu.agent.launcher import JobError
from mgpu.agent.site import SiteHooks
from mgpu.protocol import Grant, Launch

NOBODY = (65534, 65534, [65534])

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching users and mounting need root")


@pytest.fixture
def tree() -> Iterator[Path]:
    """/tmp/X (0755): `exp`, the job user's directory with `mine.txt`; `other` (another
    account's 0700 home) with `data/secret.txt`, readable by all but out of reach."""
    base = Path(tempfile.mkdtemp(prefix="mgpu-test-"))
    base.chmod(0o755)
    exp = base / "exp"
    exp.mkdir()
    (exp / "mine.txt").write_text("mine\n")
    os.chown(exp, NOBODY[0], NOBODY[1])
    data = base / "other" / "data"
    data.mkdir(parents=True)
    (data / "secret.txt").write_text("secret\n")
    data.chmod(0o755)
    (base / "other").chmod(0o700)
    yield base
    shutil.rmtree(base)  # nothing mounted in it: mount points are in the spool


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Path]:
    spool = tmp_path / "spool"
    spool.mkdir()
    yield spool
    for entry in spool.iterdir():  # before pytest removes the tree: never through a mount
        if entry.name.endswith(bindmount.SUFFIX):
            bindmount.release(str(entry))


def _swap_for_link(tree: Path) -> None:
    """What the user does between the check and the mount: `exp` becomes a link to a
    directory they may not traverse."""
    (tree / "exp").rename(tree / "exp.old")
    (tree / "exp").symlink_to(tree / "other" / "data")


def _hooks(spool: Path) -> SiteHooks:
    launcher: Any = SimpleNamespace(spool=spool)
    hooks = SiteHooks(SimpleNamespace(), launcher, "n1")
    hooks.runtime = Runtime("podman", "/usr/bin/podman")
    return hooks


def _launch(cwd: str, job_id: str = "j1") -> Launch:
    none = Grant(gpus=[])
    return Launch(job_id=job_id, epoch=1, argv=["true"], env={}, grant=none, image="img:1", cwd=cwd)


@root_only
def test_the_mount_is_the_directory_entered_not_what_the_name_means_later(
    tree: Path, spool: Path
) -> None:
    assert privileged.enter_dir(str(tree / "other" / "data"), NOBODY) is None
    fd = privileged.enter_dir(str(tree / "exp"), NOBODY)
    assert fd is not None
    try:
        _swap_for_link(tree)
        # By name, root now reaches the other account's files: what `-v cwd:cwd` mounted.
        assert os.listdir(tree / "exp") == ["secret.txt"]
        target = str(spool / f"j1.1{bindmount.SUFFIX}")
        bindmount.bind(fd, target)
    finally:
        os.close(fd)
    assert bindmount.mounted(target)
    assert os.listdir(target) == ["mine.txt"]
    assert os.stat(target).st_ino == os.stat(tree / "exp.old").st_ino
    assert bindmount.release(target)
    assert not bindmount.mounted(target) and not os.path.lexists(target)
    assert os.listdir(tree / "exp.old") == ["mine.txt"]  # unmounting removed nothing
    assert not bindmount.release(target)


@root_only
def test_a_root_runtime_is_given_the_pinned_mount_point(
    tree: Path, spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = privileged.enter_dir

    def enter_then_swap(path: str, ids: tuple[int, int, list[int]]) -> int | None:
        fd = real(path, ids)
        _swap_for_link(tree)  # after the check, before the mount
        return fd

    monkeypatch.setattr(privileged, "enter_dir", enter_then_swap)
    hooks = _hooks(spool)
    cwd = str(tree / "exp")
    argv, _, ids, _ = hooks.wrap(_launch(cwd), {}, NOBODY)
    assert ids is None  # the runtime runs as root: the case that needs the pin
    target = f"{spool}/j1.1{bindmount.SUFFIX}"
    assert argv[argv.index("-v") + 1] == f"{target}:{cwd}"
    assert argv[argv.index("-w") + 1] == cwd
    assert os.listdir(target) == ["mine.txt"]
    hooks.discard("j1", 1)  # the launch failed after all: the mount goes
    assert not bindmount.mounted(target) and not os.path.lexists(target)


@root_only
def test_a_directory_the_user_cannot_enter_is_refused_and_nothing_mounted(
    tree: Path, spool: Path
) -> None:
    hooks = _hooks(spool)
    cwd = str(tree / "other" / "data")
    with pytest.raises(JobError, match=f"cannot enter the working directory {cwd}"):
        hooks.wrap(_launch(cwd), {}, NOBODY)
    assert list(spool.iterdir()) == []


@root_only
def test_the_start_up_sweep_unmounts_what_no_run_record_names(tree: Path, spool: Path) -> None:
    hooks = _hooks(spool)
    for job_id in ("kept", "left"):
        hooks.wrap(_launch(str(tree / "exp"), job_id), {}, NOBODY)
    kept, left = (f"{spool}/{j}.1{bindmount.SUFFIX}" for j in ("kept", "left"))
    assert bindmount.mounted(kept) and bindmount.mounted(left)
    hooks.sweep([("kept", 1)])
    assert bindmount.mounted(kept) and os.listdir(kept) == ["mine.txt"]
    assert not bindmount.mounted(left) and not os.path.lexists(left)


@pytest.mark.parametrize("name", ["podman", "apptainer"])
def test_a_colon_in_the_directory_is_refused(tmp_path: Path, name: str) -> None:
    """After a `:` the runtimes read mount options (podman's `U` chowns the source)."""
    cwd = tmp_path / "a:U"
    cwd.mkdir()
    hooks = _hooks(tmp_path)
    hooks.runtime = Runtime(name, f"/usr/bin/{name}")
    with pytest.raises(JobError, match="cannot mount a directory with ':' in its name"):
        hooks.wrap(_launch(str(cwd)), {}, None)


@root_only
def test_a_prepared_launch_that_fails_after_the_mount_leaves_no_mount(
    tree: Path, spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container job's launch comes after its image check (SiteHooks.prepare); when it
    fails in a way nobody foresaw (an OSError the launcher does not sort, say) after
    `wrap` mounted the working directory, the mount goes with the failed launch, as on
    the agent's direct launch path (Agent._handle), not only at the next agent start."""
    import asyncio

    from mgpu.agent import containers

    async def present(*_: Any) -> bool:
        return True

    monkeypatch.setattr(containers, "image_present", present)
    ends: list[Any] = []
    target = f"{spool}/j1.1{bindmount.SUFFIX}"

    def launch(msg: Launch) -> None:
        hooks.wrap(msg, {}, NOBODY)
        assert bindmount.mounted(target)
        raise OSError(28, "No space left on device")

    host = SimpleNamespace(
        launch=launch, report_exit=ends.append, run_as=lambda _: NOBODY, share_setup=lambda _: None
    )
    launcher: Any = SimpleNamespace(spool=spool, find=lambda *_: None)
    hooks = SiteHooks(host, launcher, "n1")
    hooks.runtime = Runtime("podman", "/usr/bin/podman")

    async def scenario() -> None:
        assert hooks.prepare(_launch(str(tree / "exp")))
        task = hooks.pending[("j1", 1)].task
        assert task is not None
        with pytest.raises(OSError):
            await task
        await asyncio.sleep(0)  # its done callback

    asyncio.run(scenario())
    assert [e.launch_error for e in ends] == [
        "the agent failed to prepare the job: [Errno 28] No space left on device"
    ]
    assert not bindmount.mounted(target) and not os.path.lexists(target)
    assert list(spool.iterdir()) == []  # nor its env file


@root_only
def test_a_prepared_launch_enters_the_directory_off_the_event_loop(
    tree: Path, spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entering the directory as its user can hang for seconds (a hung NFS server, a
    user's own FUSE mount): done while the launch is prepared, in a thread, the agent's
    loop goes on meanwhile, and the launch gets the mount point it made."""
    import asyncio
    import time

    from mgpu.agent import containers

    async def present(*_: Any) -> bool:
        return True

    real = privileged.enter_dir

    def slow(path: str, ids: tuple[int, int, list[int]]) -> int | None:
        time.sleep(0.5)  # the slow file system, not a wait for anything
        return real(path, ids)

    monkeypatch.setattr(containers, "image_present", present)
    monkeypatch.setattr(privileged, "enter_dir", slow)
    argvs: list[list[str]] = []
    host = SimpleNamespace(
        launch=lambda msg: argvs.append(hooks.wrap(msg, {}, NOBODY)[0]),
        report_exit=lambda msg: pytest.fail(f"the launch failed: {msg}"),
        run_as=lambda _: NOBODY,
        share_setup=lambda _: None,
    )
    launcher: Any = SimpleNamespace(spool=spool, find=lambda *_: None)
    hooks = SiteHooks(host, launcher, "n1")
    hooks.runtime = Runtime("podman", "/usr/bin/podman")
    cwd = str(tree / "exp")

    async def scenario() -> int:
        assert hooks.prepare(_launch(cwd))
        task = hooks.pending[("j1", 1)].task
        assert task is not None
        turns = 0
        while not task.done():  # the loop's turns while the launch is prepared
            await asyncio.sleep(0.01)
            turns += 1
        await task
        return turns

    turns = asyncio.run(scenario())
    assert turns >= 20  # ~50 in 0.5 s; a loop held by the entering gets one or two
    (argv,) = argvs
    target = f"{spool}/j1.1{bindmount.SUFFIX}"
    assert argv[argv.index("-v") + 1] == f"{target}:{cwd}"
    assert os.listdir(target) == ["mine.txt"]
    hooks.discard("j1", 1)
    assert not bindmount.mounted(target)
