"""Submits' new jobs written on the event loop (master/store/pgsubmits.py), through the
PostgreSQL store's `save_jobs_later(new_jobs=True)` as a submit writes them: in order, one
statement a write, the fence's refusal for good, a taken key, a lost connection written
again, and a write the database keeps counted as a stall."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import psycopg
import pytest

from factories import master_job
from mgpu.master.store.base import KeyTaken, StoreUnavailable
from mgpu.master.store.fence import LEASE_TABLE, Fenced
from mgpu.master.store.postgres import PostgresStore
from mgpu.model import Job
from pgserver import PgServer
from stores import durable


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {LEASE_TABLE}(id, generation, holder, address, expires_at) "
            "VALUES (1, 1, 'me', NULL, now())"
        )
    store.fence.generation = 1
    try:
        yield store
    finally:
        store.close()


def _submit(store: PostgresStore, job: Job, key: str | None = None) -> asyncio.Future[None]:
    """The submit's write as SubmitBatch gives it, on the running loop."""
    later = store.save_jobs_later(
        [job],
        events=[("submit", job.user, None, job.id)],
        keys=[] if key is None else [(key, job.id)],
        new_jobs=True,
    )
    return asyncio.ensure_future(later.result(30))


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def test_submits_are_written_on_the_loop_in_order_one_statement_each(
    store: PostgresStore, pg_url: str
) -> None:
    async def main() -> list[str]:
        writes = [_submit(store, master_job(f"{i:08d}")) for i in range(1, 6)]
        done: list[str] = []
        for i, write in enumerate(writes, start=1):
            write.add_done_callback(lambda _, i=i: done.append(f"{i:08d}"))
        await asyncio.gather(*writes)
        return done

    threads = threading.active_count()
    assert asyncio.run(main()) == [f"{i:08d}" for i in range(1, 6)]
    assert threading.active_count() == threads  # no thread of its own
    assert _count(pg_url, "SELECT COUNT(*) FROM jobs") == 5
    assert _count(pg_url, "SELECT COUNT(*) FROM events WHERE kind = 'submit'") == 5
    assert store.get_job("00000005") is not None
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the submit's rows in one statement
        queries = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = %s",
            (store.link.application_name,),
        ).fetchall()
    assert any(q.startswith("WITH w0 AS (INSERT INTO jobs") for (q,) in queries)


def test_a_submit_the_fence_refuses_writes_nothing_and_the_store_steps_down(
    store: PostgresStore, pg_url: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"UPDATE {LEASE_TABLE} SET generation = 2")  # another master leads

    async def main() -> None:
        with pytest.raises(Fenced, match="generation 2"):
            await _submit(store, master_job("00000001"))
        with pytest.raises(Fenced):  # for good, without asking the database
            await _submit(store, master_job("00000002"))

    asyncio.run(main())
    assert store.fence.lost
    assert _count(pg_url, "SELECT COUNT(*) FROM jobs") == 0


def test_a_key_stored_already_is_key_taken_and_nothing_of_the_submit_is_written(
    store: PostgresStore, pg_url: str
) -> None:
    async def main() -> None:
        await _submit(store, master_job("00000001"), key="k")
        with pytest.raises(KeyTaken):
            await _submit(store, master_job("00000002"), key="k")
        await _submit(store, master_job("00000003"), key="k2")  # the lane goes on

    asyncio.run(main())
    assert _count(pg_url, "SELECT COUNT(*) FROM jobs") == 2
    assert _count(pg_url, "SELECT COUNT(*) FROM events") == 2


def test_a_lost_connection_is_opened_again_and_the_write_made(
    store: PostgresStore, pg_url: str
) -> None:
    async def main() -> None:
        await _submit(store, master_job("00000001"))
        conn = store._submits._conn
        assert conn is not None
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        await _submit(store, master_job("00000002"))
        assert store._submits._conn is not conn

    asyncio.run(main())
    assert _count(pg_url, "SELECT COUNT(*) FROM jobs") == 2


def test_a_write_the_database_keeps_stalls_the_store_until_it_is_made(
    store: PostgresStore, pg_url: str
) -> None:
    store.answer_within = 0.2
    with psycopg.connect(pg_url) as blocker:
        blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")  # held till the commit

        async def main() -> None:
            write = _submit(store, master_job("00000001"))
            while store._submits.busy_for() <= 0.2:  # bounded by the lock's holder below
                await asyncio.sleep(0.05)
            assert not store.answering() and not write.done()
            blocker.commit()
            await write
            assert store.answering()

        asyncio.run(asyncio.wait_for(main(), 60))
    assert _count(pg_url, "SELECT COUNT(*) FROM jobs") == 1


def test_a_database_gone_for_too_long_fails_the_submit_with_one_clear_error(
    pg_url: str, postgres: PgServer
) -> None:
    store = PostgresStore(durable(pg_url), retry_for=1.0)

    async def main() -> None:
        await _submit(store, master_job("00000001"))
        postgres.kill()
        try:
            with pytest.raises(StoreUnavailable, match="unreachable for 1 s"):
                await _submit(store, master_job("00000002"))
        finally:
            postgres.start()
        await _submit(store, master_job("00000003"))  # back: the lane goes on

    try:
        asyncio.run(main())
        assert store.get_job("00000002") is None and store.get_job("00000003") is not None
    finally:
        store.close()


def test_a_closed_lane_ends_what_was_given_and_takes_nothing_more(
    store: PostgresStore, pg_url: str
) -> None:
    with psycopg.connect(pg_url) as blocker:
        blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")  # the first write waits

        async def main() -> None:
            given = [_submit(store, master_job(f"{i:08d}")) for i in (1, 2)]
            while store._submits.busy_for() == 0:
                await asyncio.sleep(0.01)
            store._submits.close()
            results = await asyncio.gather(*given, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results), results
            with pytest.raises(StoreUnavailable, match="closed"):
                await _submit(store, master_job("00000003"))
            assert store._submits._conn is None

        asyncio.run(asyncio.wait_for(main(), 60))
        blocker.rollback()
    # The first was sent already: the server may still commit it, as any client's (its
    # caller was told it failed; a submit sent again finds it by its key).  The second
    # was never sent.
    assert _count(pg_url, "SELECT COUNT(*) FROM jobs WHERE id <> '00000001'") == 0
