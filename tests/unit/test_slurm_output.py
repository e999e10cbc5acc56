"""Every Slurm command writes through mgpu.slurm.output: on a terminal another user's
control characters (an OSC 52 clipboard write, a screen clear) are shown as escapes, never
obeyed.  `scontrol show job` of a hostile command is read on a real pty, and every module
of mgpu.slurm is walked for a write that goes around the one writer."""

from __future__ import annotations

import ast
import io
import os
import pty
import select
import sys
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import mgpu.slurm
from mgpu.client.api import RequestError
from mgpu.slurm import output, scancel, scontrol

HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b31m"
"""An OSC 52 clipboard write, a screen clear and a C1 CSI: none may reach a terminal."""

JOB = {
    "id": "7",
    "user": "mallory",
    "state": "running",
    "name": f"train{HOSTILE}",
    "command": f"python x.py{HOSTILE}",
    "cwd": f"/home/mallory/{HOSTILE}",
    "submit_time": 1700000000.0,
    "allocation": [{"node_id": "n1"}],
}


class FakeClient:
    def show(self, job_id: str) -> dict[str, Any]:
        return dict(JOB, id=job_id)

    def hold(self, job_id: str) -> None:
        raise RequestError(409, f"job {job_id}: held by {HOSTILE}")

    release = requeue = hold

    def cancel(self, job_id: str) -> None:
        raise RequestError(403, f"job {job_id}: not yours {HOSTILE}")


@contextmanager
def _terminal(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[Callable[[], str]]:
    """sys.<name> on a real pty (raw: the bytes as written); yields what reached it."""
    leader, follower = pty.openpty()
    tty.setraw(follower)
    stream = os.fdopen(follower, "w", encoding="utf-8", closefd=False)
    monkeypatch.setattr(sys, name, stream)

    def read() -> str:
        stream.flush()
        got = b""
        while select.select([leader], [], [], 0.5)[0]:  # all of it is written already
            got += os.read(leader, 65536)
        return got.decode()

    try:
        assert stream.isatty()
        yield read
    finally:
        stream.close()
        os.close(follower)
        os.close(leader)


def _obeyable(text: str) -> bool:
    return any(c in text for c in "\x1b\x07\x9b")


def test_scontrol_show_job_on_a_terminal_shows_the_escape_not_obeys_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _terminal(monkeypatch, "stdout") as read:
        assert scontrol.show(FakeClient(), ["job", "7"]) == 0
        shown = read()
    assert not _obeyable(shown), shown
    assert "Command=python x.py\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\x9b31m\n" in shown
    assert "JobName=train\\x1b]52;" in shown and "WorkDir=/home/mallory/\\x1b]52;" in shown
    assert shown.startswith("JobId=7 ")  # the block itself as it was


def test_scontrol_show_job_piped_escapes_the_values_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pipe into less or grep ends on a terminal as well: the values are escaped where
    the block is made, as squeue's fields are."""
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    scontrol.show(FakeClient(), ["job", "7"])
    assert not _obeyable(piped.getvalue())
    assert "\n   Command=python x.py\\x1b]52;" in piped.getvalue()


def test_error_lines_on_a_terminal_are_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    with _terminal(monkeypatch, "stderr") as read:
        assert scontrol.job_action(FakeClient(), "hold", ["7"]) == 1
        monkeypatch.setattr(scancel.common, "make_client", FakeClient)
        assert scancel.main(["7"]) == 1
        from mgpu.client import steps  # here: test_slurm_cli fakes this module

        steps._say(f"error: {HOSTILE}")
        shown = read()
    assert not _obeyable(shown), shown
    assert "hold error on job 7: job 7: held by \\x1b]52;" in shown
    assert "scancel: error: Kill job error on job id 7: not yours \\x1b]52;" in shown
    assert "srun: error: \\x1b]52;" in shown


def test_the_writer_escapes_on_a_terminal_and_passes_a_pipe_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _terminal(monkeypatch, "stdout") as read:
        output.out(f"a\tb{HOSTILE}\nc", end="\r\n")
        assert read() == "a\tb\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\x9b31m\nc\\r\n"
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    output.out(f"a{HOSTILE}")
    assert piped.getvalue() == f"a{HOSTILE}\n"


def _writes_around_the_writer(tree: ast.AST) -> list[str]:
    """print() calls and any use of sys.stdout / sys.stderr."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
        ):
            found.append(f"line {node.lineno}: print()")
        if isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr"):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_every_slurm_command_writes_through_the_one_writer() -> None:
    package = Path(mgpu.slurm.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert {m.stem for m in modules} >= {"sbatch", "squeue", "scontrol", "sacct", "srun"}
    around = {
        m.name: hits
        for m in modules
        if m.name != "output.py"
        and (hits := _writes_around_the_writer(ast.parse(m.read_text(), str(m))))
    }
    assert around == {}
    # The walk finds what it looks for (a print, a sys.stderr.write).
    assert len(_writes_around_the_writer(ast.parse("print(1)\nsys.stderr.write('x')"))) == 2
