"""The spawner process: its requests, replies and reported ends; its own environment; a
dead spawner started again.  (As the test's own ids: the uid switch is in the e2e tests.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu.agent.spawner import Spawned, Spawner
from mgpu.testing import wait_for

ME = (os.geteuid(), os.getegid(), os.getgroups())


@pytest.fixture
def spawner() -> Iterator[Spawner]:
    s = Spawner({"PATH": "/usr/bin:/bin", "SPAWNER_OWN": "1"})
    yield s
    s.stop()


def _spawn(
    spawner: Spawner, tmp_path: Path, script: str, env: dict[str, str] | None = None
) -> tuple[Spawned, Path]:
    out = tmp_path / "out"
    exit_file = tmp_path / "exit"
    fds = [
        os.open("/dev/null", os.O_RDONLY),
        os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        os.open(out, os.O_WRONLY | os.O_APPEND),
        os.open(exit_file, os.O_WRONLY | os.O_CREAT, 0o600),
    ]
    try:
        argv = ["/bin/sh", "-c", script, "sh"]
        return spawner.spawn(argv, env or {"PATH": "/usr/bin:/bin"}, ME, fds, 0o027), out
    finally:
        for fd in fds:
            os.close(fd)


def test_a_shim_gets_its_argv_env_fds_session_and_umask_and_its_end_is_reported(
    spawner: Spawner, tmp_path: Path
) -> None:
    script = 'echo "V=$V"; umask; pwd; ps -o sid= -p $$; echo $$; echo code >&3; '
    script += "ls /proc/$$/fd; exit 7"  # the shell's own descriptors (no pipe of its own)
    shim, out = _spawn(spawner, tmp_path, script, {"V": "x y", "PATH": "/usr/bin:/bin"})
    assert shim.wait(timeout=20) == 7
    v, umask, cwd, sid, pid, *fds = out.read_text().splitlines()
    assert (v, umask, cwd) == ("V=x y", "0027", "/")
    assert sorted(map(int, fds)) == [0, 1, 2, 3]  # what it was given, nothing of the spawner's
    assert int(sid) == int(pid) == shim.pid  # a session of its own
    assert (tmp_path / "exit").read_text() == "code\n"


def test_a_killed_shim_is_reported_as_popen_would(spawner: Spawner, tmp_path: Path) -> None:
    shim, _ = _spawn(spawner, tmp_path, "kill -KILL $$")
    assert shim.wait(timeout=20) == -signal.SIGKILL


def test_bad_requests_raise_what_popen_raises(spawner: Spawner, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="null"):
        _spawn(spawner, tmp_path, "true", {"V": "a\0b"})
    with pytest.raises(ValueError, match="environment variable name"):
        _spawn(spawner, tmp_path, "true", {"A=B": "1"})
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        with pytest.raises(FileNotFoundError):
            spawner.spawn(["/no/such/sh"], {}, ME, [fd, fd, fd], 0o022)
        with pytest.raises(OSError) as info:
            spawner.spawn(["/bin/echo", "x" * 3_000_000], {}, ME, [fd, fd, fd], 0o022)
        assert info.value.errno == 7  # E2BIG: too big for execve
    finally:
        os.close(fd)
    shim, out = _spawn(spawner, tmp_path, "echo still here")  # the spawner carries on
    assert shim.wait(timeout=20) == 0 and out.read_text() == "still here\n"


def test_the_spawner_has_only_the_environment_it_was_given(
    spawner: Spawner, tmp_path: Path
) -> None:
    shim, _ = _spawn(spawner, tmp_path, "true", {"LD_PRELOAD": "/tmp/evil.so", "SECRET": "s"})
    assert shim.wait(timeout=20) == 0
    assert spawner._proc is not None
    environ = Path(f"/proc/{spawner._proc.pid}/environ").read_bytes().split(b"\0")
    assert sorted(e for e in environ if e) == [b"PATH=/usr/bin:/bin", b"SPAWNER_OWN=1"]


def test_a_dead_spawner_is_started_again_and_its_shims_end_unreported(
    spawner: Spawner, tmp_path: Path
) -> None:
    gate_r, gate_w = os.pipe()
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        waiting = spawner.spawn(["/bin/sh", "-c", "read -r _"], {}, ME, [gate_r, out, out], 0o022)
    finally:
        os.close(gate_r)
        os.close(out)
    assert spawner._proc is not None
    first = spawner._proc.pid
    os.kill(first, signal.SIGKILL)
    spawner._proc.wait(timeout=10)
    os.close(gate_w)  # the shim goes on and ends, reparented: nobody reports it
    wait_for(lambda: not os.path.exists(f"/proc/{waiting.pid}/stat") or _zombie(waiting.pid))
    assert waiting.wait(timeout=2) is None  # the caller reads its exit file instead
    shim, out_path = _spawn(spawner, tmp_path, "echo again")
    assert spawner._proc is not None and spawner._proc.pid != first
    assert shim.wait(timeout=20) == 0 and out_path.read_text() == "again\n"


def test_the_spawner_exits_when_the_agent_closes_its_end(tmp_path: Path) -> None:
    spawner = Spawner({"PATH": "/usr/bin:/bin"})
    shim, _ = _spawn(spawner, tmp_path, "true")
    assert shim.wait(timeout=20) == 0
    proc = spawner._proc
    assert proc is not None
    spawner._sock.close()  # type: ignore[union-attr]  # as when the agent dies
    assert proc.wait(timeout=10) == 0
    spawner._sock = None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_spawner_imports_only_the_standard_library() -> None:
    import mgpu.agent.spawner as mod

    code = (
        "import sys; sys.argv = ['x', '-1']; import runpy\n"
        f"runpy.run_path({mod.__file__!r}, run_name='not_main')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mgpu', 'pydantic', "
        "'fastapi', 'psutil', 'websockets')))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "[]"
