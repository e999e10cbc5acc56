"""`mgpu reserve create|list|delete`: GPUs set aside for a window (admin).

Kept apart from `cli.py` (which only calls `add_reserve_parser`).  Times are sent as the
contract writes them (`now`, `now+MINUTES`), or, for `YYYY-MM-DDTHH:MM`, as epoch seconds of
this machine's local time, so the window is the one the admin typed wherever the master is.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from mgpu.client.api import Client, MgpuError
from mgpu.client.render import table

__all__ = ["add_reserve_parser", "render_reservations", "when"]

_RELATIVE = re.compile(r"now(\s*\+\s*\d+(\.\d+)?\s*[mhd]?)?", re.IGNORECASE)


def when(text: str, option: str) -> str | float:
    """`now`, `now+MINUTES` as they are (the master's clock decides), an ISO time as epoch
    seconds of this machine's local time."""
    text = text.strip()
    if _RELATIVE.fullmatch(text):
        return text.replace(" ", "")
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        raise MgpuError(
            f"{option} {text!r} is not a time; use now, now+MINUTES or YYYY-MM-DDTHH:MM"
        ) from None


def add_reserve_parser(sub: Any, make_client: Callable[[argparse.Namespace], Client]) -> None:
    """Add `reserve` and its actions to an argparse subparsers object."""
    text = "set GPUs aside for a window (admin): create, list, delete"
    p: argparse.ArgumentParser = sub.add_parser("reserve", help=text, description=text)
    p.set_defaults(fn=lambda args: _usage(p))
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))

    def run(fn: Callable[[Client, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        return lambda args: fn(make_client(args), args)

    c = actions.add_parser("create", help="reserve GPUs for a window")
    c.set_defaults(fn=run(_create))
    c.add_argument("name", metavar="NAME")
    c.add_argument("--gpus", type=int, required=True, help="how many GPUs")
    c.add_argument("--nodelist", "-w", help="only on these nodes (a,b or node[001-004])")
    c.add_argument("--start", default="now", help="now, now+MINUTES or YYYY-MM-DDTHH:MM")
    length = c.add_mutually_exclusive_group(required=True)
    length.add_argument("--duration", help="length: MIN, HH:MM:SS or D-HH:MM:SS")
    length.add_argument("--end", help="end time: now+MINUTES or YYYY-MM-DDTHH:MM")
    c.add_argument("--users", help="who may run jobs in it, e.g. alice,bob (default: anyone)")
    c.add_argument(
        "--force", action="store_true", help="take GPUs of running jobs; stopped at the start"
    )
    c.add_argument("--json", action="store_true")

    ls = actions.add_parser("list", help="reservations not ended yet")
    ls.set_defaults(fn=run(_list))
    ls.add_argument("--json", action="store_true")

    d = actions.add_parser("delete", help="delete a reservation")
    d.set_defaults(fn=run(_delete))
    d.add_argument("name", metavar="NAME")


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def _create(client: Client, args: argparse.Namespace) -> int:
    made = client.reserve(
        args.name,
        args.gpus,
        start=when(args.start, "--start"),
        duration=args.duration,
        end=None if args.end is None else when(args.end, "--end"),
        users=[u.strip() for u in args.users.split(",") if u.strip()] if args.users else None,
        nodelist=args.nodelist,
        ignore_jobs=args.force,
    )
    if args.json:
        print(json.dumps(made))
    else:
        window = f"{_ts(made.get('start'))} to {_ts(made.get('end'))}"
        print(f"reservation {made['name']}: {_gpus(made)}, {window}")
    return 0


def _list(client: Client, args: argparse.Namespace) -> int:
    found = client.reservations()
    if args.json:
        print(json.dumps({"reservations": found}))
    else:
        print(render_reservations(found))
    return 0


def _delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_reservation(args.name)
    print(f"reservation {args.name} deleted")
    return 0


def _gpus(r: dict[str, Any]) -> str:
    slots = r.get("allocation")
    if not isinstance(slots, list):
        return "?"
    return ";".join(
        f"{a.get('node_id', '?')}:{','.join(map(str, a.get('gpu_ids') or []))}"
        if isinstance(a, dict)
        else "?"
        for a in slots
    )


def _ts(t: Any) -> str:
    """A time as local `YYYY-MM-DD HH:MM`; one no calendar holds (an `end` of 1e300 stored
    by an older master) as `?`, never a traceback."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _users(r: dict[str, Any]) -> str:
    users = r.get("users")
    if not isinstance(users, list):
        return "?"
    return ",".join(map(str, users)) or "(anyone)"


def render_reservations(found: list[dict[str, Any]]) -> str:
    """The reservations as a table; whatever a stored value is, a cell, never a traceback."""
    if not found:
        return "  (no reservations)"
    rows = [
        [
            str(r.get("name", "?")),
            str(r.get("state", "?")),
            _ts(r.get("start")),
            _ts(r.get("end")),
            str(r.get("gpus", "?")),
            _gpus(r),
            _users(r),
        ]
        for r in found
        if isinstance(r, dict)
    ]
    return table(["NAME", "STATE", "START", "END", "GPUS", "NODES", "USERS"], rows)
