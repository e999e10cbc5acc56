"""Finding the leading master, and how each master is dialled: one module for the client
(`mgpu.client.api`) and the agent (`mgpu.agent.agent`).

`Transport` decides TLS or plain HTTP for a dial.  Once this client or agent knows the
cluster speaks TLS (it was told `https://`; its token is a TLS master's, marked `.tls`,
mgpu.tokens; or the CA its token names is pinned: the cluster has served it TLS before, on
any address), every dial is TLS verified against the CA the token names (fetched and
checked against its fingerprint on the first contact, then pinned): no plain first try on
loopback, no plain fallback after a refusal, a restart or a hint.  Until then (an unmarked
token: a plain master's, or one made before the mark) a loopback master is tried in plain
HTTP first and in TLS when it closes the connection at once, as before; its first TLS
answer pins the CA for good.  Plain HTTP only when told so (`http://`, `--insecure`,
$MGPU_INSECURE), whatever the token says.

`Search` walks the masters until one leads: after a master that cannot be reached or
stands by, the next one, or the one a standby names; a pause once every one was tried.
A standby's hint (`X-Mgpu-Leader`, its JSON `leader`) is followed only to a listed master,
or, once the CA is known, to an address whose TLS certificate the cluster's CA must then
vouch for; its scheme is kept (an `https://` hint is dialled in TLS, an `http://` one never
makes a dial plain).  A hinted address is for that search only: it is never added to the
list.

Imports nothing at module level beyond `os`: `mgpu queue` must start fast.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    Address = tuple[str, int]

__all__ = ["MAX_HOPS", "PROBE_TIMEOUT", "Search", "Transport", "leads", "pinned_ca_path"]

MAX_HOPS = 4
"""Hints followed in one round at most (two standbys naming each other end there)."""


def pinned_ca_path(fingerprint: str, cache_dir: str | None = None) -> str:
    """Where the CA named by `fingerprint` is kept once fetched and checked: in `cache_dir`
    (an agent's state dir), else the user's cache ($XDG_CACHE_HOME/mgpu, ~/.cache/mgpu)."""
    if cache_dir is None:
        base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
        cache_dir = os.path.join(os.path.expanduser(base), "mgpu")
    return os.path.join(cache_dir, f"ca-{fingerprint.lower()[:32]}.pem")


class Transport:
    """TLS or plain HTTP for each dial of one client or agent (see the module's text).

    `told`: "https" (TLS, always), "http" (plain, always: `http://`, `--insecure`), None:
    decided here.  `token`: the one presented (`use_token`: an agent may find its token
    later).  `cache_dir`: where the pinned CA is kept (None: the user's cache)."""

    def __init__(self, told: str | None, token: str | None, cache_dir: str | None = None) -> None:
        self.told = told
        self.cache_dir = cache_dir
        self._known = told == "https"
        self._tls: dict[Address, bool] = {}
        """Per address: TLS as a hint's scheme or the last dial's switch chose it."""
        self.fingerprint: str | None = None
        """The CA the token names: what a TLS master's CA is checked against."""
        self.marked = False
        """The token is a TLS master's (mgpu.tokens.TLS_MARK)."""
        self.use_token(token)

    def use_token(self, token: str | None) -> None:
        """The token presented from now on: the CA it names, and whether it says that the
        cluster speaks TLS (then TLS only, for good, unless told `http`)."""
        from mgpu.tokens import parse_token

        parts = parse_token(token or "")
        self.fingerprint = parts.fingerprint
        self.marked = parts.tls
        if self.marked and self.told is None:
            self._known = True

    def ca_known(self) -> bool:
        """Whether every dial must be TLS verified against the cluster's CA: told https, a
        TLS master's token, or the CA pinned (once true, true for good)."""
        if not self._known and self.told is None and self.fingerprint:
            self._known = os.path.exists(pinned_ca_path(self.fingerprint, self.cache_dir))
        return self._known

    def tls(self, address: Address) -> bool:
        """Whether to dial `address` in TLS now."""
        if self.told is not None:
            return self.told == "https"
        if self.ca_known():
            return True
        if address in self._tls:
            return self._tls[address]
        from mgpu.credentials import is_loopback

        return not is_loopback(address[0])

    def may_switch(self, address: Address) -> bool:
        """Whether a dial to `address` that was closed at once may be tried in the other
        transport: a loopback master of unknown transport, while the CA is not known."""
        if self.told is not None or self.ca_known():
            return False
        from mgpu.credentials import is_loopback

        return is_loopback(address[0])

    def switch(self, address: Address, tls: bool) -> None:
        """Dial `address` in TLS (or, while the CA is not known, plain) from now on."""
        self._tls[address] = tls

    def plain_refused(self, address: Address) -> str | None:
        """None when a plain dial to `address` is allowed, else the sentence that refuses
        it (checked just before any secret would be sent)."""
        if self.told == "http" or not self.ca_known():
            return None
        where = f"{address[0]}:{address[1]}"
        why = "its token is a TLS master's" if self.marked else "its CA is pinned"
        return (
            f"refusing to send a token to the master at {where} in plain HTTP: this cluster "
            f"is known to serve TLS ({why}); if it now serves plain HTTP on purpose, use "
            f"http://{where}"
        )

    def hinted(self, hint: str | None, masters: list[Address], port: int) -> Address | None:
        """Where a standby's hint says the leader is, when it may be followed: a listed
        master, or, once the CA is known, any address (its TLS certificate must then be the
        cluster's).  Its scheme is kept: `https://` makes that address a TLS one."""
        if not hint:
            return None
        from mgpu.addresses import AddressError, parse_addresses

        try:
            scheme, found = parse_addresses(hint, port, "leader")
        except AddressError:
            return None
        address = found[0]
        if address not in masters and not self.ca_known():
            return None  # an unauthenticated standby may not send us anywhere
        if scheme == "https":
            self._tls[address] = True
        return address


class Search:
    """One walk through `masters` until one leads (the caller dials; this says where).

    A master that said nothing (a frozen leader: it takes the connection and never
    answers) is dialled last, and a standby's hint that names it is not followed while
    another is untried: each dial of it costs a whole timeout, and the leader that took
    over from it is elsewhere."""

    def __init__(self, masters: list[Address], transport: Transport) -> None:
        self.masters = masters
        self.transport = transport
        self.tried: list[Address] = []
        self.silent: set[Address] = set()
        """The masters that said nothing in this walk (`failed(..., silent=True)`)."""
        self.named: Address | None = None
        """The listed master a standby named last (a new round starts there)."""
        self.hops = 0

    def failed(
        self, address: Address, hint: str | None = None, silent: bool = False
    ) -> Address | None:
        """`address` did not lead (`hint`: where it says the leader is; `silent`: it said
        nothing in time): the master to dial next, or None once every one was tried
        (pause, then `again`)."""
        self.tried.append(address)
        if silent:
            self.silent.add(address)
        leader = self.transport.hinted(hint, self.masters, address[1])
        if leader is not None and leader in self.masters:
            self.named = leader
        untried = sorted(
            (a for a in self.masters if a not in self.tried), key=lambda a: a in self.silent
        )
        fresh = leader is not None and leader not in self.tried and self.hops < MAX_HOPS
        if fresh and not (leader in self.silent and untried and untried[0] not in self.silent):
            self.hops += 1
            return leader
        return untried[0] if untried else None

    def again(self) -> Address:
        """A new round after the pause: from the listed master named last, else the first
        (one that said nothing only when every one did)."""
        self.tried, self.hops = [], 0
        start = [self.named] if self.named is not None else []
        order = start + [a for a in self.masters if a not in start]
        return min(order, key=lambda a: a in self.silent)


PROBE_TIMEOUT = 1.0
"""Seconds one master has to answer `/readyz` (a stopped one is not waited for)."""


def leads(address: tuple[str, int], context: object | None) -> bool:
    """Whether the master at `address` answers `/readyz` with 200 (it leads and
    schedules) within PROBE_TIMEOUT; `context`: TLS, or None for plain HTTP."""
    from mgpu.wire import Connection

    try:
        conn = Connection(address[0], address[1], PROBE_TIMEOUT, context)
    except OSError:
        return False
    try:
        conn.settimeout(PROBE_TIMEOUT)
        resp = conn.request("GET", "/readyz", None, {})
        resp.read()
        return resp.status == 200
    except OSError:
        return False
    finally:
        conn.close()


def leader_elsewhere(
    masters: list[Address], here: Address, transport: Transport, context: object | None
) -> Address | None:
    """The master of `masters` other than `here` that leads now (`leads`), if any.  A TLS
    one is asked only once the cluster's CA is pinned (`context`): before that, nothing
    of it could be believed."""
    for address in masters:
        tls = transport.tls(address)
        if address == here or (tls and context is None):
            continue
        if leads(address, context if tls else None):
            return address
    return None
