"""How a master's connections to PostgreSQL are opened: every one of them, the store's, the
output store's, the lease loop's and the identity's.

Two things are decided here once for all of them:

- **Dead peers are found within seconds, on both sides.**  The client's TCP keepalives
  (libpq's `keepalives*`, `tcp_user_timeout`) let a master notice a cut; the server's
  (`tcp_keepalives_*`, `tcp_user_timeout`, sent as settings in the connection's `options`)
  let PostgreSQL end the session of a master it cannot reach, and with it the locks it
  held, some 11 s after a cut instead of after the kernel's two hours.
- **Whose connection is this.**  Every connection of a master carries its `Link`'s
  `application_name`, which for a master on a shared database starts with a tag made from
  its lease holder's name (`backend_tag`): a standby that finds the lease expired but its
  row still locked ends exactly the backends of the expired holder (store/lease.py,
  `end_expired`), whatever pid they have, and nothing else.

The URL's own parameters win over the defaults here, except `application_name` when a
`Link` names one (the tag must be there); the URL's `options` are kept, after these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["APP_NAME", "CLIENT_KEEPALIVES", "SERVER_SETTINGS", "Link", "backend_tag", "params"]

APP_NAME = "mgpu-master"
"""Every master's connections' `application_name` starts with this."""

NAME_MAX = 63
"""PostgreSQL keeps this many bytes of an application_name (NAMEDATALEN - 1)."""

CLIENT_KEEPALIVES: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
"""libpq's side: a database cut off by the network is noticed within some 10 s (probes,
unacknowledged data), so the master reconnects or steps down instead of hanging."""

SERVER_SETTINGS: dict[str, int] = {
    "tcp_keepalives_idle": 5,
    "tcp_keepalives_interval": 2,
    "tcp_keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
"""PostgreSQL's side (its defaults are the kernel's: two hours before the first probe): the
session of a master cut off is ended, its locks released, within some 11 s."""


def backend_tag(holder: str) -> str:
    """The start of the `application_name` of every connection of the master that holds
    (or tries to hold) the lease as `holder`: a digest of the name, so that it is found
    whole even where the name is cut at PostgreSQL's 63 bytes."""
    return f"{APP_NAME} {hashlib.sha256(holder.encode()).hexdigest()[:12]} "


@dataclass(frozen=True)
class Link:
    """Who a master's connections say they are, and the server settings each carries."""

    application_name: str = APP_NAME
    settings: Mapping[str, int | str] = field(default_factory=dict)
    """`-c NAME=VALUE` for the session (statement_timeout, idle_in_transaction_...)."""

    @staticmethod
    def of_holder(holder: str, **settings: int | str) -> Link:
        """The link of a master on a shared database, tagged with its lease holder's name."""
        name = (backend_tag(holder) + holder).encode("ascii", "replace")[:NAME_MAX]
        return Link(name.decode("ascii"), settings)

    def named(self, suffix: str, **settings: int | str) -> Link:
        """The same link for one kind of connection (`suffix` ends its name if it fits),
        with more settings."""
        name = self.application_name
        if len(name) + 1 + len(suffix) <= NAME_MAX:
            name = f"{name} {suffix}"
        return Link(name, {**self.settings, **settings})


def params(url: str, link: Link | None = None, **overrides: Any) -> dict[str, Any]:
    """`psycopg.connect`'s keyword arguments for `url` over `link` (the default's name and
    no more settings when None): the keepalives of both sides, then the URL's parameters,
    then `overrides` (connect_timeout, say)."""
    from psycopg import conninfo

    link = link or Link()
    given = conninfo.conninfo_to_dict(url)
    settings = {**SERVER_SETTINGS, **link.settings}
    options = " ".join(f"-c {name}={value}" for name, value in settings.items())
    if given.get("options"):
        options += f" {given['options']}"  # the URL's last: its settings win
    found = {**CLIENT_KEEPALIVES, **given, **overrides, "options": options}
    if link.application_name != APP_NAME or "application_name" not in given:
        found["application_name"] = link.application_name
    return found
