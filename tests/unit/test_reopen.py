"""A follower's reopens (mgpu.client.reopen): a few in a row whatever they cost, then as
long as the client waits for a failover since the stream broke, with one master as with
several; records flowing again start the count afresh.  A fake clock: each sleep moves it."""

from __future__ import annotations

import pytest

from mgpu.client import reopen
from mgpu.client.reopen import Reopens


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(reopen.time, "monotonic", lambda: now[0])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(reopen.time, "sleep", sleep)
    return now


def _opens_until_given_up(reopens: Reopens) -> int:
    opens = 0
    while reopens.again():
        opens += 1
        assert opens < 1000
    return opens


def test_a_break_is_waited_out_for_the_whole_patience(clock: list[float]) -> None:
    """A single master restarting for 25 s: opens go on (a 3-try budget gave up after
    about 3 s), a short sleep apart."""
    reopens = Reopens(30.0)
    start = clock[0]
    opens = _opens_until_given_up(reopens)
    assert clock[0] - start >= 30.0
    assert clock[0] - start <= 33.0  # a sleep is 2 s at most
    assert opens > 10


def test_a_short_patience_still_tries_three_times(clock: list[float]) -> None:
    reopens = Reopens(0.0)
    assert _opens_until_given_up(reopens) == 3


def test_records_flowing_again_start_afresh(clock: list[float]) -> None:
    reopens = Reopens(5.0)
    for _ in range(4):
        assert reopens.again()
    clock[0] += 100.0  # a long, healthy stream, then a new break
    reopens.flowed()
    start = clock[0]
    _opens_until_given_up(reopens)
    assert 5.0 <= clock[0] - start <= 8.0
