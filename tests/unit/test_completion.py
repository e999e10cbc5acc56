"""Shell completion: the commands and options of issues 13 and 14 and the seeds' names.

The scripts are generated from the parser (`mgpu.client.completion`), so these tests build
them in-process and then ask bash (and zsh, when installed) what they complete.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from mgpu.client.cli import build_parser
from mgpu.client.completion import ALIASES, PROGRAMS, completion_script

SEED_NAMES = [
    "mgpu_simple_master",
    "mgpu_simple_node",
    "mgpu_simple_client",
    "mgpu_master_server",
    "mgpu_srun_multinode",
]
ROUND_2_COMMANDS = ["hold", "release", "requeue", "update", "alloc", "reserve"]
JOB_OPTIONS = ["--signal", "--hold", "--notify", "--gpu-share", "--reservation"]


@pytest.fixture(scope="module")
def bash() -> str:
    return completion_script(build_parser(), "bash")


@pytest.fixture(scope="module")
def zsh() -> str:
    return completion_script(build_parser(), "zsh")


def complete(script: str, *words: str) -> list[str]:
    """What bash offers for the last of `words` (the line typed so far)."""
    prog = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _mgpu; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_every_console_script_completes(bash: str, zsh: str) -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    scripts = pyproject.split("[project.scripts]")[1].split("\n[")[0]
    names = {line.split("=")[0].strip() for line in scripts.splitlines() if "=" in line}
    assert names == {*PROGRAMS, *ALIASES}
    assert set(SEED_NAMES) <= names
    complete_line = next(line for line in bash.splitlines() if line.startswith("complete "))
    assert set(complete_line.split()[5:]) == names
    assert set(zsh.splitlines()[0].split()[1:]) == names


def test_round_2_commands_and_options(bash: str, zsh: str) -> None:
    top = complete(bash, "mgpu", "")
    assert set(ROUND_2_COMMANDS) <= set(top)
    assert complete(bash, "mgpu", "req") == ["requeue"]
    offered = complete(bash, "mgpu", "re")
    assert sorted(offered) == ["release", "report", "requeue", "reserve", "resume"]
    for command in ("submit", "srun", "alloc"):
        offered = complete(bash, "mgpu", command, "--")
        assert set(JOB_OPTIONS) <= set(offered), command
        assert ("--pty" in offered) == (command == "srun")
    assert "--gpus" in complete(bash, "mgpu", "alloc", "--gp")
    assert {"--time", "--priority", "--gpus", "--name"} <= set(
        complete(bash, "mgpu", "update", "--")
    )
    assert complete(bash, "mgpu", "reserve", "") == ["create", "list", "delete"]
    assert complete(bash, "mgpu", "reserve", "create", "--d") == ["--duration"]
    for name in ROUND_2_COMMANDS:
        assert f"\n        '{name}:" in zsh
    assert "'--signal[BSIG@SECONDS before the time limit or a preemption]:signal:'" in zsh
    assert "'1:reserve:(create list delete)'" in zsh


def test_node_and_token_options(bash: str) -> None:
    assert complete(bash, "mgpu", "node", "--gpu-") == ["--gpu-count", "--gpu-device-dir"]
    assert "--host" in complete(bash, "mgpu", "node", "--")
    assert complete(bash, "mgpu", "node", "re") == ["remove"]
    assert complete(bash, "mgpu", "token", "create", "--allow") == ["--allow-root"]


def test_aliases_complete_as_their_command(bash: str) -> None:
    assert complete(bash, "mgpu_simple_node", "--gpu-c") == ["--gpu-count"]
    assert complete(bash, "/opt/venv/bin/mgpu_node", "--master-h") == ["--master-host"]
    assert complete(bash, "mgpu_srun_multinode", "--pt") == ["--pty"]
    assert complete(bash, "mgpu_master_server", "--ins") == ["--insecure"]
    assert complete(bash, "mgpu_simple_master", "--v") == ["--verbose"]
    assert complete(bash, "mgpu_queue", "--a") == ["--all"]
    # The client is mgpu itself: a command first, then its options.
    assert "reserve" in complete(bash, "mgpu_simple_client", "")
    assert complete(bash, "mgpu_simple_client", "--host", "h", "submit", "--gpu-s") == [
        "--gpu-share"
    ]


# ---- zsh, typed into a real zsh ---------------------------------------------------------


def _zsh_completes(script: Path, typed: str, expect: str, timeout: float = 15.0) -> str:
    """Type `typed` and a Tab into an interactive zsh with the script loaded; return the
    screen once `expect` shows on it (the completed line, or the list offered)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a bare zsh with compinit
        os.environ.update(TERM="dumb", HOME=str(script.parent), PS1="READY> ")
        os.execvp("zsh", ["zsh", "-f", "-i"])
    screen = b""

    def read_until(text: bytes) -> None:
        nonlocal screen
        deadline = time.monotonic() + timeout
        while text not in screen:
            left = deadline - time.monotonic()
            assert left > 0, f"zsh did not show {text!r}: {screen[-2000:]!r}"
            if select.select([fd], [], [], left)[0]:
                screen += os.read(fd, 65536)

    try:
        os.write(fd, f"autoload -U compinit; compinit -u -D; source {script}\n".encode())
        os.write(fd, b"print -- SET''UP-DONE\n")  # quoted so the echo does not match
        read_until(b"SETUP-DONE")
        screen = b""
        os.write(fd, typed.encode() + b"\t")
        read_until(expect.encode())
        return screen.decode(errors="replace")
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.parametrize(
    ("typed", "expect"),
    [
        ("mgpu_simple_node --gpu-c", "mgpu_simple_node --gpu-count "),
        ("mgpu_srun_multinode --pt", "mgpu_srun_multinode --pty "),
        ("mgpu req", "mgpu requeue "),
        ("mgpu reserve cr", "mgpu reserve create "),
        ("mgpu submit --gpu-sh", "mgpu submit --gpu-share "),
        ("mgpu_simple_client --host h submit --notif", "submit --notify "),
    ],
)
def test_zsh_completes(zsh: str, tmp_path: Path, typed: str, expect: str) -> None:
    script = tmp_path / "_mgpu"
    script.write_text(zsh)
    subprocess.run(["zsh", "-n", str(script)], check=True, timeout=30)
    _zsh_completes(script, typed, expect)
