"""A throwaway PostgreSQL server for the tests: `initdb` in a temp dir, run as an unprivileged
account (PostgreSQL refuses root), listening on loopback only with `trust` auth.

Debian's `postgresql` package (installed by scripts/install-system-deps.sh) gives the
binaries under /usr/lib/postgresql/VERSION/bin and the `postgres` account; where neither is
found the tests that need a server skip.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
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
    `kill()`/`restart()` for the tests that take it away under running masters."""

    def __init__(self, bin_dir: Path, port: int | None = None) -> None:
        self.bin = bin_dir
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mgpu-pg-", dir="/tmp"))
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
        return (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )

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
