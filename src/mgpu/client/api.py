"""`mgpu.Client`: a small typed client for the master's HTTP API, one method a call.

Finding the leading master and talking to it (pooled keep-alive connections, TLS, the
failover search) is `mgpu.client.session`; what a submit takes from this process (its
directory, its environment) is `mgpu.client.submitenv`.  Built on a minimal HTTP/1.1
transport (`mgpu.wire`) so that `import mgpu` and the CLI start fast (no HTTP stack to
import for a one-shot `mgpu queue`).
"""

from __future__ import annotations

import os
import time

from mgpu.client import jsonlite as json  # json's loads/dumps, without its import cost
from mgpu.client.errors import ConnectError as ConnectError
from mgpu.client.errors import LostConnection as LostConnection
from mgpu.client.errors import NoAnswer as NoAnswer
from mgpu.client.errors import RequestError as RequestError
from mgpu.client.errors import Standby as Standby
from mgpu.client.leader import FOLLOW_SILENCE
from mgpu.client.leader import resolve_address as resolve_address
from mgpu.client.leader import resolve_addresses as resolve_addresses
from mgpu.client.leaderwatch import STREAM_QUIET, LeaderWatch
from mgpu.client.session import SUBMIT_PATH, MasterSession
from mgpu.client.submitenv import portable_environment as _portable_environment
from mgpu.client.submitenv import shown_names as _names
from mgpu.client.submitenv import submit_dir as _submit_dir
from mgpu.errors import MgpuError as MgpuError  # the client's errors derive from it
from mgpu.wire import Connection, WireError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and collections.abc cost the CLI's start-up ~2 ms
    from collections.abc import Iterator
    from typing import Any

WAIT_BATCH = 1000
"""Job ids per /api/wait request: the master's limit."""


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


class Client(MasterSession):
    """The master's API, one method a call (the session underneath finds the leader)."""

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
        preemptible, gpu_type, policy, cwd, env, gpu_share (0.25), reservation, cpus
        (per node), mem ("8G" or MiB, per node), exclusive (whole nodes).

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
        begin: float | None = None,
    ) -> dict[str, Any]:
        """Change a queued job (time, priority, GPUs, name, `begin`: not started before this
        epoch time) or a running one (time, name)."""
        body = {"time": time, "priority": priority, "gpus": gpus, "name": name, "begin": begin}
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

    def step_stream(self, step_id: str, since: int = 0) -> Iterator[dict[str, Any]]:
        """A step's output records, then its end; `since`: the records already had."""
        path = f"/api/steps/{_quote(step_id)}/output" + (f"?since={since}" if since else "")
        return self._stream_path(path, read_timeout=3600 * 24)

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
        self,
        job_id: str,
        follow: bool = True,
        read_timeout: float = 60.0,
        since: int = 0,
        marks: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Output records ({"s","d","n"}), and when following, status lines and a last
        {"end": true, "state", "exit_code"} line.  `marks`: also {"stored": N}, how far the
        records are stored for good (where to reopen from: mgpu.client.resume)."""
        path = f"/api/jobs/{_quote(job_id)}/output?follow={'1' if follow else '0'}&since={since}"
        if marks:
            path += "&marks=1"
        if len(self.addresses) > 1:  # the master pings every 5 s: a silent one has stopped
            read_timeout = min(read_timeout, FOLLOW_SILENCE)
        return self._stream_path(path, read_timeout)

    def _stream_path(self, path: str, read_timeout: float) -> Iterator[dict[str, Any]]:
        """The NDJSON records of a streamed GET, from the leader.  A connection that breaks
        midway raises LostConnection (a ConnectError): the caller asks again with what it
        has (`since`); a record is only ever given whole."""
        conn, resp = self._through_leader(
            lambda: self._open_stream(path, read_timeout),
            True,
            "GET",
            drop=lambda opened: opened[0].close(),
        )
        if conn.watch is not None:  # several masters: a quiet stream is one that pings
            conn.watch = LeaderWatch((conn.host, conn.port), self.leader_elsewhere, STREAM_QUIET)
        try:
            try:
                for line in resp.lines():
                    if not line.endswith(b"\n"):  # cut short: the master went away
                        raise WireError("the master closed the connection mid-record")
                    yield json.loads(line)
            except OSError as e:  # WireError included
                error = self._broken(e, f"sent no word for {read_timeout:g} s")
                if isinstance(error, NoAnswer) and error.leader is not None:
                    self._use(error.leader)  # opened again there
                raise error from None
        finally:
            conn.close()

    def _open_stream(self, path: str, read_timeout: float) -> tuple[Connection, Any]:
        wait = min(read_timeout, self.timeout)  # the head of the answer comes at once
        conn = self._connect(wait)
        try:
            resp = conn.request("GET", path, None, self._headers())
            if resp.status >= 400:
                self._decode(resp.status, resp.read(), resp.headers)
            self._note_lapse(conn, resp.headers)  # cut off alone: follow the one that leads
            conn.settimeout(read_timeout)
        except OSError as e:
            conn.close()
            raise self._broken(e, f"sent no word for {wait:g} s") from None
        except BaseException:
            conn.close()
            raise
        return conn, resp


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
