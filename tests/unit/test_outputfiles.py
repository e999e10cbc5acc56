"""The -o/-e wrapper (mgpu.agent.outputfiles) run as it is, by /bin/sh, on files under a
temp dir: what it refuses to open (and that it refuses in time, before writing), and that
once it has checked a file it writes to that file only, whatever becomes of its name.
An attacker's swap at the worst moment is played by a stand-in for a command the wrapper
runs (`stat`, `cat`) that swaps the name, then runs the real command."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu.agent import outputfiles

JOB = ["/bin/sh", "-c", "echo out; echo err >&2"]
FAILED = outputfiles.OPEN_FAILED


def run_wrapper(
    work: Path, out: str, err: str, append: bool = False, path: str | None = None
) -> tuple[int, str]:
    """The wrapper's exit status and the sentence open_failure finds in its stderr."""
    spool = work.parent / "spool"
    spool.mkdir(exist_ok=True)
    env = {"PATH": path or os.environ["PATH"]}
    with open(spool / "out", "w+b") as so, open(spool / "err", "w+b") as se:
        argv = outputfiles.wrap(JOB, str(work), out, err, append)
        code = subprocess.run(argv, stdout=so, stderr=se, env=env, timeout=60).returncode
    said = outputfiles.open_failure(code, str(spool / "err"))
    return code, said or ""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def stand_in(tmp_path: Path, name: str, swap: str) -> str:
    """A PATH whose `name` runs `swap` (once) and then the real command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    real = shutil.which(name)
    assert real is not None
    once = tmp_path / f"{name}.swapped"
    script = f'#!/bin/sh\n[ -e {once} ] || {{ : >{once}; {swap}; }}\nexec {real} "$@"\n'
    (bin_dir / name).write_text(script)
    (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_file_and_dev_null_are_written_as_before(work: Path) -> None:
    (work / "o.txt").write_text("from before\n")
    assert run_wrapper(work, "o.txt", "/dev/null", append=True) == (0, "")
    assert (work / "o.txt").read_text() == "from before\nout\n"
    assert run_wrapper(work, "o.txt", "o.txt") == (0, "")
    assert sorted((work / "o.txt").read_text().split()) == ["err", "out"]


def test_a_final_link_is_refused_and_nothing_is_made_through_it(work: Path) -> None:
    private = work.parent / "private"
    private.write_text("mine\n")
    (work / "link").symlink_to(private)
    (work / "dangling").symlink_to(work.parent / "new")
    said = f"Could not open stdout file {work}/link: is a symbolic link"
    assert run_wrapper(work, "link", "link") == (FAILED, said)
    said = f"Could not open stderr file {work}/dangling: is a symbolic link"
    assert run_wrapper(work, "/dev/null", "dangling") == (FAILED, said)
    assert private.read_text() == "mine\n" and not (work.parent / "new").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another account is made by chown")
def test_a_file_of_another_account_is_refused(work: Path) -> None:
    theirs = work / "theirs"
    theirs.write_text("")
    theirs.chmod(0o666)
    os.chown(theirs, 65534, 65534)
    said = f"Could not open stdout file {theirs}: not owned by root"
    assert run_wrapper(work, "theirs", "theirs") == (FAILED, said)
    assert theirs.read_text() == ""


def test_a_fifo_or_a_directory_is_refused_without_waiting(work: Path) -> None:
    os.mkfifo(work / "fifo")  # its open for writing would wait for a reader for ever
    said = f"Could not open stdout file {work}/fifo: not a regular file"
    assert run_wrapper(work, "fifo", "fifo") == (FAILED, said)
    (work / "dir").mkdir()
    said = f"Could not open stdout file {work}/dir: Is a directory"
    assert run_wrapper(work, "dir", "dir") == (FAILED, said)


def test_a_link_swapped_in_after_the_open_is_refused(tmp_path: Path, work: Path) -> None:
    """The name is checked after the open (its lstat against the descriptor): a link put
    in its place in between, even to the very file opened, is refused."""
    name = work / "o.txt"
    path = stand_in(tmp_path, "stat", f"mv {name} {name}.moved; ln -s {name}.moved {name}")
    said = f"Could not open stdout file {name}: is a symbolic link"
    assert run_wrapper(work, "o.txt", "o.txt", path=path) == (FAILED, said)
    assert (work / "o.txt.moved").read_text() == ""


def test_a_name_swapped_after_the_check_changes_nothing(tmp_path: Path, work: Path) -> None:
    """Once opened and checked, the file is written through its descriptor only: a link
    put in place of its name then (to its owner's private file) gets nothing."""
    name, private = work / "o.txt", tmp_path / "private"
    private.write_text("mine\n")
    path = stand_in(tmp_path, "cat", f"mv {name} {name}.moved; ln -s {private} {name}")
    assert run_wrapper(work, "o.txt", "o.txt", path=path) == (0, "")
    assert private.read_text() == "mine\n"
    assert sorted((work / "o.txt.moved").read_text().split()) == ["err", "out"]
