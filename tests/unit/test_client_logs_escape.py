"""`mgpu logs` on a terminal escapes another user's control sequences (issue 25): an OSC 52
clipboard write, a title, a screen clear are shown, not obeyed; newlines and tabs stay.
Piped, or with `--raw`, the bytes are written as they are.  A real pty is the terminal."""

from __future__ import annotations

import io
import os
import pty
import select
import sys
import tty
from collections.abc import Iterator
from typing import Any

import pytest

from mgpu.client.stream import escape_output, print_logs

HOSTILE = "ok\tcol\n\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J\x9b31mend\r\n"


class FakeClient:
    failover_wait = 30.0  # how long a broken stream is opened again (mgpu.client.reopen)

    def show(self, job_id: str) -> dict[str, Any]:
        return {"id": job_id, "allocation": [{"node_id": "n1"}]}

    def stream(
        self, job_id: str, follow: bool = False, since: int = 0, marks: bool = False
    ) -> Iterator[dict[str, Any]]:
        yield {"s": "o", "n": "n1", "d": HOSTILE[:20]}  # a sequence split across records
        yield {"s": "e", "n": "n1", "d": HOSTILE[20:]}


def _logs_on_a_pty(monkeypatch: pytest.MonkeyPatch, raw: bool) -> str:
    leader, follower = pty.openpty()
    tty.setraw(follower)  # no newline translation: the bytes as written
    try:
        out = os.fdopen(follower, "w", encoding="utf-8", closefd=False)
        monkeypatch.setattr(sys, "stdout", out)
        assert sys.stdout.isatty()
        assert print_logs(FakeClient(), "7", follow=False, raw=raw) == 0  # type: ignore[arg-type]
        out.flush()
        got = b""
        while select.select([leader], [], [], 5)[0]:  # all of it is written already
            got += os.read(leader, 65536)
            if got.endswith(b"end\r\n" if raw else b"end\\r\n"):
                break
        return got.decode()
    finally:
        os.close(follower)
        os.close(leader)


def test_logs_on_a_terminal_are_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _logs_on_a_pty(monkeypatch, raw=False)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in shown  # seen, not obeyed
    assert shown.startswith("ok\tcol\n")  # the tab and the newline kept
    assert shown.endswith("end\\r\n")


def test_logs_raw_or_piped_are_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "\x1b]52;c;" in _logs_on_a_pty(monkeypatch, raw=True)
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    print_logs(FakeClient(), "7", follow=False)  # type: ignore[arg-type]
    assert piped.getvalue() == HOSTILE


def test_escape_output_keeps_newlines_and_tabs_only() -> None:
    assert escape_output("a\tb\nc") == "a\tb\nc"
    assert escape_output("\x1b[2J\r\u202e") == "\\x1b[2J\\r\\u202e"
