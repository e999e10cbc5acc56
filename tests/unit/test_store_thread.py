"""PostgreSQL's statements run in the store's own thread (store/dbthread.py): a caller on
the event loop waits `answer_within` at most for a database that does not answer, a read
is refused at once while it does not, and the writes given meanwhile are made, in order,
once it answers again.  The database here is paused as a frozen machine would be: every
process of its server stopped (SIGSTOP); it is a server of the test's own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import pgserver
from mgpu.master.store.base import StoreStalled
from mgpu.master.store.postgres import PostgresStore
from mgpu.testing import wait_for
from pgserver import PgServer

WITHIN = 0.5
"""The store's answer_within here."""
QUICK = 0.3
"""What a refusal at once may take (a loaded machine included)."""


@pytest.fixture
def server() -> Iterator[PgServer]:
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (scripts/install-system-deps.sh installs it)")
    server = PgServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()


def timed(call: Callable[[], object]) -> tuple[float, BaseException | None]:
    t = time.monotonic()
    try:
        call()
    except BaseException as e:
        return time.monotonic() - t, e
    return time.monotonic() - t, None


@contextlib.contextmanager
def paused_at_most(server: PgServer, seconds: float) -> Iterator[None]:
    """`server.paused()`, continued after `seconds` whatever happens inside (a store that
    waits for ever then shows it in its calls' times, instead of hanging the test)."""
    pids = server.processes()

    def resume() -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    timer = threading.Timer(seconds, resume)
    timer.start()
    try:
        with server.paused():
            yield
    finally:
        timer.cancel()


def test_a_paused_database_is_waited_for_a_bounded_time_and_writes_keep_their_order(
    server: PgServer,
) -> None:
    store = PostgresStore(server.create_database())
    store.answer_within = WITHIN
    try:
        store.set_meta("k", "0")

        async def on_the_loop() -> list[tuple[str, float, BaseException | None]]:
            seen = []
            with paused_at_most(server, 20):
                for what, call in (
                    ("first write", lambda: store.set_meta("k", "1")),
                    ("second write", lambda: store.set_meta("k", "2")),
                    ("read", lambda: store.get_meta("k")),
                ):
                    took, error = timed(call)
                    seen.append((what, took, error))
                assert not store.answering()
            return seen

        seen = asyncio.run(on_the_loop())
        (_, first, e1), (_, second, e2), (_, read, e3) = seen
        assert isinstance(e1, StoreStalled) and WITHIN <= first < WITHIN + 2, seen
        assert isinstance(e2, StoreStalled) and second < QUICK, seen  # no second wait
        assert isinstance(e3, StoreStalled) and read < QUICK, seen
        assert str(e3) == "the database does not answer (paused or cut): try again"
        # Continued: both writes were made, in the order given, and it answers again.
        wait_for(store.answering, timeout=30, what="the store to answer again")
        assert store.get_meta("k") == "2"
    finally:
        store.close()
