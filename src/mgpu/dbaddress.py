"""A PostgreSQL database's address as mgpu is given it (`--database`, `--database-file`,
`database:` in the cluster config), read the way libpq reads it, and the one form in which
it is shown.

libpq takes a URL (`postgresql://USER:PW@HOST:PORT/DB?sslmode=require&password=PW`) or its
keyword form (`host=db1 user=mgpu password='a b\\'c' dbname=mgpu`), and a password may sit
in several places of either.  So an address is read by libpq's own parser
(PQconninfoParse, through psycopg), never by a pattern of ours: the secrets found are the
ones libpq would send.  `describe` is the address without them, as a URL; every log line,
error, systemd unit and `mgpu db import` line shows that.  A text libpq cannot read is never
shown, not even in part (libpq's own error may quote all of it).

A command line is no place for a password: every account reads it in `ps`
(/proc/PID/cmdline), and a deposed leader starts itself again with the same argv.  So
`from_command_line` refuses `--database` holding one; the password goes in ~/.pgpass (or
the file $PGPASSFILE names) or $PGPASSWORD, which libpq reads itself, or the whole address
goes in a file only its owner may read, named by `--database-file`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from mgpu.errors import MgpuError
from mgpu.privatefile import TooOpen, read_private

__all__ = [
    "PASSWORD_PLACES",
    "AddressError",
    "describe",
    "from_command_line",
    "parse",
    "secrets",
    "shown",
]

SECRET_KEYS = frozenset({"password", "sslpassword"})
"""libpq's parameters whose value is a secret (any other one named *password counts too)."""

SECRET_TEXT = "password="
"""A value holding this is taken for a secret too: what libpq reads as a user in
`postgresql://host?password=PW@db1/mgpu` (the `@` ends the user there), or a keyword
form given as a `dbname`."""

UNREADABLE = "(a database address libpq cannot read)"

PASSWORD_PLACES = "~/.pgpass (or the file $PGPASSFILE names) or $PGPASSWORD"
"""Where libpq finds a password that is not in the address."""


class AddressError(MgpuError):
    """A database address that cannot be used: one sentence, which never shows a secret."""


def parse(text: str, source: str = "--database") -> dict[str, str]:
    """libpq's parameters of the address `text` (a URL or the keyword form).  AddressError,
    naming `source` and not quoting `text`, when libpq cannot read it."""
    from psycopg import Error, conninfo

    try:
        params = conninfo.conninfo_to_dict(text)
    except Error:
        raise AddressError(
            f"{source} is not a PostgreSQL address: give postgresql://USER@HOST:PORT/DB or "
            "libpq's keyword form (host=HOST port=PORT user=USER dbname=DB)"
        ) from None
    return {str(k): str(v) for k, v in params.items() if v is not None}


def _is_secret(key: str, value: str) -> bool:
    return key in SECRET_KEYS or key.endswith("password") or SECRET_TEXT in value.lower()


def secrets(params: dict[str, str]) -> list[str]:
    """The names of the parameters that hold a secret (`password`, `sslpassword`)."""
    return sorted(k for k, v in params.items() if _is_secret(k, v))


def shown(params: dict[str, str]) -> str:
    """The address as it may be shown: a URL of every parameter but the secrets."""
    rest = {k: v for k, v in params.items() if not _is_secret(k, v)}
    user, dbname = rest.pop("user", ""), rest.pop("dbname", "")
    hosts, ports = rest.pop("host", ""), rest.pop("port", "")
    netloc = _netloc(hosts, ports)
    if netloc is None:  # a socket directory: a URL takes it as a parameter
        rest = {"host": hosts, **({"port": ports} if ports else {}), **rest}
        netloc = ""
    userinfo = f"{quote(user, safe='')}@" if user else ""
    query = "&".join(f"{k}={quote(v, safe='/:,')}" for k, v in rest.items())
    return f"postgresql://{userinfo}{netloc}/{quote(dbname, safe='')}" + (
        f"?{query}" if query else ""
    )


def _netloc(hosts: str, ports: str) -> str | None:
    """`host1:port1,host2:port2` for a URL, or None when a host is a socket directory."""
    names = hosts.split(",")
    numbers = ports.split(",")
    if len(numbers) == 1:
        numbers *= len(names)  # one port for every host, as libpq reads it
    if len(numbers) != len(names) or any(h.startswith(("/", "@")) for h in names):
        return None
    return ",".join(
        (f"[{h}]" if ":" in h else quote(h, safe=".-_")) + (f":{p}" if p else "")
        for h, p in zip(names, numbers, strict=True)
    )


def describe(text: str) -> str:
    """`text` as it may be shown or logged: without any secret; never raises."""
    try:
        return shown(parse(text))
    except AddressError:
        return UNREADABLE


def from_command_line(database: str | None, database_file: str | None) -> str | None:
    """The address `mgpu master` or `mgpu db import` was given: `--database`, which must
    not hold a password, or the content of `--database-file`, a file only its owner may
    read; None when neither was given.  AddressError: both given, a password on the
    command line, a file others may read or none can, a text libpq cannot read."""
    if database and database_file:
        raise AddressError("give --database or --database-file, not both")
    if database_file:
        path = Path(database_file).expanduser()
        what = "a file holding a database's address"
        try:
            text = read_private(path, what).decode().strip()
        except TooOpen as e:
            raise AddressError(str(e)) from None
        except OSError as e:
            raise AddressError(
                f"cannot read the database file {database_file}: {e.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise AddressError(f"the database file {database_file} is not text") from None
        if not text:
            raise AddressError(f"the database file {database_file} is empty")
        parse(text, f"the database file {database_file}")
        return text
    if not database:
        return None
    if secrets(parse(database)):
        raise AddressError(
            "--database holds a password, which every account on this machine can read on "
            f"the command line (ps): leave it out and put it in {PASSWORD_PLACES}, or put "
            "the whole address in a file only you may read (chmod 600) and give "
            "--database-file FILE"
        )
    return database
