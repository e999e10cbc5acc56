"""The bin dir of Slurm's commands (mgpu.agent.slurmbin): its contents and modes, built once
per mgpu version, shims that fall back to the next Python, and a shared parent refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu.agent import loginbin, slurmbin


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


# ---- the login-shell wrappers (mgpu.agent.loginbin) -----------------------------------


@pytest.fixture
def login_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /usr/local/bin; no machine Slurm on the searched paths."""
    target = tmp_path / "usr-local-bin"
    target.mkdir()
    monkeypatch.setattr(loginbin, "SEARCHED", (str(target),))
    monkeypatch.setenv("PATH", "/nonexistent")
    loginbin._decided.clear()
    if os.geteuid() != 0:
        pytest.skip("the wrappers are a root agent's")
    return target


def test_wrappers_run_the_jobs_bin_dir_else_the_agents(
    login_target: Path, tmp_path: Path, built: Path
) -> None:
    assert loginbin.install(str(built), login_target)
    assert sorted(p.name for p in login_target.iterdir()) == sorted(slurmbin.SLURM_COMMANDS)
    bare = subprocess.run(
        [str(login_target / "scontrol"), "show", "hostnames", "n[1-2]"],
        capture_output=True,
        text=True,
        env={},
        timeout=60,
    )
    assert (bare.returncode, bare.stdout) == (0, "n1\nn2\n"), bare.stderr
    other = tmp_path / "jobs-bin"
    other.mkdir()
    (other / "scontrol").write_text("#!/bin/sh\necho the-jobs-own\n")
    (other / "scontrol").chmod(0o755)
    res = subprocess.run(
        [str(login_target / "scontrol")],
        capture_output=True,
        text=True,
        env={"MGPU_SLURM_BIN": str(other)},
        timeout=60,
    )
    assert res.stdout == "the-jobs-own\n"


def test_a_real_slurm_is_never_shadowed(login_target: Path, built: Path) -> None:
    assert loginbin.install(str(built), login_target)
    loginbin._decided.clear()  # an agent's next start, after Slurm was installed
    real = login_target / "sbatch"
    real.unlink()
    real.write_text("#!/bin/sh\necho real slurm\n")
    real.chmod(0o755)
    assert loginbin.real_slurm() == str(real)
    assert not loginbin.install(str(built), login_target)
    assert [p.name for p in login_target.iterdir()] == ["sbatch"]
    assert real.read_text() == "#!/bin/sh\necho real slurm\n"
