"""The leader's lease (master/store/lease.py) on a real PostgreSQL, by the database's clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mgpu.master.store import lease
from mgpu.master.store.fence import Fence, Fenced
from mgpu.testing import wait_for

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def conn(pg_url: str) -> Iterator[Any]:
    with psycopg.connect(pg_url, autocommit=True) as c:
        lease.ensure_table(c)
        yield c


def test_the_first_take_makes_generation_one_and_others_wait(conn: Any) -> None:
    assert lease.read(conn) is None
    assert lease.take(conn, "a", "h1:8080", 30) == 1
    assert lease.take(conn, "b", "h2:8080", 30) is None  # held, not expired
    row = lease.read(conn)
    assert row is not None
    assert (row.generation, row.holder, row.address, row.live) == (1, "a", "h1:8080", True)


def test_renew_only_while_holder_and_generation_are_yours(conn: Any) -> None:
    assert lease.take(conn, "a", "h1:8080", 30) == 1
    assert lease.renew(conn, "a", 1, "h1:8080", 30)
    assert not lease.renew(conn, "b", 1, "h2:8080", 30)  # not the holder
    assert not lease.renew(conn, "a", 2, "h1:8080", 30)  # not its generation


def test_an_expired_lease_is_taken_with_the_next_generation(conn: Any) -> None:
    assert lease.take(conn, "a", "h1:8080", 0.2) == 1
    wait_for(lambda: not lease.read(conn).live, timeout=5, what="the lease to expire")
    assert lease.take(conn, "b", "h2:8080", 30) == 2
    assert not lease.renew(conn, "a", 1, "h1:8080", 30)  # the old leader lost it
    row = lease.read(conn)
    assert row is not None and (row.holder, row.address) == ("b", "h2:8080")


def test_an_expired_lease_no_one_took_is_renewed(conn: Any) -> None:
    assert lease.take(conn, "a", "h1:8080", 0.1) == 1
    wait_for(lambda: not lease.read(conn).live, timeout=5, what="the lease to expire")
    assert lease.renew(conn, "a", 1, "h1:8080", 30)
    assert lease.take(conn, "b", "h2:8080", 30) is None


def test_release_lets_another_take_at_once(conn: Any) -> None:
    assert lease.take(conn, "a", "h1:8080", 30) == 1
    assert lease.release(conn, "a", 1)
    assert lease.take(conn, "b", "h2:8080", 30) == 2
    assert not lease.release(conn, "a", 1)


def test_racing_takes_make_one_leader(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as c:
        lease.ensure_table(c)
    won: list[tuple[str, int | None]] = []
    start = threading.Barrier(8)

    def race(name: str) -> None:
        with psycopg.connect(pg_url, autocommit=True) as c:
            start.wait()
            won.append((name, lease.take(c, name, None, 30)))

    threads = [threading.Thread(target=race, args=(f"m{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(g for _, g in won if g is not None) == [1]


def test_the_fence_refuses_a_write_after_a_takeover(conn: Any, pg_url: str) -> None:
    assert lease.take(conn, "a", None, 0.1) == 1
    fence = Fence()
    fence.generation = 1
    with psycopg.connect(pg_url) as writer:
        with writer.transaction():
            fence.check(writer)  # still its own generation
        wait_for(lambda: not lease.read(conn).live, timeout=5, what="the lease to expire")
        assert lease.take(conn, "b", None, 30) == 2
        with pytest.raises(Fenced), writer.transaction():
            fence.check(writer)
    assert fence.lost


def _writer_in_flight(pg_url: str, generation: int) -> Any:
    """A connection inside a write transaction that passed the fence's check (and holds
    the lease row as every write does until it commits)."""
    fence = Fence()
    fence.generation = generation
    writer = psycopg.connect(pg_url)
    writer.execute("SET lock_timeout = 2000")
    fence.check(writer)
    return writer


def test_a_renewal_neither_waits_for_the_leaders_writes_nor_holds_them_up(
    conn: Any, pg_url: str
) -> None:
    assert lease.take(conn, "a", None, 30) == 1
    conn.execute("SET lock_timeout = 2000")  # a wait would fail, not hang
    writer = _writer_in_flight(pg_url, 1)
    try:
        assert lease.renew(conn, "a", 1, None, 30)  # the write in flight holds the row
        with conn.transaction():  # a renewal in flight: a new write's check goes on
            assert lease.renew(conn, "a", 1, None, 30)
            other = _writer_in_flight(pg_url, 1)
            other.commit()
            other.close()
        writer.commit()
    finally:
        writer.close()


def test_a_take_waits_for_a_write_of_the_expired_generation_in_flight(
    conn: Any, pg_url: str
) -> None:
    assert lease.take(conn, "a", None, 0.2) == 1
    writer = _writer_in_flight(pg_url, 1)
    try:
        wait_for(lambda: not lease.read(conn).live, timeout=5, what="the lease to expire")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            lease.take(conn, "b", None, 30, lock_timeout=0.3)
        writer.commit()  # its write lands before any of the next generation's
    finally:
        writer.close()
    assert lease.take(conn, "b", None, 30, lock_timeout=0.3) == 2
