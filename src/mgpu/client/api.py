"""`mgpu.Client`: a small typed client for the master's HTTP API.

Built on a minimal HTTP/1.1 transport (`mgpu.wire`) so that `import mgpu`
and the CLI start fast (no HTTP stack to import for a one-shot `mgpu queue`).
Keep-alive connections are reused across calls: a small pool, so that threads sharing
one Client (as the contract allows) each talk on a connection of their own.
"""

from __future__ import annotations

import _thread  # a lock without importing `threading` (the CLI's start-up budget)
import os
import time

from mgpu.client import jsonlite as json  # json's loads/dumps, without its import cost
from mgpu.errors import MgpuError as MgpuError  # the client's errors derive from it
from mgpu.masters import Search, Transport
from mgpu.wire import Connection, WireError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and collections.abc cost the CLI's start-up ~2 ms
    from collections.abc import Callable, Iterator
    from typing import Any, TypeVar

    _T = TypeVar("_T")

DEFAULT_ADDRESS = "127.0.0.1:8080"
WAIT_BATCH = 1000
"""Job ids per /api/wait request: the master's limit."""
MAX_IDLE_CONNECTIONS = 8
"""Idle keep-alive connections a Client keeps; more threads than this open and close."""

SUBMIT_PATH = "/api/jobs"
"""Where jobs are submitted (each submit carries its own idempotency key)."""


class ConnectError(MgpuError):
    pass


class RequestError(MgpuError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SubmittedJob:
    """What submit returns: the job id, for an array the task ids, and `warnings`:
    sentences about variables that were not passed to the job (the CLI prints them).
    (A plain class: importing dataclasses costs the CLI ~10 ms at start-up.)"""

    __slots__ = ("id", "task_ids", "warnings")

    def __init__(
        self, id: str, task_ids: list[str] | None = None, warnings: list[str] | None = None
    ) -> None:
        self.id = id
        self.task_ids = task_ids
        self.warnings = warnings or []

    def __repr__(self) -> str:
        return f"SubmittedJob(id={self.id!r}, task_ids={self.task_ids!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubmittedJob) and (self.id, self.task_ids) == (
            other.id,
            other.task_ids,
        )


FAILOVER_WAIT = 30.0
"""Seconds a client looks for a leader while a failover runs ($MGPU_FAILOVER_WAIT): with
several masters, or told by a standby that no master leads yet."""
FOLLOW_SILENCE = 20.0
"""Seconds without a word (the master pings a job's followers every 5 s) after which a
follower of several masters looks for the leader again: a stopped one says nothing."""
MULTI_CONNECT_TIMEOUT = 3.0
"""Seconds to reach one master of several before trying the next (a machine that is off
answers nothing); at most the client's own connect timeout."""
_leaders: dict[tuple[tuple[str, int], ...], tuple[str, int]] = {}
"""Where the leader of each list of masters was found last, for this process."""


def resolve_addresses(
    address: str | None = None, port: int | None = None
) -> tuple[str | None, list[tuple[str, int]]]:
    """The scheme given (or None) and the masters: `address` (--host: `HOST[:PORT],...`),
    else $MGPU_MASTER, else 127.0.0.1:8080; a host without a port takes `port` (default
    8080), and a single address takes `port` whatever it says (as --port always did)."""
    from mgpu.addresses import AddressError, parse_addresses

    env = os.environ.get("MGPU_MASTER", "")
    text, what = (address, "--host") if address else (env, "$MGPU_MASTER")
    if not text.strip():
        text, what = DEFAULT_ADDRESS, "address"
    try:
        scheme, found = parse_addresses(text, port or 8080, what)
    except AddressError as e:
        raise MgpuError(f"{e} (give HOST:PORT, or several as HOST:PORT,HOST:PORT)") from None
    if port and len(found) == 1:
        found = [(found[0][0], port)]
    return scheme, found


def resolve_address(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """The first master of `resolve_addresses`."""
    return resolve_addresses(host, port)[1][0]


class LostConnection(ConnectError):
    """The connection broke after the request was sent: the master may have done it."""


class NoAnswer(MgpuError):
    """The master took the request and said nothing in time (slow, or stopped)."""


class Standby(RequestError):
    """A standby master's 503: `leader` is where it says the leader is (None: no leader)."""

    def __init__(self, message: str, leader: str | None) -> None:
        super().__init__(503, message)
        self.leader = leader


class _Search:
    """One request's walk through the masters until one leads (`mgpu.masters.Search` says
    where to go next), with the wait while a failover runs and one line at the end."""

    def __init__(self, client: Client) -> None:
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
        after = self.walk.failed(here, hint)
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
        where = "; ".join(f"{_shown_address(a)}: {why}" for a, why in self.errors.items())
        after = f" after {wait:g} s" if wait > 0 else ""
        return ConnectError(
            f"no mgpu master leads{after} ({where}); is a failover stuck? (set --host or "
            "$MGPU_MASTER to HOST:PORT,HOST:PORT; $MGPU_FAILOVER_WAIT: seconds to wait)"
        )


def _reason(error: MgpuError) -> str:
    if isinstance(error, Standby):
        return "a standby, " + ("the leader is " + error.leader if error.leader else "no leader")
    text = str(error)
    if "(" in text and ")" in text:  # "cannot reach ... at X (connection refused); ..."
        return text[text.index("(") + 1 : text.index(")")]
    return text


def _shown_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Client:
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
        self.host, self.port = _leaders.get(tuple(self.addresses)) or self._cached_leader()
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

    @property
    def address(self) -> str:
        """The master this client talks to now (the leader, once found)."""
        return _shown_address((self.host, self.port))

    def _leader_file(self) -> str:
        """Where the leader of this list of masters was found last, for the next process
        (so a master that is off costs one search, not one per command)."""
        key = ",".join(_shown_address(a) for a in self.addresses)
        name = "".join(c if c.isalnum() or c in ".-" else "_" for c in key)[:200]
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        return os.path.join(cache, "mgpu", f"leader-{name}")

    def _cached_leader(self) -> tuple[str, int]:
        """The leader found last by any process (one of the listed masters), else the
        first master; with one master: it, and no file is read."""
        if len(self.addresses) > 1:
            try:
                with open(self._leader_file()) as f:
                    text = f.read(300).strip()
            except (OSError, ValueError):
                text = ""
            for address in self.addresses:
                if text == _shown_address(address):
                    _leaders[tuple(self.addresses)] = address
                    return address
        return self.addresses[0]

    def _cache_leader(self) -> None:
        path = self._leader_file()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fresh = f"{path}.{os.getpid()}"
            with open(fresh, "w") as f:
                f.write(_shown_address((self.host, self.port)) + "\n")
            os.replace(fresh, path)
        except OSError:
            pass  # a read-only home: each process searches again

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

    def _through_leader(self, attempt: Callable[[], _T], safe: bool, what: str) -> _T:
        """`attempt()` on the leader: on a master that cannot be reached, or a standby, the
        next one (or the one the standby names) until one leads.  After a lost answer only
        when `safe` (a read): a request that makes something may have been done."""
        search: _Search | None = None
        while True:
            try:
                result = attempt()
            except Standby as e:
                search = search or _Search(self)
                search.next(e, e.leader)
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
                if not safe or len(self.addresses) < 2:
                    raise
                search = search or _Search(self)
                search.next(e)
                continue
            here = (self.host, self.port)
            key = tuple(self.addresses)
            if len(key) > 1 and here in key and _leaders.get(key) != here:
                _leaders[key] = here  # a listed master only: a hinted one is for this search
                self._cache_leader()
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
        return conn

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
        if method == "POST" and path == SUBMIT_PATH:
            # Sent again after a lost answer (a failover), the same key makes no second job.
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
                if fresh:
                    raise self._broken(e, "did not answer in time") from None
                # A kept-alive connection the server closed (it restarted, or timed it out):
                # the other idle ones are likely gone too.  Retry once on a new one.
                self.close()
                continue
            if resp.will_close:
                conn.close()
            else:
                self._checkin(conn)
            return self._decode(resp.status, raw, resp.headers)

    def _broken(self, e: OSError, timed_out: str) -> MgpuError:
        """One sentence for a connection that failed mid-request."""
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
            raise RequestError(status, detail)
        return payload

    def close(self) -> None:
        """Close the idle connections (the Client stays usable: it reconnects)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- API ----------------------------------------------------------------

    def submit(self, command: str | list[str], **options: Any) -> SubmittedJob:
        """Queue a job.  A string runs with /bin/sh -c; a list is executed directly.

        Options are those of `mgpu submit`: gpus, gpu_ids, node_gpu_ids, nodes,
        gpus_per_node, nodelist, exclude, name, time ("1:00:00"), priority,
        retries, dependency ("afterok:ID"), array ("0-9%2"), distributed, mpi,
        preemptible, gpu_type, policy, cwd, env, gpu_share (0.25), reservation.

        Without `cwd` the job runs in this directory (refused if its path is not UTF-8:
        the job would run elsewhere).  Without `env` it gets this process's environment,
        as Slurm's `--export=ALL`, less the variables that cannot travel (name or value
        not UTF-8, name not a variable name).  Variables the scheduler sets itself
        (`CUDA_VISIBLE_DEVICES`, `MGPU_*`, `SLURM_*`, ...) are dropped by the master.
        Both are named in the result's `warnings`, except mgpu's own `MGPU_*` settings
        and, inside an mgpu job, what the job's environment holds anyway.
        """
        body: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        if isinstance(command, str):
            body["command"] = command
        else:
            body["argv"] = list(command)
        warnings: list[str] = []
        if "cwd" not in body:
            body["cwd"] = _submit_dir()
        inherited = "env" not in body
        if inherited:
            body["env"], skipped = _portable_environment(os.environ)
            if skipped:
                warnings.append(
                    "not passed to the job (name or value not UTF-8, or not a variable "
                    f"name): {_names(skipped)}"
                )
        out = self._request("POST", SUBMIT_PATH, body)
        dropped = [str(n) for n in out.get("dropped_env") or ()]
        if inherited:
            # Set by mgpu for the client (MGPU_MASTER, MGPU_TOKEN), or, inside a job, by
            # mgpu for that job: nobody expects those to be passed on.
            in_job = "MGPU_JOB_ID" in os.environ
            dropped = [] if in_job else [n for n in dropped if not n.startswith("MGPU_")]
        if dropped:
            warnings.append(f"not passed to the job, mgpu sets them itself: {_names(dropped)}")
        warnings += [str(w) for w in out.get("warnings") or ()]  # the master's (a partition)
        return SubmittedJob(out["job_id"], out.get("task_ids"), warnings)

    def queue(self, all: bool = False, fold: bool = False) -> dict[str, Any]:
        """`{"jobs": [...], "nodes": [...]}`; `fold`: an array's queued tasks as one entry
        (the first, with `array_tasks`, their indices as ranges, and `array_count`)."""
        query = "&".join(q for q, on in (("all=1", all), ("fold=1", fold)) if on)
        return dict(self._request("GET", "/api/jobs" + (f"?{query}" if query else "")))

    def show(self, job_id: str, all: bool = False) -> dict[str, Any]:
        """One job; an array id gives `{"array_job_id", "counts", "tasks", "more"}`: its
        tasks by state and the first 1,000 of them (`all`: every one)."""
        path = f"/api/jobs/{_quote(job_id)}" + ("?limit=0" if all else "")
        return dict(self._request("GET", path))

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/api/nodes")["nodes"])

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/api/jobs/{_quote(job_id)}/cancel"))

    def submit_script(
        self, script: str, args: list[str] | None = None, name: str = "script", **options: Any
    ) -> SubmittedJob:
        """Queue a job script (its text): sent with the job and run on the node with its
        `#!` interpreter (else /bin/sh), `args` as its arguments.  Its `#MGPU`/`#SBATCH`
        lines are read by `mgpu submit FILE`, not here: pass the options."""
        return self.submit(list(args or []), script=script, script_name=name, **options)

    def signal(
        self, job_id: str, signal: str | int, batch_only: bool = False, full: bool = False
    ) -> dict[str, Any]:
        """Send `signal` (`"USR1"`, 10) to a running job now (an array id: its running
        tasks): to its steps and, unless it is a Slurm batch job, all of its processes;
        `full`: a batch job's script and its children too; `batch_only`: the batch script's
        shell only (Slurm's `scancel -f` and `-b`).  `{"jobs": [{"job_id", "changed",
        "message"}]}`; a queued job is refused (409)."""
        body = {"signal": signal, "batch_only": batch_only, "full": full}
        return dict(self._request("POST", f"/api/jobs/{_quote(job_id)}/signal", body))

    def hold(self, job_id: str) -> dict[str, Any]:
        """Keep a queued job (or an array's queued tasks) from starting:
        `{"jobs": [{"job_id", "changed", "message"}]}`."""
        return dict(self._request("POST", f"/api/jobs/{_quote(job_id)}/hold"))

    def release(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/api/jobs/{_quote(job_id)}/release"))

    def requeue(self, job_id: str) -> dict[str, Any]:
        """Stop a running job and queue it again (no retry spent)."""
        return dict(self._request("POST", f"/api/jobs/{_quote(job_id)}/requeue"))

    def update(
        self,
        job_id: str,
        time: str | None = None,
        priority: int | None = None,
        gpus: int | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        """Change a queued job (time, priority, GPUs, name) or a running one (time, name)."""
        body = {"time": time, "priority": priority, "gpus": gpus, "name": name}
        body = {k: v for k, v in body.items() if v is not None}
        return dict(self._request("POST", f"/api/jobs/{_quote(job_id)}/update", body))

    def drain(self, node_id: str, reason: str | None = None) -> dict[str, Any]:
        return dict(
            self._request("POST", f"/api/nodes/{_quote(node_id)}/drain", {"reason": reason})
        )

    def resume(self, node_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/api/nodes/{_quote(node_id)}/resume"))

    def remove_node(self, node_id: str) -> dict[str, Any]:
        """Forget a node and its secret (admin): `{"removed": ID, "requeued": [job ids]}`."""
        return dict(self._request("DELETE", f"/api/nodes/{_quote(node_id)}"))

    def history(
        self,
        user: str | None = None,
        state: str | None = None,
        since: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Finished jobs with their accounting: {"since", "jobs": [...]} (since: 7d, 12h...)."""
        query = _query(user=user, state=state, since=since, limit=limit)
        return dict(self._request("GET", "/api/history" + query))

    def report(self, by: str = "user", since: str | None = None) -> dict[str, Any]:
        """GPU-hours, jobs, success rate and waits per user or node: {"rows", "total"}."""
        return dict(self._request("GET", "/api/report" + _query(by=by, since=since)))

    def utilisation(self, hours: float = 6.0, points: int = 72) -> dict[str, Any]:
        """Allocated and measured GPU utilisation over the last `hours`."""
        return dict(self._request("GET", "/api/utilisation" + _query(hours=hours, points=points)))

    def wait(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job has ended (or `timeout` seconds passed); return the job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            chunk = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
            job = self._request(
                "GET", f"/api/jobs/{_quote(job_id)}/wait?timeout={chunk}", timeout=chunk + 30
            )
            if job["state"] not in ("queued", "running"):
                return dict(job)
            if deadline is not None and time.monotonic() >= deadline:
                return dict(job)

    def start_step(self, job_id: str, host: str, argv: list[str]) -> str:
        """Start `argv` on one of a running job's nodes; returns the step id."""
        out = self._request(
            "POST", f"/api/jobs/{_quote(job_id)}/steps", {"host": host, "argv": argv}
        )
        return str(out["step_id"])

    def step_stream(self, step_id: str) -> Iterator[dict[str, Any]]:
        return self._stream_path(f"/api/steps/{_quote(step_id)}/output", read_timeout=3600 * 24)

    def start_alloc_step(self, job_id: str, argv: list[str], **options: Any) -> dict[str, Any]:
        """Run `argv` as a step of the running allocation `job_id` (`mgpu srun` inside
        `mgpu alloc`): {"step_id", "nodes"}.  Options: nodelist, pty, pty_size, cwd, env
        (default: this directory and environment, as submit)."""
        body: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        body["argv"] = list(argv)
        body.setdefault("cwd", _submit_dir())
        if "env" not in body:
            body["env"] = _portable_environment(os.environ)[0]
        return dict(self._request("POST", f"/api/allocations/{_quote(job_id)}/steps", body))

    def end_allocation(self, job_id: str, exit_code: int) -> dict[str, Any]:
        """The allocation's command ended with `exit_code`: end the allocation (completed,
        or failed with that code)."""
        path = f"/api/allocations/{_quote(job_id)}/end"
        return dict(self._request("POST", path, {"exit_code": exit_code}))

    def cancel_step(self, step_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/api/steps/{_quote(step_id)}/cancel"))

    def attach(self, run_id: str, since: int = 0, output: bool = True) -> Any:
        """Open the attach WebSocket of a job or step held by this client (a terminal, an
        allocation): a `mgpu.client.websocket.WebSocket`, blocking, no timeout.  On the
        leader (found as for a request); `since`: the output records already had."""
        path = f"/api/jobs/{_quote(run_id)}/attach?since={since}&output={int(output)}"
        return self._through_leader(lambda: self._attach_once(path), True, "attach")

    def _attach_once(self, path: str) -> Any:
        from mgpu.client.websocket import HandshakeError, ProtocolError, WebSocket

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        while True:
            was_tls = self.tls
            conn = self._connect(self.connect_timeout)
            try:
                ws = WebSocket.open(conn.sock, f"{self.host}:{self.port}", path, headers)
            except HandshakeError as e:
                conn.close()
                if e.status == 503 and (e.standby or e.leader):
                    raise Standby(e.detail, e.leader) from None
                raise RequestError(e.status, e.detail) from None
            except OSError as e:
                conn.close()
                closed = isinstance(e, ConnectionError) and not isinstance(e, ProtocolError)
                if not was_tls and self._tls_auto and closed:
                    self.tls = True  # a loopback master may speak only TLS (--tls)
                    continue
                raise self._broken(e, "did not answer in time") from None
            conn.sock.settimeout(None)  # the caller's select loop decides how long to wait
            return ws

    def whoami(self) -> dict[str, Any]:
        return dict(self._request("GET", "/api/whoami"))

    def create_token(
        self, user: str, admin: bool = False, allow_root: bool = False
    ) -> dict[str, Any]:
        body = {"user": user, "admin": admin, "allow_root": allow_root}
        return dict(self._request("POST", "/api/tokens", body))

    def tokens(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/api/tokens")["tokens"])

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return dict(self._request("DELETE", f"/api/tokens/{_quote(token_id)}"))

    def reserve(
        self,
        name: str,
        gpus: int,
        start: str | float = "now",
        duration: str | None = None,
        end: str | float | None = None,
        users: list[str] | None = None,
        nodelist: str | None = None,
        ignore_jobs: bool = False,
    ) -> dict[str, Any]:
        """Set GPUs aside for a window (admin): `start` is `now`, `now+MINUTES` or epoch
        seconds; the length is `duration` (`--time` syntax) or `end`.  Returns the
        reservation with the GPUs chosen."""
        body: dict[str, Any] = {"name": name, "gpus": gpus, "start": start}
        for key, value in (
            ("duration", duration),
            ("end", end),
            ("users", users),
            ("nodelist", nodelist),
            ("ignore_jobs", ignore_jobs or None),
        ):
            if value is not None:
                body[key] = value
        return dict(self._request("POST", "/api/reservations", body))

    def reservations(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/api/reservations")["reservations"])

    def delete_reservation(self, name: str) -> dict[str, Any]:
        return dict(self._request("DELETE", f"/api/reservations/{_quote(name)}"))

    def audit(self, since: float = 0.0) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/api/audit?since={since}")["events"])

    def wait_all(self, job_ids: list[str], timeout: float | None = None) -> list[dict[str, Any]]:
        """Block until every listed job has ended (or `timeout` passed); return them.

        The master answers for at most WAIT_BATCH ids a request: a longer list is waited
        for in batches, each asked again until its jobs have ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        found: dict[str, dict[str, Any]] = {}
        left_ids = list(dict.fromkeys(job_ids))
        while True:
            for i in range(0, len(left_ids), WAIT_BATCH):
                batch = left_ids[i : i + WAIT_BATCH]
                now = time.monotonic()
                left = 30.0 if deadline is None else max(0.0, min(30.0, deadline - now))
                out = self._request(
                    "POST", "/api/wait", {"ids": batch, "timeout": left}, timeout=left + 30
                )
                found.update((j["id"], j) for j in out["jobs"])
            left_ids = [i for i in left_ids if found[i]["state"] in ("queued", "running")]
            if not left_ids or (deadline is not None and time.monotonic() >= deadline):
                return [found[i] for i in job_ids]

    def logs(self, job_id: str) -> str:
        """The job's output so far, stdout and stderr interleaved as they came."""
        return "".join(r.get("d", "") for r in self.stream(job_id, follow=False))

    def stream(
        self, job_id: str, follow: bool = True, read_timeout: float = 60.0, since: int = 0
    ) -> Iterator[dict[str, Any]]:
        """Output records ({"s","d","n"}), and when following, status lines and a last
        {"end": true, "state", "exit_code"} line."""
        path = f"/api/jobs/{_quote(job_id)}/output?follow={'1' if follow else '0'}&since={since}"
        if len(self.addresses) > 1:  # the master pings every 5 s: a silent one has stopped
            read_timeout = min(read_timeout, FOLLOW_SILENCE)
        return self._stream_path(path, read_timeout)

    def _stream_path(self, path: str, read_timeout: float) -> Iterator[dict[str, Any]]:
        """The NDJSON records of a streamed GET, from the leader.  A connection that breaks
        midway raises LostConnection (a ConnectError): the caller asks again with what it
        has (`since`); a record is only ever given whole."""
        conn, resp = self._through_leader(
            lambda: self._open_stream(path, read_timeout), True, "GET"
        )
        try:
            try:
                for line in resp.lines():
                    if not line.endswith(b"\n"):  # cut short: the master went away
                        raise WireError("the master closed the connection mid-record")
                    yield json.loads(line)
            except OSError as e:  # WireError included
                raise self._broken(e, f"sent no word for {read_timeout:g} s") from None
        finally:
            conn.close()

    def _open_stream(self, path: str, read_timeout: float) -> tuple[Connection, Any]:
        wait = min(read_timeout, self.timeout)  # the head of the answer comes at once
        conn = self._connect(wait)
        try:
            resp = conn.request("GET", path, None, self._headers())
            if resp.status >= 400:
                self._decode(resp.status, resp.read(), resp.headers)
            conn.settimeout(read_timeout)
        except OSError as e:
            conn.close()
            raise self._broken(e, f"sent no word for {wait:g} s") from None
        except BaseException:
            conn.close()
            raise
        return conn, resp


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


# What mgpu.execspec.is_env_name accepts (not imported: the CLI must start fast).
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*|BASH_FUNC_[A-Za-z_][A-Za-z0-9_.:+-]*%%"


def _portable_environment(environ: Any) -> tuple[dict[str, str], list[str]]:
    """The variables of `environ` a job can be given, and the names of the others (shown
    with their non-UTF-8 bytes escaped)."""
    import re

    name_ok = re.compile(_ENV_NAME).fullmatch
    env: dict[str, str] = {}
    skipped: list[str] = []
    for name, value in environ.items():
        if name_ok(name) and _is_utf8(value):
            env[name] = value
        else:
            skipped.append(_shown(name))
    return env, sorted(skipped)


def _submit_dir() -> str:
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise MgpuError(
            "the current directory no longer exists; cd to one that does (the job runs there)"
        ) from None
    if not _is_utf8(cwd):
        raise MgpuError(
            f"the current directory {_shown(cwd)} is not valid UTF-8, and the job would run "
            "there; submit from another directory or give cwd"
        )
    return cwd


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """Printable on one line: bytes that are not UTF-8 (surrogates) and control
    characters escaped."""
    shown = os.fsencode(text).decode("utf-8", "backslashreplace")
    return shown if shown.isprintable() else shown.encode("unicode_escape").decode("ascii")


def _names(names: list[str]) -> str:
    """A list of variable names for one line: long families summed up (SLURM_* (42))."""
    families: dict[str, list[str]] = {}
    for name in names:
        prefix = name.partition("_")[0] + "_" if "_" in name[1:] else name
        families.setdefault(prefix, []).append(name)
    parts: list[str] = []
    for prefix, members in families.items():
        if len(members) > 3:
            parts.append(f"{prefix}* ({len(members)} variables)")
        else:
            parts.extend(members)
    return ", ".join(parts)


def _query(**params: Any) -> str:
    from urllib.parse import urlencode

    given = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(given) if given else ""


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _quote(part: str) -> str:
    if _UNRESERVED.issuperset(part):  # a job id: as quote() would leave it, without urllib
        return part
    if "/" in part:  # the server would decode it and match no route: a bare "Not Found"
        raise MgpuError(f"no job, node, step or token is called {part!r} (ids never contain '/')")
    from urllib.parse import quote

    return quote(part, safe="")


def _scheme(address: str | None) -> str | None:
    if address and "://" in address:
        return address.split("://", 1)[0].lower()
    return None


def ssl_errors() -> tuple[type[Exception], ...]:
    import ssl

    return (ssl.SSLError, ssl.CertificateError)
