"""The bin dir of Slurm's commands (mgpu.agent.slurmbin): its contents and modes, built once
per mgpu version, shims that fall back to the next Python, and a shared parent refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu.agent import slurmbin


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    slurmbin._built.clear()
    return slurmbin.ensure(tmp_path_factory.mktemp("slurmbin") / "bins")


def test_the_dir_holds_the_commands_and_their_code(built: Path) -> None:
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted([*slurmbin.SLURM_COMMANDS, "mgpu"])
    home = built.parent
    assert (home / "lib" / "mgpu" / "slurm" / "squeue.py").is_file()
    assert list((home / "lib" / "mgpu" / "slurm").glob("__pycache__/squeue.*.pyc"))
    for path in [home, *home.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        want = 0o755 if path.is_dir() or path.parent == built else 0o644
        assert mode == want, path


def test_built_once_per_version(built: Path) -> None:
    root = built.parent.parent
    assert slurmbin.ensure(root) == built  # this process's cache
    slurmbin._built.clear()
    before = built.stat().st_mtime_ns
    assert slurmbin.ensure(root) == built  # another process: the same dir
    assert built.stat().st_mtime_ns == before
    assert [p.name for p in root.iterdir()] == [built.parent.name]


def test_a_shim_runs_the_command(built: Path) -> None:
    res = subprocess.run(
        [str(built / "scontrol"), "show", "hostnames", "gpu[01-02]"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert (res.returncode, res.stdout, res.stderr) == (0, "gpu01\ngpu02\n", "")


def test_a_shim_tries_the_next_python(tmp_path: Path, built: Path) -> None:
    shim = tmp_path / "squeue"
    lib = built.parent / "lib"
    shim.write_text(slurmbin._shim("sinfo", lib, ["/nonexistent/python3", sys.executable]))
    shim.chmod(0o755)
    res = subprocess.run([str(shim), "--usage"], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout.split()[0]) == (0, "Usage:"), res.stderr
    shim.write_text(slurmbin._shim("sinfo", lib, ["/nonexistent/python3"]))
    res = subprocess.run([str(shim)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 127
    assert (
        res.stderr
        == "sinfo: error: no Python 3.11 this account may run (tried /nonexistent/python3)\n"
    )


def test_a_dir_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    slurmbin._built.clear()
    with pytest.raises(OSError, match="not this account's alone"):
        slurmbin.ensure(shared)


def test_mgpu_tries_its_own_python_first(built: Path) -> None:
    def first(name: str) -> str:
        return (built / name).read_text().split("for py in ", 1)[1].split()[0]

    assert first("mgpu") == sys.executable
    assert first("squeue") == slurmbin.pythons()[0]  # the system's python3, where there is one


def test_old_versions_are_pruned(tmp_path: Path) -> None:
    for name, age in (("old", 8 * 86400), ("recent", 86400), (".build-x", 7200)):
        (tmp_path / name / "bin").mkdir(parents=True)
        os.utime(tmp_path / name, (0, 1e9 - age))
    slurmbin._prune(tmp_path, now=1e9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recent"]
