"""Other users' text on the terminal (client/render.py, top.py, mgpu.safetext): a job
name, command, reason or hostname is shown escaped, so it cannot move the reader's cursor,
recolour or retitle their terminal, hide part of a line or add lines; normal text is
shown as it is."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from mgpu.client.render import render_events, render_job, render_jobs, render_nodes, table
from mgpu.safetext import escape_controls

# What a hostile user would put in a name, a command or a reason.
HOSTILE = [
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b]0;owned\x07",  # retitle the terminal (OSC, BEL)
    "\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\",  # a hyperlink
    "real\rfake",  # CR: overwrite what the line said
    "a\nb",  # a line of its own
    "a\tb",
    "\x08\x08\x08",  # backspaces
    "\x7f",  # DEL
    "\x9b2J",  # C1 CSI, read by some terminals as ESC [
    "\u202etxt.exe",  # right-to-left override
    "\u2028",  # line separator
    "\x00",
]

NORMAL = ["train resnet-50 (lr=0.1)", "Grüße, 東京, 🚀", "a  b", "path/to x;y|z", "\\x1b"]


def shows_nothing_raw(text: str, lines: int | None = None) -> None:
    """No control or format character in `text` but the newlines between its lines."""
    assert all(c.isprintable() for line in text.split("\n") for c in line), repr(text)
    if lines is not None:
        assert text.count("\n") == lines - 1, text


@pytest.mark.parametrize("text", HOSTILE)
def test_control_characters_are_escaped(text: str) -> None:
    shown = escape_controls(text)
    shows_nothing_raw(shown, lines=1)
    assert shown != text and "\\" in shown


@pytest.mark.parametrize("text", NORMAL)
def test_normal_text_is_kept(text: str) -> None:
    assert escape_controls(text) == text


def test_escapes_are_python_escapes() -> None:
    text = "a\x1bb\rc\u202ed\U000e0001\x00"
    assert escape_controls(text) == repr(text)[1:-1] == "a\\x1bb\\rc\\u202ed\\U000e0001\\x00"


def _job(**fields: Any) -> dict[str, Any]:
    job = {
        "id": "a1b2c3d4",
        "name": "train",
        "user": "alice",
        "state": "running",
        "command": "python train.py",
        "gpus": 1,
        "exit_code": None,
        "reason": None,
        "allocation": [{"node_id": "node001", "gpu_ids": [0], "hostname": "h", "ip": "10.0.0.1"}],
        "submit_time": 1_700_000_000.0,
        "start_time": 1_700_000_001.0,
        "end_time": None,
        "retries": 0,
        "max_retries": 5,
        "attempts": [{"nodes": ["node001"], "end_reason": None}],
    }
    return {**job, **fields}


@pytest.mark.parametrize("text", HOSTILE)
def test_queue_rows_stay_one_line_each(text: str) -> None:
    jobs = [
        _job(name=text),
        _job(id="b1", command=text, state="failed", reason=text),
        _job(id="c1", state="queued", reason=text, allocation=[]),
    ]
    shows_nothing_raw(render_jobs(jobs), lines=4)


@pytest.mark.parametrize("text", HOSTILE)
def test_show_keeps_every_field_on_its_line(text: str) -> None:
    plain = render_job(_job())
    attempts = [{"nodes": ["node001"], "end_reason": text}]
    alloc = [{"node_id": "node001", "gpu_ids": [0], "hostname": text, "ip": text}]
    hostile = _job(
        name=text, command=text, reason=text, script_name=text, attempts=attempts, allocation=alloc
    )
    shown = render_job({**hostile, "script": "x"})
    shows_nothing_raw(shown, lines=plain.count("\n") + 2)  # + the script line
    assert escape_controls(text) in shown


@pytest.mark.parametrize("text", HOSTILE)
def test_nodes_table_escapes_hostnames_and_reasons(text: str) -> None:
    node = {
        "node_id": "node001",
        "state": "drained",
        "hostname": text,
        "ip": text,
        "reason": text,
        "features": [text],
        "gpus": [{"index": 0, "name": text, "memory_mb": 1}],
    }
    shows_nothing_raw(render_nodes([node]), lines=2)


def test_audit_rows_escape_what_a_client_sent() -> None:
    """A refused request's path is the caller's: `GET /%1b]0;x%07` must not retitle the
    admin's terminal when they read `mgpu audit`."""
    events = [
        {
            "time": time.time(),
            "kind": "auth_failed",
            "actor": "\x1b[31mroot",
            "address": "127.0.0.1",
            "target": "/\x1b]0;owned\x07",
            "detail": "1 refused request: no token given\r",
        }
    ]
    shown = render_events(events)
    shows_nothing_raw(shown, lines=2)
    assert "/\\x1b]0;owned\\x07" in shown


def test_table_widths_count_the_escaped_text() -> None:
    lines = table(["A", "B"], [["\x1b", "x"], ["yyyy", "z"]]).splitlines()
    assert [len(line) for line in lines[1:]] == [7, 7]  # `\x1b` is 4 wide, as `yyyy`


def test_top_never_reads_a_name_as_markup_or_passes_escapes() -> None:
    pytest.importorskip("rich")
    from rich.console import Console

    from mgpu.client.top import frame

    name = "[link=http://evil/]x[/link]\x1b]0;t\x07"
    data = {
        "jobs": [_job(name=name, user="[bold]bob", state="queued", allocation=[], reason=name)],
        "nodes": [
            {
                "node_id": "node001",
                "state": "online",
                "gpus": [{"index": 0, "busy_job": name, "busy_user": "\x1b[2J"}],
            }
        ],
    }
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=300, color_system=None)
    console.print(frame(data, "127.0.0.1:8080", error="down\x1b[2J"))
    text = out.getvalue()
    assert "\x1b]" not in text and "\x1b[2J" not in text  # no hyperlink, title or clear
    assert "[link=http://evil/]x[/link]" in text and "[bold]bob" in text
