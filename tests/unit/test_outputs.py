"""The master's output stores (master/store/outputs.py, store/pgoutputs.py): appends, as a
reader and a restart see them.  The shared tests run against both stores; the PostgreSQL
one's own (buffer, flushes, fencing, a second master, a database restart) follow."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mgpu.master.store import pgoutputs
from mgpu.master.store.fence import LEASE_SCHEMA, Fence, Fenced
from mgpu.master.store.outputs import ALL_SENT, MARKER, FileOutputStore, OutputStore
from mgpu.master.store.outputtables import import_output_files
from mgpu.master.store.pgoutputs import PgOutputStore, open_output_store

Make = Callable[[], OutputStore]
"""A new store on the test's files or database (a second call: a restarted master)."""


@pytest.fixture(params=["file", "postgresql"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    stores: list[OutputStore] = []
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")

        def new() -> OutputStore:
            stores.append(PgOutputStore(url, Fence()))
            return stores[-1]
    else:

        def new() -> OutputStore:
            stores.append(FileOutputStore(tmp_path))
            return stores[-1]

    yield new
    for store in stores:
        store.close_all()


def _raw(store: OutputStore, job_id: str) -> list[bytes]:
    """The job's stored lines, as a reader sends them."""
    reader = store.reader(job_id, follow=False)
    out = b""
    while (chunk := reader.step()) is not None:
        out += chunk
    reader.close()
    return out.splitlines()


# ---- both stores -------------------------------------------------------------


def test_an_append_is_there_for_a_reader_when_it_returns(make: Make) -> None:
    """What was appended is there for a reader at once, each record a whole line, in the
    order appended."""
    store = make()
    store.append("j1", "o", "one\n", "n1", epoch=1, end=4)
    assert store.read("j1") == [{"s": "o", "d": "one\n", "n": "n1", "ep": 1, "at": 4}]
    store.append("j1", "e", "h\u00e9 \ud800\n", "n1", epoch=1, end=7)  # a lone surrogate too
    store.append("j2", "o", "other job\n", "n2")
    assert [r["d"] for r in store.read("j1")] == ["one\n", "h\u00e9 \ud800\n"]
    assert all(line.isascii() for line in _raw(store, "j1"))
    assert store.read("j2") == [{"s": "o", "d": "other job\n", "n": "n2"}]
    assert [r["d"] for r in store.read("j1", 1)] == ["h\u00e9 \ud800\n"]
    assert store.read("missing") == []


def test_a_job_reopened_after_its_close_keeps_what_it_had(make: Make) -> None:
    """A requeued job's next run (or a late notice) appends after the earlier records."""
    store = make()
    store.append("j", "o", "first run\n", "n1", epoch=1, end=10)
    store.close("j")
    store.append("j", "o", "second run\n", "n2", epoch=2, end=11)
    assert [r["d"] for r in store.read("j")] == ["first run\n", "second run\n"]


def test_a_job_past_its_cap_stores_a_marker_and_drops_the_rest(make: Make) -> None:
    """The record that crosses the cap is cut to end within it, one marker follows on
    stderr, and nothing more is stored for the job: notes, later runs, resends."""
    store = make()
    store.cap = 1024
    store.append("j", "o", "x" * 500 + "\n", "n1", epoch=1, end=501)
    store.append("j", "o", "y" * 5000, "n1", epoch=1, end=5501)
    size = store.file_sizes()["j"]
    store.append("j", "e", "more\n", "n1", epoch=1, end=5)
    store.append("j", "e", "a master's note\n", "n1")
    store.close("j")
    store.append("j", "o", "second run\n", "n2", epoch=2, end=11)  # a requeued run
    assert store.file_sizes()["j"] == size
    records = store.read("j")
    assert [r["d"][:1] for r in records] == ["x", "y", "\n"]
    lines = _raw(store, "j")
    assert 1024 - 12 < len(b"\n".join(lines[:2])) + 1 <= 1024
    assert lines[1].endswith(b'"ep":1,"at":5501}')  # where the run stands: a resume skips it
    assert records[2] == {
        "s": "e",
        "d": "\nmgpu: output truncated at 1 KiB (limits.max_output_per_job)\n",
        "n": "n1",
    }
    assert store.resume_point("j", 1, "n1") == (ALL_SENT, ALL_SENT)


def test_a_cut_never_splits_an_escape(make: Make) -> None:
    """Text whose characters take up to 12 bytes each in the file is cut between them."""
    store = make()
    store.cap = 300
    text = '\U0001f600\u00e9"\x01' * 100
    store.append("j", "o", text, "n1", epoch=1, end=1000)
    records = store.read("j")  # each line parses: no escape was cut
    assert records[0]["d"] and text.startswith(records[0]["d"])
    assert records[1]["d"].startswith("\nmgpu: output truncated at 300 bytes")
    assert 300 - 12 < len(_raw(store, "j")[0]) + 1 <= 300


def test_a_record_that_does_not_fit_at_all_leaves_only_the_marker(make: Make) -> None:
    store = make()
    store.cap = 60
    store.append("j", "o", "ab\n", "n1", epoch=1, end=3)  # 44 bytes: 16 left
    store.append("j", "o", "cd\n", "n1", epoch=1, end=6)
    assert [r["d"][:5] for r in store.read("j")] == ["ab\n", "\nmgpu"]


def test_a_restarted_master_counts_what_it_finds(make: Make) -> None:
    """The count is the stored size, read at the first append after a restart: a full
    job stays full (no second marker), one below the cap fills up to it."""
    first = make()
    first.cap = 1024
    first.append("full", "o", "z" * 2000, "n1", epoch=1, end=2000)
    first.append("half", "o", "h" * 500, "n1", epoch=1, end=500)
    first.close_all()

    second = make()
    second.cap = 1024
    full = _raw(second, "full")
    # Nothing more is wanted of a full job's run: the agent is told it has it all.
    assert second.resume_point("full", 1, "n1") == (ALL_SENT, ALL_SENT)
    assert second.resume_point("half", 1, "n1") == (500, 0)
    second.append("full", "o", "after the restart", "n1", epoch=1, end=2017)
    assert _raw(second, "full") == full
    second.append("half", "o", "h" * 1000, "n1", epoch=1, end=1500)
    assert [r["d"][:5] for r in second.read("half")] == ["h" * 5, "h" * 5, "\nmgpu"]
    assert second.file_sizes()["half"] <= 1024 + 100


def test_a_lowered_cap_marks_a_job_already_past_it_once(make: Make) -> None:
    first = make()
    first.append("j", "o", "w" * 3000, "n1", epoch=1, end=3000)  # no cap
    first.close_all()

    second = make()
    second.cap = 1024
    second.append("j", "o", "more", "n1", epoch=1, end=3004)
    second.close("j")
    second.append("j", "o", "and more", "n1", epoch=1, end=3012)
    assert [r["d"][:5] for r in second.read("j")] == ["w" * 5, "\nmgpu"]


def test_resume_points_are_per_run_node_and_stream(make: Make) -> None:
    first = make()
    first.append("j", "o", "old", "n1", epoch=1, end=999)
    first.append("j", "o", "a" * 100, "n1", epoch=2, end=100)
    first.append("j", "e", "b", "n1", epoch=2, end=40)
    first.append("j", "o", "note", "n2")  # a step's output: no run offsets
    first.append("j", "o", "c", "n2", epoch=2, end=7)
    assert first.resume_point("j", 2, "n1") == (100, 40)
    first.close_all()
    second = make()
    assert second.resume_point("j", 2, "n1") == (100, 40)
    assert second.resume_point("j", 2, "n2") == (7, 0)
    assert second.resume_point("j", 3, "n1") == (0, 0)
    assert second.accept("j", 2, "n1", "o", "aaXY", 98, 102) == "XY"  # the new part only
    assert second.accept("j", 2, "n1", "o", "Z", 110, 111) is None  # after a gap


def test_a_users_bytes_are_counted_capped_and_given_back(make: Make) -> None:
    outputs = make()
    owners = {"a1": "alice", "a2": "alice", "b1": "bob"}
    outputs.owner = owners.get
    outputs.user_cap = 200
    outputs.append("a1", "o", "x" * 100, "n1")
    used = outputs.user_bytes["alice"]
    outputs.append("a2", "o", "y" * 100, "n1")  # would pass 200: the marker instead
    outputs.append("a2", "o", "z", "n1")  # and nothing more of that job
    outputs.append("b1", "o", "bob", "n1")
    (marker,) = outputs.read("a2")
    assert marker["s"] == "e" and MARKER in marker["d"]
    assert "200 bytes (limits.max_output_per_user)" in marker["d"]
    files = outputs.file_sizes()
    assert outputs.user_bytes == {"alice": files["a1"] + files["a2"], "bob": files["b1"]}
    outputs.close("a1")
    assert outputs.delete("b1", "bob") == 0  # still open: the job is not over
    assert outputs.delete("a1", "alice") == files["a1"]
    assert outputs.read("a1") == [] and "a1" not in outputs.file_sizes()
    assert outputs.user_bytes["alice"] == files["a2"] and files["a1"] == used
    outputs.add_usage({"carol": 7})
    assert outputs.user_bytes["carol"] == 7
    assert outputs.delete("never", "bob") == 0


def test_a_follower_reads_what_is_appended_after_it_began(make: Make) -> None:
    async def main() -> None:
        store = make()
        store.append("j", "o", "one\n", "n1")
        wake = store.subscribe("j")
        reader = store.reader("j", 0)
        assert [json.loads(x)["d"] async for x in reader.chunks()] == ["one\n"]
        wake.clear()
        store.append("j", "e", "two\n", "n1")
        assert wake.is_set()
        assert [json.loads(x)["d"] async for x in reader.chunks()] == ["two\n"]
        reader.close()
        store.unsubscribe("j", wake)

    asyncio.run(main())


def test_a_follower_gets_every_record_once_while_appends_and_flushes_go_on(make: Make) -> None:
    """Thousands of records appended in bursts on the loop while a follower reads (and, in
    PostgreSQL, the flusher moves them from memory to the table): each arrives once, in
    order; a one-off read from a record count gets the rest."""

    async def main() -> None:
        store = make()
        wake = store.subscribe("j")
        got: list[str] = []
        done = asyncio.Event()

        async def follower() -> None:
            reader = store.reader("j", 0)
            while True:
                wake.clear()
                async for chunk in reader.chunks():
                    got.extend(json.loads(x)["d"] for x in chunk.splitlines())
                if done.is_set():
                    break
                await wake.wait()
            reader.close()

        task = asyncio.create_task(follower())
        for burst in range(30):
            for i in range(200):
                store.append("j", "o", f"{burst}.{i}\n", "n1", epoch=1, end=burst * 200 + i)
            await asyncio.sleep(0.01)
        store.close("j")
        done.set()
        await asyncio.wait_for(task, 30)
        want = [f"{b}.{i}\n" for b in range(30) for i in range(200)]
        assert got == want
        assert [r["d"] for r in store.read("j", 5990)] == want[5990:]

    asyncio.run(main())


def test_when_stored_calls_back_once_what_was_appended_is_stored(make: Make) -> None:
    store = make()
    called = threading.Event()
    store.append("j", "o", "x", "n1")
    store.when_stored(called.set)
    assert called.wait(10)


# ---- PostgreSQL --------------------------------------------------------------


def _rows(url: str, job_id: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT line FROM job_output WHERE job_id = %s ORDER BY n", (job_id,)
        ).fetchall()
    return [r[0] for r in rows]


@pytest.fixture
def slow_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """No flush but the test's own."""
    monkeypatch.setattr(pgoutputs, "FLUSH_INTERVAL", 3600.0)
    monkeypatch.setattr(pgoutputs, "FLUSH_RECORDS", 10**9)


def _count_writes(store: PgOutputStore) -> list[int]:
    """The store's flush transactions, counted in the list's one item."""
    writes = [0]
    write = store._write

    def counted(conn: Any, batch: Any) -> None:
        writes[0] += 1
        write(conn, batch)

    store._write = counted  # type: ignore[method-assign]
    return writes


def test_appends_go_in_a_few_transactions(pg_url: str) -> None:
    store = PgOutputStore(pg_url, Fence())
    writes = _count_writes(store)
    try:
        for i in range(20000):
            store.append("j", "o", f"line {i}\n", "n1", epoch=1, end=i + 1)
        stored = threading.Event()
        store.when_stored(stored.set)
        assert stored.wait(30)
        assert len(_rows(pg_url, "j")) == 20000
        assert writes[0] <= 200  # a transaction per FLUSH_RECORDS or FLUSH_INTERVAL, not per line
    finally:
        store.close_all()


def test_a_reader_sees_buffered_records_then_stored_ones(pg_url: str, slow_flush: None) -> None:
    store = PgOutputStore(pg_url, Fence())
    try:
        for i in range(600):
            store.append("j", "o", f"{i}\n", "n1")
        reader = store.reader("j")
        first = reader.step(100)
        assert first is not None and len(first.splitlines()) < 600
        assert _rows(pg_url, "j") == []  # all in memory yet
        assert store.flush() == 600
        assert len(_rows(pg_url, "j")) == 600
        store.append("j", "o", "600\n", "n1")  # and one buffered past the stored rows
        rest = b""
        while (chunk := reader.step()) is not None:
            rest += chunk
        got = [json.loads(x)["d"] for x in (first + rest).splitlines()]
        assert got == [f"{i}\n" for i in range(601)]
        assert [r["d"] for r in store.read("j", 599)] == ["599\n", "600\n"]
    finally:
        store.close_all()


def test_a_reader_says_how_far_what_it_read_is_stored(pg_url: str, slow_flush: None) -> None:
    """What a follower read from the leader's memory is not stored for good: a client
    reopens after a failover from `stored()`, not from what it received (the new leader
    numbers the agent's copy of the rest otherwise: client/resume.py)."""
    store = PgOutputStore(pg_url, Fence())
    try:
        for i in range(5):
            store.append("j", "o", f"{i}\n", "n1", epoch=1, end=2 * (i + 1))
        assert store.flush() == 5
        for i in range(5, 8):
            store.append("j", "o", f"{i}\n", "n1", epoch=1, end=2 * (i + 1))
        reader = store.reader("j", 2)
        assert reader.stored() == 2
        while reader.step() is not None:
            pass
        assert reader.stored() == 5  # read 8, of which 3 from memory only
        assert store.flush() == 3
        assert reader.stored() == 8
        store.close("j")
        assert store.reader("j", 8).stored() == 8  # out of memory: all stored
    finally:
        store.close_all()


def test_a_file_reader_has_every_record_it_read_stored(tmp_path: Path) -> None:
    store = FileOutputStore(tmp_path)
    store.append("j", "o", "a\n", "n1")
    reader = store.reader("j")
    assert reader.step() is not None
    assert reader.stored() is None
    reader.close()


def test_an_ended_jobs_last_records_are_written_at_its_close(pg_url: str, slow_flush: None) -> None:
    """Before the controller stores the job's end: a master killed then has both."""
    store = PgOutputStore(pg_url, Fence())
    try:
        store.append("j", "o", "last\n", "n1", epoch=1, end=5)
        assert _rows(pg_url, "j") == []
        store.close("j")
        assert _rows(pg_url, "j") == ['{"s":"o","d":"last\\n","n":"n1","ep":1,"at":5}']
    finally:
        store.close_all()


def test_jobs_that_end_within_the_flush_gap_share_one_flush(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each close wakes the flusher: the first is written at once, the closes after it,
    within FLUSH_GAP, together (one transaction, not one each)."""
    monkeypatch.setattr(pgoutputs, "FLUSH_GAP", 2.0)  # far longer than the closes take
    store = PgOutputStore(pg_url, Fence())
    writes = _count_writes(store)

    async def end_jobs() -> None:
        stored = [asyncio.Event() for _ in range(10)]
        loop = asyncio.get_running_loop()
        for i, event in enumerate(stored):
            store.append(f"j{i}", "o", "done\n", "n1", epoch=1, end=5)
            store.close(f"j{i}")  # on the loop: wakes the flusher, does not wait
            store.when_stored(lambda e=event: loop.call_soon_threadsafe(e.set), ended=True)
            await asyncio.sleep(0.005)
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in stored)), 30)

    try:
        asyncio.run(end_jobs())
        assert all(len(_rows(pg_url, f"j{i}")) == 1 for i in range(10))
        assert 1 <= writes[0] <= 2  # one each without the gap
    finally:
        store.close_all()


def test_a_second_master_reads_what_the_first_stored(pg_url: str) -> None:
    first = PgOutputStore(pg_url, Fence())
    for i in range(1000):
        first.append("j", "o" if i % 2 else "e", f"{i}\n", "n1", epoch=3, end=i)
    first.append("k", "o", "other\n", "n2")
    stored = threading.Event()
    first.when_stored(stored.set)
    assert stored.wait(30)
    # The first master dies (no close_all): the second reads from the database alone.
    second = PgOutputStore(pg_url, Fence())
    try:
        assert [r["d"] for r in second.read("j")] == [f"{i}\n" for i in range(1000)]
        assert [r["d"] for r in second.read("j", 998)] == ["998\n", "999\n"]
        assert second.read("k") == [{"s": "o", "d": "other\n", "n": "n2"}]
        assert second.resume_point("j", 3, "n1") == (999, 998)
        assert second.file_sizes() == first.file_sizes()
        second.append("j", "o", "the new leader's\n", "n1", epoch=3, end=1010)
        assert second.read("j", 1000) == [
            {"s": "o", "d": "the new leader's\n", "n": "n1", "ep": 3, "at": 1010}
        ]
    finally:
        second.close_all()
        first.close_all()


def test_a_new_leaders_follower_sees_what_an_agent_resends_after_it_read(pg_url: str) -> None:
    """A follower on a new leader reads the job's stored rows to their end before the agent
    reconnects; then the agent re-sends what the old leader never stored, and it is flushed
    to the table before the follower looks again: the follower gets it all, once (the e2e
    `logs -f` through a failover lost those lines)."""
    first = PgOutputStore(pg_url, Fence())
    first.append("j", "o", "line-1\n", "n1")
    stored = threading.Event()
    first.when_stored(stored.set)
    assert stored.wait(30)
    leader = PgOutputStore(pg_url, Fence())  # the first is killed: a new leader
    try:
        reader = leader.reader("j", 1)  # the follower has line-1
        assert reader.step() is None  # the table read to its end
        for i in range(2, 41):  # the agent's re-sent lines, then stored
            leader.append("j", "o", f"line-{i}\n", "n1")
        leader.flush()
        got = b""
        while (chunk := reader.step()) is not None:
            got += chunk
        assert [json.loads(x)["d"] for x in got.splitlines()] == [
            f"line-{i}\n" for i in range(2, 41)
        ]
    finally:
        leader.close_all()
        first.close_all()


def test_a_deposed_master_stores_nothing(pg_url: str, slow_flush: None) -> None:
    fence = Fence()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(LEASE_SCHEMA)
        conn.execute(
            "INSERT INTO mgpu_lease (id, generation, holder, expires_at) "
            "VALUES (1, 4, 'me', now() + interval '1 minute')"
        )
    fence.generation = 4
    store = PgOutputStore(pg_url, fence)
    try:
        store.append("j", "o", "while leading\n", "n1", epoch=1, end=14)
        assert store.flush() == 1
        with psycopg.connect(pg_url, autocommit=True) as conn:  # another master took over
            conn.execute("UPDATE mgpu_lease SET generation = 5, holder = 'other'")
        store.append("j", "o", "after\n", "n1", epoch=1, end=20)
        with pytest.raises(Fenced):
            store.flush()
        assert store.fenced and fence.lost
        store.append("j", "o", "later\n", "n1", epoch=1, end=26)  # dropped
        with pytest.raises(Fenced):
            store.flush()
        assert _rows(pg_url, "j") == ['{"s":"o","d":"while leading\\n","n":"n1","ep":1,"at":14}']
        other = PgOutputStore(pg_url, Fence())
        assert other.resume_point("j", 1, "n1") == (14, 0)
        other.close_all()
    finally:
        store.close_all()


def test_appends_go_on_through_a_database_restart(postgres: Any, pg_url: str) -> None:
    store = PgOutputStore(pg_url, Fence())
    try:
        store.append("j", "o", "before\n", "n1", epoch=1, end=7)
        stored = threading.Event()
        store.when_stored(stored.set)
        assert stored.wait(30)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the test server's synchronous_commit=off: on disk now
        postgres.restart()
        store.append("j", "o", "after\n", "n1", epoch=1, end=13)
        assert [r["d"] for r in store.read("j")] == ["before\n", "after\n"]
        stored.clear()
        store.when_stored(stored.set)
        assert stored.wait(30)
        assert len(_rows(pg_url, "j")) == 2
    finally:
        store.close_all()


def test_appends_and_followers_go_on_while_the_database_is_down(postgres: Any, pg_url: str) -> None:
    """Appends buffer while the database is away (nothing waits on it), a follower past
    the stored rows reads them from memory, and they are written once it is back."""
    store = PgOutputStore(pg_url, Fence())
    try:
        store.append("j", "o", "before\n", "n1", epoch=1, end=7)
        store.append("k", "o", "k's first run\n", "n1", epoch=1, end=14)
        store.close("k")  # requeued: its next run's first append finds no database
        reader = store.reader("j")
        assert reader.step() is not None
        stored = threading.Event()
        store.when_stored(stored.set)
        assert stored.wait(30)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the test server's synchronous_commit=off: on disk now
        postgres.kill()
        try:
            for i in range(100):
                store.append("j", "o", f"{i}\n", "n1", epoch=1, end=8 + i)
            during = reader.step()
            assert during is not None and len(during.splitlines()) == 100
            store.append("k", "o", "k's second run\n", "n2", epoch=2, end=15)
            store.append("new", "e", "a new job\n", "n2", epoch=1, end=10)
            stored.clear()
            store.when_stored(stored.set)
        finally:
            postgres.start()
        assert stored.wait(60)
        assert len(_rows(pg_url, "j")) == 101
        assert [r["d"] for r in store.read("k")] == ["k's first run\n", "k's second run\n"]
        assert [r["d"] for r in store.read("new")] == ["a new job\n"]
        assert store.resume_point("k", 2, "n2") == (15, 0)
    finally:
        store.close_all()


def test_a_sqlite_clusters_files_are_imported(tmp_path: Path, pg_url: str) -> None:
    files = FileOutputStore(tmp_path / "output")
    files.cap = 1024
    files.append("a", "o", "one\n", "n1", epoch=1, end=4)
    files.append("a", "e", "two\n", "n1", epoch=1, end=4)
    files.append("a", "o", "a note\n", "n1")
    files.append("full", "o", "z" * 2000, "n1", epoch=2, end=2000)
    files.close_all()
    with open(tmp_path / "output" / "a.jsonl", "ab") as f:
        f.write(b'{"s":"o","d":"cut by a cra')  # a master killed mid-write
    assert import_output_files(tmp_path / "output", pg_url) == 2
    assert import_output_files(tmp_path / "output", pg_url) == 0  # already there

    store = PgOutputStore(pg_url, Fence())
    store.cap = 1024
    try:
        assert [r["d"] for r in store.read("a")] == ["one\n", "two\n", "a note\n"]
        assert store.resume_point("a", 1, "n1") == (4, 4)
        assert store.resume_point("full", 2, "n1") == (ALL_SENT, ALL_SENT)
        before = store.read("full")
        store.append("full", "o", "more", "n1", epoch=2, end=2004)
        assert store.read("full") == before  # full, and its marker not written twice
        files = FileOutputStore(tmp_path / "output")
        want = files.file_sizes()
        want["a"] -= len(b'{"s":"o","d":"cut by a cra')
        assert store.file_sizes() == want
    finally:
        store.close_all()


def test_open_output_store_picks_by_database(tmp_path: Path, pg_url: str) -> None:
    assert isinstance(open_output_store(None, tmp_path, Fence()), FileOutputStore)
    store = open_output_store(pg_url, tmp_path, Fence())
    try:
        assert isinstance(store, PgOutputStore)
    finally:
        store.close_all()


def test_a_fresh_jobs_first_record_looks_nothing_up(pg_url: str) -> None:
    """A job whose first run this master started (`fresh`) has nothing stored: its first
    record is numbered from 0 without a query for its stored size (a round trip and a
    statement a job on PostgreSQL); any other job's first record asks."""
    store = PgOutputStore(pg_url, Fence())
    asked: list[str] = []
    size = store._size

    def counted(job_id: str, wait: float = 10.0) -> tuple[int, int, bool]:
        asked.append(job_id)
        return size(job_id, wait)

    store._size = counted  # type: ignore[method-assign]
    try:
        store.fresh("f")
        store.append("f", "o", "first\n", "n1", epoch=1, end=6)
        store.append("g", "o", "first\n", "n1", epoch=1, end=6)
        assert asked == ["g"]
        store.close("f")
        store.close("g")
        assert _rows(pg_url, "f") == _rows(pg_url, "g") != []
    finally:
        store.close_all()
