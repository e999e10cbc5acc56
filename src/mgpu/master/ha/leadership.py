"""One leader among the masters of a PostgreSQL database: the lease loop, in its own thread.

Every master starts as a standby and tries to take the lease (`store/lease.py`) every
`retry` seconds; the one that takes it leads with the lease's new generation (the fence
every write checks, `store/fence.py`) and renews it every `renew` seconds for `ttl` seconds
from the database's clock.  The loop runs on its own connection in its own thread, so an
event loop busy for a second (a huge submit, a long pass) does not lose the lease.

The leader fences itself by time too: it sends agents nothing once its clock (`clock()`:
CLOCK_BOOTTIME, else `time.monotonic()`) has passed the start of its last successful
renewal plus the TTL (`may_send`).  The database set that lease's end at least that late,
so by the time a standby may take it over the old leader has stopped sending, whatever
happened to it meanwhile: a SIGSTOP, a pause, a network cut (that clock runs on while a
process is stopped, and through a suspend).  Its writes are refused by the fence once a
standby took over.  A leader that learns it lost the lease (its renewal refused, or a
write `Fenced`) steps down at once: `on_lost`, which in the master logs one line and,
without another write or message, replaces itself (`exec`) with a fresh start of the same
command: the same pid, back as a standby.

With the defaults (TTL 2.5 s, renew every 0.5 s, standbys try every 0.5 s) a standby leads
at most TTL + retry (3 s) after the leader's last renewal; the rest of the 5 s goes to
opening the cluster.

A leader stopped, paused or cut off in the middle of a write transaction holds the lease
row (its fence's `FOR KEY SHARE`) for as long as its database session lives.  A standby
reads the lease first and tries to take it only once it has expired, waiting `take_wait`
for the row at most; when that wait runs out it ends the expired holder's database sessions
(`lease.end_expired`: all of this master's connections carry its holder's tag in their
`application_name`, `link`) and takes the lease at its next try.  The leader's own sessions
also end themselves once idle in a transaction for the TTL
(`idle_in_transaction_session_timeout`), and PostgreSQL's TCP keepalives end those of a
master cut off from it within seconds (store/pglink.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgpu.master.store import lease
from mgpu.master.store.fence import Fence
from mgpu.master.store.pglink import Link, backend_tag, params

__all__ = ["EXIT_DEPOSED", "Leadership", "LeaseTiming", "advertised_address"]

log = logging.getLogger("mgpu.master")

EXIT_DEPOSED = 75
"""The master's exit status once another master took its lease, when it cannot (or, with
$MGPU_HA_NO_RESTART=1, may not) start itself again (EX_TEMPFAIL: start it again, it comes
back as a standby)."""
NO_RESTART_ENV = "MGPU_HA_NO_RESTART"


def clock() -> float:
    """Seconds on a clock that never goes back and runs on while the process is stopped
    (SIGSTOP) and, on Linux, while the machine is suspended (CLOCK_BOOTTIME): the leader's
    deadline to stop sending is measured on it."""
    return time.clock_gettime(BOOTTIME) if BOOTTIME is not None else time.monotonic()


BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


@dataclass(frozen=True)
class LeaseTiming:
    ttl: float = 2.5
    """Seconds a lease lasts from its last renewal, by the database's clock."""
    renew: float = 0.5
    """Seconds between the leader's renewals."""
    retry: float = 0.5
    """Seconds between a standby's tries to take the lease."""
    connect_timeout: float = 2.0
    """Seconds to (re)connect to the database or run one lease statement."""
    take_wait: float = 0.5
    """Seconds a standby's take waits for the lease row's lock (held by a write transaction
    of the leader) before it looks at whether that leader's lease has expired."""


def advertised_address(host: str, port: int, advertise: str | None = None) -> str:
    """HOST:PORT other masters and clients are told to reach this one at: `advertise` if
    given, else the bind host unless it is a wildcard, else this machine's address."""
    if advertise:
        return advertise if ":" in advertise.rsplit("]", 1)[-1] else f"{advertise}:{port}"
    if host not in ("0.0.0.0", "::", ""):
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = socket.gethostname()
    return f"{ip}:{port}"


class Leadership:
    """This master's part in the election: its role, the leader's address, and the lease
    loop (`start`, `stop`)."""

    def __init__(
        self,
        database: str,
        address: str,
        fence: Fence,
        timing: LeaseTiming | None = None,
        holder: str | None = None,
    ) -> None:
        self.database = database
        self.address = address
        self.fence = fence
        self.timing = timing or LeaseTiming()
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        idle = max(1000, round(self.timing.ttl * 1000))
        self.link = Link.of_holder(self.holder, idle_in_transaction_session_timeout=idle)
        """How this master's connections to the database are opened (store/pglink.py): its
        holder's tag, and a transaction left idle for the TTL ends its session (the lease
        row it holds is free for a standby then)."""
        self.leading = False
        """This master holds the lease (it may still be opening the cluster)."""
        self.serving = False
        """The cluster is open and scheduling (set by the edge)."""
        self.generation: int | None = None
        self.leader: str | None = None
        """The leader's address as last read (this master's own once it leads)."""
        self.lost: str | None = None
        """Why this master stepped down, once it did."""
        self.on_lead: Callable[[int], None] = lambda generation: None
        """Called in the lease thread when this master takes the lease."""
        self.on_lost: Callable[[str], None] = _exit_deposed
        """Called once when the lease is lost (in whatever thread found out)."""
        self._deadline = 0.0
        self._stop = threading.Event()
        self._release = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._db_down = False

    @property
    def role(self) -> str:
        return "leader" if self.leading else "standby"

    def may_send(self) -> bool:
        """Whether this master may send agents anything now: it leads and its lease, by
        its own clock (`clock()`), has not run out."""
        return (
            self.leading
            and self.lost is None
            and not self.fence.lost  # a write was refused: another master leads
            and clock() < self._deadline
        )

    def lapsed(self) -> bool:
        """This master leads, was not deposed, and its lease ran out by its own clock: its
        database is away (paused: it is the best answer there is) or it alone is cut off
        from it (another master may lead by now: mgpu.master.http.standby tells clients)."""
        return self.leading and self.lost is None and clock() >= self._deadline

    def may_hold(self) -> bool:
        """Whether what this master would send agents now may wait for its lease's renewal:
        its lease ran out by its own clock and nothing more (`lapsed`, and no write of it
        was refused).  Sent once renewed (the same generation: no other master led
        meanwhile); dropped once it learns it was deposed."""
        return self.lapsed() and not self.fence.lost

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mgpu-lease", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """End the lease loop; `release`: give the lease up at once (call it after the
        leader's last write) so that a standby need not wait for the TTL."""
        self._release = release
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timing.connect_timeout * 2 + 1)

    def deposed(self, why: str) -> None:
        """This master lost the lease: no write (the fence refuses from now on), no message
        (`may_send`), then `on_lost` once."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
            self.fence.lost = True
        self._stop.set()
        self.on_lost(why)

    # ---- the loop ---------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        timeout = self.timing.connect_timeout
        link = self.link.named("lease", statement_timeout=int(timeout * 1000))
        return psycopg.connect(
            **params(
                self.database,
                link,
                connect_timeout=max(1, round(timeout)),
                # A network cut must not hang the loop for TCP's minutes: a dead peer is
                # found within seconds, and a send unacknowledged for `timeout` fails.
                keepalives_idle=max(1, round(timeout)),
                keepalives_interval=1,
                keepalives_count=2,
                tcp_user_timeout=int(timeout * 1000),
            ),
            autocommit=True,
        )

    def _run(self) -> None:
        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                    lease.ensure_table(conn)
                    if self._db_down:
                        log.info("the database answers again")
                        self._db_down = False
                wait = self._step(conn)
            except Exception as e:  # the database is away: try again, a connection anew
                if not self._db_down:
                    log.warning(
                        "lease: the database does not answer (%s)%s",
                        str(e).splitlines()[0] if str(e) else type(e).__name__,
                        ": no work is sent to agents until the lease is renewed"
                        if self.leading
                        else "",
                    )
                    self._db_down = True
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                    conn = None
                wait = self.timing.retry
            self._stop.wait(wait)
        if conn is not None:
            self._finish(conn)

    def _step(self, conn: Any) -> float:
        """One take or renewal; the seconds to wait before the next."""
        timing = self.timing
        if self.leading:
            started = clock()
            assert self.generation is not None
            if lease.renew(conn, self.holder, self.generation, self.address, timing.ttl):
                self._deadline = started + timing.ttl
                return timing.renew
            row = lease.read(conn)
            self.leader = row.address if row is not None else None
            self.deposed(
                f"another master leads now (generation {row.generation if row else '?'}, "
                f"at {self.leader or 'an unknown address'}); this master's was "
                f"{self.generation}"
            )
            return 0.0
        row = lease.read(conn)
        if row is None or not row.live:
            started = clock()
            generation = self._take(conn, row)
            if generation is not None:
                self._deadline = started + timing.ttl
                self.generation = generation
                self.fence.generation = generation
                self.leader = self.address
                self.leading = True
                log.info("leading the cluster (lease generation %d)", generation)
                self.on_lead(generation)
                return timing.renew
            row = lease.read(conn)
        leader = row.address if row is not None and row.live else None
        if leader != self.leader:
            log.info("standing by: %s", f"the leader is {leader}" if leader else "no leader yet")
            self.leader = leader
        return timing.retry

    def _take(self, conn: Any, row: lease.LeaseRow | None) -> int | None:
        """Take the expired (or absent) lease `row`: the new generation, else None.  A take
        that waits too long for the row (a write transaction of the expired holder holds
        it) ends that holder's database sessions and tries once more."""
        import psycopg

        timing = self.timing
        for attempt in (1, 2):
            try:
                return lease.take(conn, self.holder, self.address, timing.ttl, timing.take_wait)
            except psycopg.errors.LockNotAvailable:
                if attempt == 2 or row is None or row.holder == self.holder:
                    return None
            ended = lease.end_expired(conn, row, backend_tag(row.holder))
            if not ended:
                return None  # renewed meanwhile, or taken by another standby
            log.warning(
                "the expired lease (generation %d) was still held by a transaction of its "
                "leader (stopped, or cut off from the database): ended its %d database "
                "session(s)",
                row.generation,
                len(ended),
            )
        return None

    def _finish(self, conn: Any) -> None:
        try:
            if self._release and self.leading and self.lost is None and self.generation:
                lease.release(conn, self.holder, self.generation)
                log.info("lease released: a standby may lead at once")
        except Exception:
            pass
        try:
            conn.close()
        except Exception:
            pass


def _exit_deposed(why: str) -> None:
    """Step down the only sure way: no other line of this process runs (no flush, no
    message to an agent, nothing the event loop had queued).  The process image is
    replaced by a fresh start of the same command (`exec`: the same pid, every socket and
    thread of the old leadership gone), which comes back as a standby; if that cannot be
    done, it exits with EXIT_DEPOSED for its supervisor to start it again."""
    log.critical("deposed: %s; starting again as a standby", why)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    if os.environ.get(NO_RESTART_ENV) != "1":
        try:
            # The same argv, which holds no database password: `mgpu master` refuses one
            # there (mgpu/dbaddress.py); a --database-file is read again.
            os.execv(sys.executable, sys.orig_argv)
        except OSError as e:
            log.critical("cannot start again (%s): exiting with status %d", e, EXIT_DEPOSED)
    os._exit(EXIT_DEPOSED)
