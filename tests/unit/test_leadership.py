"""The lease loop (master/ha/leadership.py) on a real PostgreSQL: one leader, a standby
that takes over when the leader lets go or goes silent, a leader that learns it lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from mgpu.master.ha.leadership import Leadership, LeaseTiming, advertised_address
from mgpu.master.store.fence import Fence
from mgpu.testing import wait_for

pytest.importorskip("psycopg")

FAST = LeaseTiming(ttl=0.6, renew=0.1, retry=0.1)


class Watched(Leadership):
    def __init__(self, url: str, address: str, timing: LeaseTiming = FAST) -> None:
        super().__init__(url, address, Fence(), timing)
        self.led = threading.Event()
        self.lost_why: list[str] = []
        self.on_lead = lambda generation: self.led.set()
        self.on_lost = self.lost_why.append


@pytest.fixture
def pair(pg_url: str) -> Iterator[tuple[Watched, Watched]]:
    a, b = Watched(pg_url, "a:1"), Watched(pg_url, "b:2")
    try:
        yield a, b
    finally:
        a.stop(release=False)
        b.stop(release=False)


def test_one_leads_the_other_stands_by_and_knows_where(pair: tuple[Watched, Watched]) -> None:
    a, b = pair
    a.start()
    assert a.led.wait(10)
    b.start()
    wait_for(lambda: b.leader == "a:1", what="the standby to see the leader")
    assert (a.role, b.role) == ("leader", "standby")
    assert a.fence.generation == 1 and b.fence.generation is None
    assert a.may_send() and not b.may_send()
    time.sleep(FAST.ttl * 2)  # renewals keep it
    assert a.role == "leader" and b.role == "standby" and a.lost is None


def test_a_released_lease_is_taken_at_once(pair: tuple[Watched, Watched]) -> None:
    a, b = pair
    a.start()
    assert a.led.wait(10)
    b.start()
    wait_for(lambda: b.leader == "a:1", what="the standby to see the leader")
    a.stop(release=True)
    assert b.led.wait(FAST.ttl)  # sooner than the TTL
    assert b.generation == 2 and b.fence.generation == 2


def test_a_silent_leader_stops_sending_then_learns_it_lost(
    pair: tuple[Watched, Watched],
) -> None:
    a, b = pair
    a.start()
    assert a.led.wait(10)
    a._stop.set()  # its lease loop stops renewing (as a SIGSTOP would)
    assert a._thread is not None
    a._thread.join(5)
    wait_for(lambda: not a.may_send(), timeout=FAST.ttl * 3, what="the leader to fence itself")
    b.start()
    assert b.led.wait(10)
    # The old leader's loop comes back: its renewal is refused, it steps down.
    a._stop.clear()
    a.start()
    wait_for(lambda: a.lost_why, what="the old leader to learn it lost")
    assert "another master leads now (generation 2, at b:2)" in a.lost_why[0]
    assert a.fence.lost and not a.may_send()


def test_the_advertised_address() -> None:
    assert advertised_address("10.0.0.5", 8080) == "10.0.0.5:8080"
    assert advertised_address("0.0.0.0", 8080, "head1") == "head1:8080"
    assert advertised_address("0.0.0.0", 8080, "head1:9000") == "head1:9000"
    assert advertised_address("::1", 8080) == "[::1]:8080"
    assert advertised_address("0.0.0.0", 8080).endswith(":8080")


def test_a_leader_stopped_inside_a_write_transaction_does_not_stop_the_standby(
    pg_url: str,
) -> None:
    """The leader's write transaction holds the lease row (its fence's FOR KEY SHARE) and then
    nothing more happens on it, as when the leader is stopped (SIGSTOP) or cut off between
    two statements: once the lease has expired the standby ends that leader's database
    sessions and leads; a connection that is not the old leader's is left alone."""
    import psycopg

    from mgpu.master.store.pglink import params

    a, b = Watched(pg_url, "a:1"), Watched(pg_url, "b:2")
    # No idle_in_transaction timeout on the blocker: the standby alone must free the row
    # (a backend waiting in the middle of a pipeline is not "idle in transaction" either).
    stalled = a.link.named("store", idle_in_transaction_session_timeout=0)
    try:
        a.start()
        assert a.led.wait(10)
        with (
            psycopg.connect(**params(pg_url, stalled)) as writer,
            psycopg.connect(pg_url, autocommit=True, application_name="psql") as other,
        ):
            writer.execute("BEGIN")
            a.fence.check(writer)  # holds the lease row FOR KEY SHARE, then stalls
            a._stop.set()  # and the leader renews no more
            assert a._thread is not None
            a._thread.join(5)
            b.start()
            assert b.led.wait(15), "the standby never led behind the stalled transaction"
            assert b.generation == 2
            assert writer.broken or _dead(writer), "the old leader's session still lives"
            assert other.execute("SELECT 1").fetchone() == (1,)  # not the leader's: kept
    finally:
        a.stop(release=False)
        b.stop(release=False)


def _dead(conn: object) -> bool:
    import psycopg

    try:
        conn.execute("SELECT 1")  # type: ignore[attr-defined]
    except psycopg.OperationalError:
        return True
    return False
