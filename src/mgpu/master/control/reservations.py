"""Admin reservations on the master (`mgpu reserve`): made, kept in the store, handed to the
scheduler, and checked at submit for `--reservation NAME`.

The scheduler core decides what a reservation means for placement (scheduler/reservations.py,
docs/scheduling.md "Reservations"); this module is its book: `create` checks the request and
picks the GPUs with `pick_reservation_gpus` (one sentence and nothing stored when it cannot),
stores it with its audit event in one transaction, and `active(now)` gives the scheduler the
reservations whose window has not ended — ended ones are dropped from memory and the store as
they are noticed (one write when a window closes, never one per pass).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from mgpu import spec as specs
from mgpu.master.control.submit import SubmitError, reservation_name
from mgpu.master.store.base import Store
from mgpu.model import Job
from mgpu.scheduler import (
    JobRequest,
    NodeView,
    Placement,
    Reservation,
    ReservationError,
    RunningJob,
    could_fit_reservation,
    pick_reservation_gpus,
)

__all__ = ["ReservationBook", "ReservationRequestError", "parse_when"]

_NOW_PLUS = re.compile(r"now\s*\+\s*(\d+(?:\.\d+)?)\s*([mhd]?)", re.IGNORECASE)
_UNIT = {"": 60, "m": 60, "h": 3600, "d": 86400}
MAX_USERS = 1000
HORIZON = 10 * 365 * 86400.0
"""Seconds ahead (and back) a reservation's start and end may be: an absurd time (an
`end: 1e300`) is refused with one sentence, never stored for the renderers to trip on."""


class ReservationRequestError(ValueError):
    """A reservation request refused; the message is one sentence for the admin."""


def parse_when(value: str | float, now: float, option: str = "--start") -> float:
    """`now`, `now+MINUTES` (also `now+2h`, `now+1d`), `YYYY-MM-DDTHH:MM` (the master's
    local time; the CLI sends its own local time as epoch seconds) or epoch seconds."""
    when = _parse_when(value, now, option)
    if not (math.isfinite(when) and abs(when - now) <= HORIZON):
        raise ReservationRequestError(f"{option} must be a time within 10 years of now")
    return when


def _parse_when(value: str | float, now: float, option: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if text.lower() == "now":
        return now
    m = _NOW_PLUS.fullmatch(text)
    if m is not None:
        return now + float(m.group(1)) * _UNIT[m.group(2).lower()]
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        raise ReservationRequestError(
            f"{option} {text!r:.40} is not a time; use now, now+MINUTES or YYYY-MM-DDTHH:MM"
        ) from None


def _record(r: Reservation) -> dict[str, Any]:
    return {
        "name": r.name,
        "placements": [{"node_id": p.node_id, "gpu_ids": list(p.gpu_ids)} for p in r.placements],
        "start": r.start,
        "end": r.end,
        "users": sorted(r.users),
    }


def _from_record(rec: dict[str, Any]) -> Reservation:
    return Reservation(
        name=str(rec["name"]),
        placements=tuple(
            Placement(str(p["node_id"]), tuple(int(g) for g in p["gpu_ids"]))
            for p in rec["placements"]
        ),
        start=float(rec["start"]),
        end=float(rec["end"]),
        users=frozenset(str(u) for u in rec.get("users", [])),
    )


def public(r: Reservation, now: float) -> dict[str, Any]:
    """A reservation as `mgpu reserve list --json` shows it."""
    return {
        "name": r.name,
        "gpus": r.gpus,
        "allocation": [{"node_id": p.node_id, "gpu_ids": list(p.gpu_ids)} for p in r.placements],
        "start": r.start,
        "end": r.end,
        "users": sorted(r.users),
        "state": "active" if r.start <= now else "waiting",
    }


class ReservationBook:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._by_name: dict[str, Reservation] = {}
        for rec in store.load_reservations():
            r = _from_record(rec)
            self._by_name[r.name] = r

    def active(self, now: float) -> list[Reservation]:
        """Reservations whose window has not ended (those ended are forgotten now)."""
        ended = [name for name, r in self._by_name.items() if r.end <= now]
        if ended:
            for name in ended:
                del self._by_name[name]
            self.store.delete_reservations(ended, ("reservation_ended", None, None))
        return list(self._by_name.values())

    def get(self, name: str, now: float) -> Reservation | None:
        r = self._by_name.get(name)
        return r if r is not None and r.end > now else None

    def create(
        self,
        body: dict[str, Any],
        now: float,
        nodes: Sequence[NodeView],
        running: Sequence[RunningJob],
        default_time_limit: float,
        known_user: Callable[[str], bool],
        actor: str | None,
        address: str | None,
    ) -> Reservation:
        """Make the reservation `body` asks for (name, gpus, start, end or duration, users,
        nodelist), or raise ReservationRequestError with one sentence, storing nothing."""
        try:
            name = reservation_name(str(body.get("name") or ""), "the reservation name")
            users = self._users(body.get("users"), known_user)
            nodelist = body.get("nodelist")
            wanted = None
            if nodelist:
                wanted = frozenset(specs.parse_node_list(str(nodelist)))
        except specs.SpecError as e:
            raise ReservationRequestError(str(e)) from None
        gpus = body.get("gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ReservationRequestError("--gpus must be a whole number of GPUs, 1 or more")
        start = parse_when(body.get("start", "now"), now, "--start")
        end = self._end(body, start, now)
        self.active(now)
        try:
            placements = pick_reservation_gpus(
                name,
                gpus,
                start,
                end,
                nodes,
                running,
                list(self._by_name.values()),
                now,
                default_time_limit,
                nodelist=wanted,
                ignore_jobs=body.get("ignore_jobs") is True,
            )
        except ReservationError as e:
            raise ReservationRequestError(str(e)) from None
        r = Reservation(name, placements, start, end, users)
        self.store.save_reservation(name, _record(r), ("reservation_create", actor, address))
        self._by_name[name] = r
        return r

    def delete(self, name: str, actor: str | None, address: str | None) -> bool:
        if name not in self._by_name:
            return False
        del self._by_name[name]
        self.store.delete_reservations([name], ("reservation_delete", actor, address))
        return True

    def admit(self, job: Job, nodes: Sequence[NodeView], request: JobRequest, now: float) -> None:
        """`--reservation NAME` at submit: the reservation exists, the job's user is listed,
        and the job could run on its GPUs; else SubmitError with one sentence."""
        name = job.reservation
        if name is None:
            return
        r = self.get(name, now)
        if r is None:
            raise SubmitError(f"--reservation {name}: no such reservation (or it has ended)")
        if r.users and job.user not in r.users:
            raise SubmitError(
                f"--reservation {name}: user {job.user} is not one of its users "
                f"({', '.join(sorted(r.users))})"
            )
        why = could_fit_reservation(request, r, nodes) if nodes else None
        if why is not None:
            raise SubmitError(why)

    @staticmethod
    def _users(value: Any, known_user: Callable[[str], bool]) -> frozenset[str]:
        if value is None or value == "" or value == []:
            return frozenset()
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or len(items) > MAX_USERS:
            raise specs.SpecError("--users must list user names, such as alice,bob")
        names = [str(u).strip() for u in items if str(u).strip()]
        for user in names:
            specs.validate_text(user, "--users")
            if not known_user(user):
                raise specs.SpecError(
                    f"--users: unknown user {user!r:.60} (no token and no account on the master)"
                )
        return frozenset(names)

    @staticmethod
    def _end(body: dict[str, Any], start: float, now: float) -> float:
        end, duration = body.get("end"), body.get("duration")
        if (end is None) == (duration is None):
            raise ReservationRequestError("give the reservation's length: --duration or --end")
        if end is not None:
            return parse_when(end, now, "--end")
        try:
            seconds = specs.parse_time_limit(str(duration))
        except specs.SpecError as e:
            raise ReservationRequestError(f"--duration: {e}") from None
        if math.isinf(seconds) or seconds <= 0:
            raise ReservationRequestError("--duration must be a length of time such as 2:00:00")
        if start + seconds - now > HORIZON:
            raise ReservationRequestError("--duration must end within 10 years of now")
        return start + seconds
