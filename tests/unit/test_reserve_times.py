"""Reservation times (issue 25): absurd ones are refused with one sentence, and whatever a
stored reservation holds, `mgpu reserve list` prints a table, never a traceback."""

from __future__ import annotations

import math

import pytest

from mgpu.client.api import MgpuError
from mgpu.client.cmd_reserve import render_reservations, when
from mgpu.master.control.reservations import HORIZON, ReservationRequestError, parse_when

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    "value",
    [1e300, -1e300, math.inf, math.nan, NOW + HORIZON + 60, 0.0, "now+99999999999", "now+1e9d"],
)
def test_absurd_times_are_refused_in_one_sentence(value: str | float) -> None:
    with pytest.raises(ReservationRequestError) as refused:
        parse_when(value, NOW, "--end")
    assert str(refused.value) in (
        "--end must be a time within 10 years of now",
        f"--end {str(value)!r:.40} is not a time; use now, now+MINUTES or YYYY-MM-DDTHH:MM",
    )


@pytest.mark.parametrize("value", ["now", "now+30", "now+2h", NOW + 86400.0, "2030-01-01T00:00"])
def test_sane_times_are_taken(value: str | float) -> None:
    assert abs(parse_when(value, NOW) - NOW) <= HORIZON


def test_the_client_refuses_a_time_no_calendar_holds_in_one_sentence() -> None:
    with pytest.raises(MgpuError, match="is not a time"):
        when("0000-01-01T00:00", "--start")


def test_odd_stored_values_render_without_a_traceback() -> None:
    odd = [
        {
            "name": "huge",
            "state": "waiting",
            "start": 1e300,
            "end": math.inf,
            "gpus": 1,
            "allocation": [{"node_id": "n1", "gpu_ids": [0]}],
            "users": [],
        },
        {"name": "nan", "start": math.nan, "end": "soon", "allocation": None, "users": "x"},
        {"name": "neg", "start": -1e20, "end": None, "allocation": [None], "users": ["a"]},
        {},
    ]
    text = render_reservations(odd)
    assert text.count("?") >= 6
    assert "huge" in text and "n1:0" in text
