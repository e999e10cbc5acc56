"""A client's session with the masters: it finds the leading one and talks to it over a
small pool of keep-alive connections (`mgpu.wire`), in TLS where the cluster's CA says so.

Every request goes through `_through_leader`: a master that cannot be reached, or a
standby, sends it on to the next one (or the one the standby names) while a failover
runs; a request whose answer was lost is asked again only when that does no harm.  A
leader whose database is away answers at once with a 503 and `Retry-After`: a request
that does no harm asked twice (a read, a submit with its idempotency key) is asked again
after that wait, for as long as a failover is waited for (`_Patience`), so that a paused,
cut or restarting database costs users a wait, not an error.  With
several masters, a wait for an answer is watched (`mgpu.client.leaderwatch`): a leader
that says nothing (stopped, frozen) is left as soon as another master leads, never waited
on for the whole timeout nor asked again.  The pool lets threads sharing one Client (as
the contract allows) each talk on a connection of their own.  Nothing here imports ssl or
urllib until a dial needs them (the CLI's start-up budget).
"""

from __future__ import annotations

import _thread  # a lock without importing `threading` (the CLI's start-up budget)
import os
import time

from mgpu.client import jsonlite as json  # json's loads/dumps, without its import cost
from mgpu.client.errors import (
    ConnectError,
    LostConnection,
    NoAnswer,
    RequestError,
    Standby,
    Unavailable,
)
from mgpu.client.leader import (
    FAILOVER_WAIT,
    MULTI_CONNECT_TIMEOUT,
    found_leader,
    known_leader,
    resolve_addresses,
    shown_address,
)
from mgpu.client.leaderwatch import LeaderWatch, NewLeader
from mgpu.errors import MgpuError
from mgpu.idempotent import keyed
from mgpu.masters import Search, Transport, leader_elsewhere
from mgpu.wire import Connection

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and collections.abc cost the CLI's start-up ~2 ms
    from collections.abc import Callable
    from typing import Any, TypeVar

    _T = TypeVar("_T")

MAX_IDLE_CONNECTIONS = 8
"""Idle keep-alive connections a Client keeps; more threads than this open and close."""

SUBMIT_PATH = "/api/jobs"
"""Where jobs are submitted (each submit carries its own idempotency key)."""


LAPSED = "x-mgpu-lease"
"""A leader whose lease ran out says so on its answers (`lapsed`; mgpu.master.http.standby):
a client of several masters then asks the others whether one leads now."""


class MasterSession:
    """The connection side of `mgpu.Client`: which master leads, and the requests to it."""

    def __init__(
        self,
        address: str | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        token: str | None = None,
        tls: bool | None = None,
    ) -> None:
        """`address` is "host:port", optionally "https://host:port" or "http://..." to force
        or refuse TLS; otherwise TLS is used for every host but loopback, and loopback
        falls back to it when the master speaks only TLS.  A TLS master's token, or a pinned
        CA: TLS always, unless told plain (mgpu.masters.Transport).

        Several masters (one leads, the others stand by) are "host:port,host:port": the
        client finds the leader among them, remembers it for the process, and while a
        failover runs tries again for $MGPU_FAILOVER_WAIT seconds (default 30)."""
        scheme, self.addresses = resolve_addresses(address or host, port)
        self.host, self.port = known_leader(self.addresses)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        wait = os.environ.get("MGPU_FAILOVER_WAIT", "")
        self.failover_wait_set = bool(wait.strip())
        try:
            self.failover_wait = float(wait) if self.failover_wait_set else FAILOVER_WAIT
        except ValueError:
            raise MgpuError(f"$MGPU_FAILOVER_WAIT={wait!r} is not a number of seconds") from None
        from mgpu.credentials import find_token

        self.token = find_token(token)
        if tls is None and scheme is not None:
            tls = scheme == "https"
        if os.environ.get("MGPU_INSECURE") and tls is None:
            tls = False
        told = None if tls is None else ("https" if tls else "http")
        self.transport = Transport(told, self.token)
        """TLS or plain for each dial: TLS only for a TLS master's token or a pinned CA."""
        self.tls = False
        self._tls_auto = False
        self._choose_tls()
        self._ssl_context: Any = None
        self._lock = _thread.allocate_lock()
        """Guards the idle pool; never held while talking to the master."""
        self._tls_lock = _thread.allocate_lock()
        self._idle: list[Connection] = []
        self._lapsed: tuple[str, int] | None = None
        """The master whose last answer said its lease ran out (`LAPSED`)."""

    @property
    def address(self) -> str:
        """The master this client talks to now (the leader, once found)."""
        return shown_address((self.host, self.port))

    def _choose_tls(self) -> None:
        address = (self.host, self.port)
        self.tls = self.transport.tls(address)
        self._tls_auto = self.transport.may_switch(address)
        """A plain dial closed at once may be tried in TLS (a loopback `--tls` master)."""

    def _use(self, address: tuple[str, int]) -> None:
        """Talk to this master from now on (its own TLS choice; the CA is the cluster's)."""
        if address == (self.host, self.port):
            return
        self.host, self.port = address
        self._choose_tls()
        self.close()

    def _through_leader(
        self,
        attempt: Callable[[], _T],
        safe: bool,
        what: str,
        drop: Callable[[_T], None] | None = None,
    ) -> _T:
        """`attempt()` on the leader: on a master that cannot be reached, or a standby, the
        next one (or the one the standby names) until one leads.  After a lost answer only
        when `safe` (a read): a request that makes something may have been done.  A read
        answered by a master out of its lease (`lapsed`) is asked once of the one that
        leads, if another does; `drop(result)` lets go of the answer left (a stream)."""
        search: _Search | None = None
        patience: _Patience | None = None
        moved = len(self.addresses) < 2  # nowhere else to ask
        while True:
            self._lapsed = None
            try:
                result = attempt()
            except Standby as e:
                search = search or _Search(self)
                search.next(e, e.leader)
                continue
            except Unavailable as e:  # the leader's database is away: nothing was done
                if not safe:
                    raise
                if len(self.addresses) > 1:  # away for this master alone (cut off from
                    search = search or _Search(self)  # it): another may lead by now
                    search.next(e)
                    continue
                patience = patience or _Patience(self)
                patience.wait(e)
                continue
            except LostConnection as e:
                if not safe:
                    raise LostConnection(
                        f"{e}; the master may or may not have done {what} (look before "
                        "trying again)"
                    ) from None
                search = search or _Search(self)
                search.next(e)
                continue
            except ConnectError as e:  # never reached it: the request surely was not made
                search = search or _Search(self)
                search.next(e)
                continue
            except NoAnswer as e:  # a stopped leader takes connections and says nothing
                if e.leader is not None and not safe:
                    self._use(e.leader)  # the next request goes there
                    raise NoAnswer(
                        f"{e}: it may or may not have done {what} (look before trying again)",
                        e.leader,
                    ) from None
                if not safe or len(self.addresses) < 2:
                    raise
                search = search or _Search(self)
                search.next(e, shown_address(e.leader) if e.leader else None)
                continue
            if safe and self._lapsed == (self.host, self.port) and not moved:
                moved = True  # once: the answer of a master whose lease ran out
                other = self.leader_elsewhere((self.host, self.port))
                if other is not None:  # it is cut off alone: ask the one that leads
                    if drop is not None:
                        drop(result)
                    self._use(other)
                    continue
            found_leader(self.addresses, (self.host, self.port))
            return result

    # ---- transport ----------------------------------------------------------

    def _connect_wait(self) -> float:
        if len(self.addresses) > 1:
            return min(self.connect_timeout, MULTI_CONNECT_TIMEOUT)
        return self.connect_timeout

    def _tls_context(self) -> Any:
        with self._tls_lock:  # one CA fetch, however many threads start at once
            if self._ssl_context is None:
                from mgpu import tlsutil

                fingerprint = self.transport.fingerprint
                if not fingerprint:
                    raise MgpuError(
                        f"the master at {self.address} uses TLS and no token names its CA "
                        "(set $MGPU_TOKEN, or use http:// for a master started with --insecure)"
                    )
                try:
                    pem = tlsutil.cached_ca(self.host, self.port, fingerprint, self._connect_wait())
                except tlsutil.CAMismatch as e:
                    raise MgpuError(f"cannot verify the master at {self.address}: {e}") from None
                except ssl_errors() as e:
                    raise self._tls_failed(e) from None
                except OSError as e:  # down, slow, reset, or not an mgpu master
                    raise self._unreachable(e) from None
                self._ssl_context = tlsutil.client_context(pem)
            return self._ssl_context

    def _connect(self, timeout: float | None) -> Connection:
        if not self.tls and self.transport.plain_refused((self.host, self.port)):
            self.tls = True  # the CA became known meanwhile: never a token in clear again
        context = self._tls_context() if self.tls else None
        try:
            conn = Connection(self.host, self.port, self._connect_wait(), context)
        except OSError as e:  # ssl's errors included; `ssl` imported only if it was used
            if context is not None and isinstance(e, ssl_errors()):
                raise self._tls_failed(e) from None
            raise self._unreachable(e) from None
        conn.settimeout(timeout)
        if len(self.addresses) > 1:
            conn.watch = LeaderWatch((self.host, self.port), self.leader_elsewhere)
        return conn

    def leader_elsewhere(self, here: tuple[str, int]) -> tuple[str, int] | None:
        """The listed master other than `here` that leads now (its `/readyz`), if any (a
        TLS one once the cluster's CA is pinned: once one master showed it)."""
        return leader_elsewhere(self.addresses, here, self.transport, self._ssl_context)

    def _tls_failed(self, e: Exception) -> MgpuError:
        # A ConnectError: the search goes on to the other masters (one may be an impostor).
        why = str(getattr(e, "reason", None) or e).replace("_", " ").lower()  # no "(_ssl.c:N)"
        return ConnectError(
            f"TLS with the mgpu master at {self.address} failed ({why}): is something else on "
            "its port? (if the master runs with --insecure, use http://)"
        )

    def _unreachable(self, e: OSError) -> ConnectError:
        if isinstance(e, TimeoutError):
            reason = f"no answer within {self._connect_wait():g} s"
        elif isinstance(e, ConnectionRefusedError):
            reason = "connection refused"
        elif isinstance(e, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
            reason = "connection reset"
        elif isinstance(e, ConnectionError) and not e.strerror:
            # WireError, tlsutil.CAFetchError: something answered, but not as a master does.
            return ConnectError(f"the server at {self.address} is not an mgpu master ({e})")
        else:
            reason = e.strerror or str(e) or type(e).__name__
        return ConnectError(
            f"cannot reach the mgpu master at {self.address} ({reason}); "
            "is `mgpu master` running? (set --host/--port or $MGPU_MASTER)"
        )

    def _checkout(self, timeout: float, fresh: bool) -> tuple[Connection, bool]:
        """An idle connection to this master (unless `fresh`) that the master has not
        closed, else a new one; and whether it is new."""
        while not fresh:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if (conn.host, conn.port) != (self.host, self.port) or _dropped(conn):
                conn.close()  # another master's, or closed by the master (it went away)
                continue
            conn.settimeout(timeout)
            return conn, False
        return self._connect(timeout), True

    def _checkin(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        safe = method == "GET" or path == "/api/wait"  # reads: asked again, no harm done
        headers = None
        if method == "POST" and (path == SUBMIT_PATH or keyed(method, path)):
            # Sent again after a lost answer (a failover), the same key makes no second job
            # (nor a second step, nor another answer to a cancel: mgpu.idempotent).
            headers = {"Idempotency-Key": os.urandom(16).hex()}
            safe = True
        return self._through_leader(
            lambda: self._exchange(method, path, data, timeout, headers),
            safe,
            f"{method} {path.partition('?')[0]}",
        )

    def _exchange(
        self,
        method: str,
        path: str,
        data: bytes | None,
        timeout: float | None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """One request to the master at hand (a kept-alive connection the master closed
        meanwhile: once more on a new one); its decoded answer.  Once a request went out
        and its answer was lost, any failure after is a LostConnection: it may be done."""
        lost: OSError | None = None
        flipped = False
        while True:
            was_tls = self.tls
            try:
                conn, fresh = self._checkout(timeout or self.timeout, fresh=lost is not None)
            except ConnectError:
                if flipped:
                    self._choose_tls()  # nothing there: not a TLS-only master after all
                if lost is not None:  # the first try may have reached it
                    raise self._broken(lost, "did not answer in time") from None
                raise
            try:
                resp = conn.request(method, path, data, {**self._headers(), **(headers or {})})
                raw = resp.read()
            except OSError as e:
                conn.close()
                if flipped:
                    self._choose_tls()
                if lost is not None:
                    raise self._broken(e, "did not answer in time") from None
                lost = e
                if fresh and not was_tls and self._tls_auto and isinstance(e, ConnectionError):
                    # Closed or reset at once (a timeout is not that): a loopback master may
                    # speak only TLS (--tls): try it.
                    self.tls = flipped = True
                    continue
                if fresh or isinstance(e, TimeoutError):
                    # A timeout is no connection the master closed: asked again here, it
                    # would wait as long again (a stopped leader).
                    raise self._broken(e, "did not answer in time") from None
                # A kept-alive connection the server closed (it restarted, or timed it out):
                # the other idle ones are likely gone too.  Retry once on a new one.
                self.close()
                continue
            if resp.will_close:
                conn.close()
            else:
                self._checkin(conn)
            self._note_lapse(conn, resp.headers)
            return self._decode(resp.status, raw, resp.headers)

    def _note_lapse(self, conn: Connection, headers: Any) -> None:
        """Remember a master whose answer says its lease ran out (`_through_leader` then
        asks the one that leads instead, if another does)."""
        if headers.get(LAPSED) == "lapsed":
            self._lapsed = (conn.host, conn.port)

    def _broken(self, e: OSError, timed_out: str) -> MgpuError:
        """One sentence for a connection that failed mid-request."""
        if isinstance(e, NewLeader):
            return NoAnswer(
                f"the mgpu master at {self.address} said nothing for {e.waited:.0f} s and "
                f"{shown_address(e.leader)} leads now",
                e.leader,
            )
        if isinstance(e, TimeoutError):
            return NoAnswer(f"the mgpu master at {self.address} {timed_out}")
        return LostConnection(f"lost the connection to the mgpu master at {self.address}: {e}")

    @staticmethod
    def _decode(status: int, raw: bytes, headers: dict[str, str] | None = None) -> Any:
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        if status >= 400:
            detail = payload.get("detail") if isinstance(payload, dict) else None
            if not isinstance(detail, str):
                detail = f"the master answered HTTP {status}"
            if status == 503:
                hint = (headers or {}).get("x-mgpu-leader")
                # A standby, or a leader still opening the cluster: not serving yet.
                if isinstance(payload, dict) and payload.get("role") in ("standby", "leader"):
                    leader = payload.get("leader")
                    raise Standby(detail, leader if isinstance(leader, str) else hint)
                if hint:
                    raise Standby(detail, hint)
                retry_after = _seconds((headers or {}).get("retry-after"))
                if retry_after is not None:  # a leader whose database does not answer now
                    raise Unavailable(detail, retry_after)
            raise RequestError(status, detail)
        return payload

    def close(self) -> None:
        """Close the idle connections (the Client stays usable: it reconnects)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Search:
    """One request's walk through the masters until one leads (`mgpu.masters.Search` says
    where to go next), with the wait while a failover runs and one line at the end."""

    def __init__(self, client: MasterSession) -> None:
        self.client = client
        self.walk = Search(client.addresses, client.transport)
        self.errors: dict[tuple[str, int], str] = {}
        self.deadline: float | None = None
        self.delay = 0.05

    def next(self, error: MgpuError, hint: str | None = None) -> None:
        """Move the client to the next master to try (after a pause once every one was
        tried), or raise when the search is over."""
        c = self.client
        here = (c.host, c.port)
        self.errors[here] = _reason(error)
        after = self.walk.failed(here, hint, silent=isinstance(error, NoAnswer))
        if after is not None:
            c._use(after)
            return
        standby = isinstance(error, Standby)
        wait = c.failover_wait if (len(c.addresses) > 1 or standby) else 0.0
        if c.failover_wait_set and not standby:
            wait = c.failover_wait
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + wait
        if now + self.delay > self.deadline:
            raise self._final(error, wait)
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 1.0)
        c._use(self.walk.again())  # where the leader was last said to be

    def _final(self, error: MgpuError, wait: float) -> MgpuError:
        if len(self.errors) == 1:
            if wait <= 0:
                return error  # one master, as always: its own sentence
            return ConnectError(f"{error} (still so after {wait:g} s)")
        where = "; ".join(f"{shown_address(a)}: {why}" for a, why in self.errors.items())
        after = f" after {wait:g} s" if wait > 0 else ""
        return ConnectError(
            f"no mgpu master leads{after} ({where}); is a failover stuck? (set --host or "
            "$MGPU_MASTER to HOST:PORT,HOST:PORT; $MGPU_FAILOVER_WAIT: seconds to wait)"
        )


class _Patience:
    """One request's waits on a leader whose database is away: its `Retry-After` each time
    (half a second at least, five at most), as long as a failover is waited for (with one
    master, unless $MGPU_FAILOVER_WAIT is set: none, its 503 is the answer)."""

    def __init__(self, client: MasterSession) -> None:
        c = client
        several = len(c.addresses) > 1 or c.failover_wait_set
        self.wait_for = c.failover_wait if several else 0.0
        self.deadline = time.monotonic() + self.wait_for

    def wait(self, error: Unavailable) -> None:
        """Sleep before the request is sent again, or raise `error` when the wait is over."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            if self.wait_for > 0:
                raise Unavailable(f"{error} (still so after {self.wait_for:g} s)", 0) from None
            raise error
        time.sleep(min(max(error.retry_after, 0.5), 5.0, left))


def _seconds(value: str | None) -> float | None:
    """A `Retry-After` of seconds (its date form is not sent by masters: None)."""
    try:
        seconds = float(value) if value is not None else -1.0
    except ValueError:
        return None
    return seconds if seconds >= 0 else None  # NaN too


def _reason(error: MgpuError) -> str:
    if isinstance(error, Standby):
        return "a standby, " + ("the leader is " + error.leader if error.leader else "no leader")
    text = str(error)
    if "(" in text and ")" in text:  # "cannot reach ... at X (connection refused); ..."
        return text[text.index("(") + 1 : text.index(")")]
    return text


def _dropped(conn: Connection) -> bool:
    """Has the master closed this idle connection (or said something unasked)?  Then it is
    not used: a request written to it could be lost with no way to know whether it was
    read (a master that went away closed it)."""
    import select

    try:
        ready, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def ssl_errors() -> tuple[type[Exception], ...]:
    import ssl

    return (ssl.SSLError, ssl.CertificateError)
