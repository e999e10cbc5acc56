"""Which masters a client talks to, and where the leader among them was found last.

`resolve_addresses` reads --host/$MGPU_MASTER; the leader found is remembered for the
process (`_leaders`) and, with several masters, in a file of the user's cache, so that a
master that is off costs one search, not one per command.
"""

from __future__ import annotations

import os

from mgpu.errors import MgpuError

DEFAULT_ADDRESS = "127.0.0.1:8080"
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


def shown_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _leader_file(addresses: list[tuple[str, int]]) -> str:
    """Where the leader of this list of masters was found last, for the next process."""
    key = ",".join(shown_address(a) for a in addresses)
    name = "".join(c if c.isalnum() or c in ".-" else "_" for c in key)[:200]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "mgpu", f"leader-{name}")


def known_leader(addresses: list[tuple[str, int]]) -> tuple[str, int]:
    """The leader found last by this process, else by any process (one of the listed
    masters), else the first master; with one master: it, and no file is read."""
    found = _leaders.get(tuple(addresses))
    if found is not None:
        return found
    if len(addresses) > 1:
        try:
            with open(_leader_file(addresses)) as f:
                text = f.read(300).strip()
        except (OSError, ValueError):
            text = ""
        for address in addresses:
            if text == shown_address(address):
                _leaders[tuple(addresses)] = address
                return address
    return addresses[0]


def found_leader(addresses: list[tuple[str, int]], here: tuple[str, int]) -> None:
    """`here` leads: remembered for this process and the next ones (a listed master only: a
    hinted one is for this search)."""
    key = tuple(addresses)
    if len(key) < 2 or here not in key or _leaders.get(key) == here:
        return
    _leaders[key] = here
    path = _leader_file(addresses)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fresh = f"{path}.{os.getpid()}"
        with open(fresh, "w") as f:
            f.write(shown_address(here) + "\n")
        os.replace(fresh, path)
    except OSError:
        pass  # a read-only home: each process searches again
