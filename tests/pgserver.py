"""A throwaway PostgreSQL server for the tests: `initdb` in a temp dir, run as an unprivileged
account (PostgreSQL refuses root), listening on loopback only with `trust` auth.

Debian's `postgresql` package (installed by scripts/install-system-deps.sh) gives the
binaries under /usr/lib/postgresql/VERSION/bin and the `postgres` account; where neither is
found the tests that need a server skip.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

USER = "mgpu"
"""The database superuser initdb makes (any name works with trust auth)."""


def bindir() -> Path | None:
    """The newest PostgreSQL server binaries on this machine, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_version)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _version(path: Path) -> float:
    try:
        return float(path.parent.parent.name)
    except ValueError:
        return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL server: `start()`, `url(db)`, `create_database()`, `stop()`, and
    `kill()`/`restart()` for the tests that take it away under running masters.

    Streaming replication (docs/HA.md's recipe): `standby()` makes a hot standby of this
    server with `pg_basebackup -R` and starts it; `promote()` turns a standby into a primary
    (`pg_ctl promote`).  `settings` are extra `-c NAME=VALUE` for this server's command line
    (a synchronous primary: `synchronous_standby_names="*"`, `synchronous_commit="on"`)."""

    def __init__(
        self,
        bin_dir: Path,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        parent: str = "/tmp",
    ) -> None:
        self.bin = bin_dir
        self.port = port or free_port()
        self.settings = dict(settings or {})
        self.dir = Path(tempfile.mkdtemp(prefix="mgpu-pg-", dir=parent))
        self.data = self.dir / "data"
        self.account: str | None = None
        if os.geteuid() == 0:
            self.account = "postgres" if _has_account("postgres") else "nobody"
            os.chmod(self.dir, 0o700)
            shutil.chown(self.dir, user=self.account)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.account is not None:
            cmd = ["setpriv", f"--reuid={self.account}", f"--regid={self.account}"]
            cmd += ["--init-groups", *args]
        return subprocess.run(
            cmd, cwd=self.dir, capture_output=True, text=True, timeout=120, check=check
        )

    def start(self) -> PgServer:
        if not self.data.exists():
            self._run(
                str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                "--no-sync", "-E", "UTF8", "--locale=C",
            )  # fmt: skip
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.dir / "log"), "-o", self._options())
        return self

    def _options(self) -> str:
        settings = {"synchronous_commit": "off", **self.settings}
        # pg_ctl hands -o to a shell
        extra = "".join(f" -c {k}={shlex.quote(v)}" for k, v in settings.items())
        return (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c max_connections=200" + extra
        )

    # ---- streaming replication ------------------------------------------------------

    def standby(self, synchronous: bool = False) -> PgServer:
        """A hot standby of this (running) server, started: a base backup taken over the
        replication protocol (`pg_basebackup -R -X stream`, which writes `standby.signal`
        and `primary_conninfo` into the copy's `postgresql.auto.conf`), on its own port.

        `synchronous`: then make this server wait for the standby at each commit
        (`ALTER SYSTEM SET synchronous_standby_names = '*'`; give this server
        `synchronous_commit=on` in `settings`), and return once the standby is in sync."""
        import psycopg

        other = PgServer(self.bin)
        other._run(
            str(self.bin / "pg_basebackup"), "-D", str(other.data), "-h", "127.0.0.1",
            "-p", str(self.port), "-U", USER, "-R", "-X", "stream", "-c", "fast",
            "--no-sync",
        )  # fmt: skip
        other.start()
        if synchronous:
            with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
                deadline = time.monotonic() + 60
                while not conn.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the standby did not become synchronous")
                    time.sleep(0.05)
        return other

    def promote(self) -> None:
        """Make this standby a primary (`pg_ctl promote -w`: returns once it takes writes)."""
        self._pg_ctl("promote", "-w", "-t", "60")

    def in_recovery(self) -> bool:
        """True while this server is a standby (replaying the primary's WAL)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def wal_position(self) -> str:
        """The primary's current WAL position (`pg_current_wal_lsn()`)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def replayed(self, lsn: str) -> bool:
        """Whether this standby has replayed the primary's WAL up to `lsn`."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()
        return bool(row and row[0])

    @staticmethod
    def multi_host_url(servers: list[PgServer], database: str = "postgres") -> str:
        """One libpq URL naming every server, which connects to whichever takes writes
        (`target_session_attrs=read-write`): what masters are given when the database
        itself fails over (docs/HA.md)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        return f"postgresql://{USER}@{hosts}/{database}?target_session_attrs=read-write"

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), *args, check=check)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = name or "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def kill(self) -> None:
        """Stop at once, as a crash would (`immediate`: no checkpoint)."""
        self._pg_ctl("stop", "-m", "immediate", "-w", check=False)

    def restart(self) -> None:
        self.kill()
        self.start()

    def processes(self) -> list[int]:
        """The server's processes: the postmaster, then each of its children (backends,
        WAL writer, checkpointer...)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:  # field 4: the parent
                children.append(int(entry.name))
        return [postmaster, *children]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The whole server stopped (SIGSTOP to every process of it: a frozen machine, as
        far as its clients can tell; its kernel still acknowledges their packets) for the
        block, and continued (SIGCONT) after it, whatever happens in it."""
        pids = self.processes()
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "fast", "-w", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.dir / "log").read_text(errors="replace")
        except OSError:
            return ""


def _has_account(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@contextlib.contextmanager
def own_server() -> Iterator[PgServer]:
    """A PostgreSQL of the test's own, durable (`synchronous_commit` on), stopped at the
    end whatever happened; the test skips where PostgreSQL is not installed."""
    import pytest

    bin_dir = bindir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (scripts/install-system-deps.sh installs it)")
    server = PgServer(bin_dir, settings={"synchronous_commit": "on"}).start()
    try:
        yield server
    finally:
        server.stop()
